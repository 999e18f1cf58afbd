package upgrade

import (
	"encoding/json"
	"reflect"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// UndoPatch is the merge patch that makes the CR's driver fields the
// revision's: its fields set, the others the CR has removed; nodeSelector,
// default and upgradePolicy untouched. The resourceVersion makes it fail
// rather than undo over a change made since it was read.
func UndoPatch(spec *v1alpha1.NVIDIADriverSpec, rev map[string]any, resourceVersion string) ([]byte, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var cur map[string]any
	if err := json.Unmarshal(raw, &cur); err != nil {
		return nil, err
	}
	for k := range cur {
		if !IsRevisionField(k) {
			delete(cur, k)
		}
	}
	want := map[string]any{}
	for k, v := range rev {
		if IsRevisionField(k) {
			want[k] = v
		}
	}
	patch := mergePatchTo(cur, want)
	return json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": resourceVersion}, "spec": patch})
}

// mergePatchTo is the JSON merge patch (RFC 7386) that turns cur into want:
// nested objects are patched key by key, so a key the revision lacks is
// removed at any depth, not only at the top.
func mergePatchTo(cur, want map[string]any) map[string]any {
	out := map[string]any{}
	for k, w := range want {
		c, had := cur[k]
		wm, wIsMap := w.(map[string]any)
		cm, cIsMap := c.(map[string]any)
		if had && wIsMap && cIsMap {
			if sub := mergePatchTo(cm, wm); len(sub) > 0 {
				out[k] = sub
			}
			continue
		}
		if !had || !reflect.DeepEqual(c, w) {
			out[k] = w
		}
	}
	for k := range cur {
		if _, ok := want[k]; !ok {
			out[k] = nil
		}
	}
	return out
}
