package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/typed"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// assign's writes: node labels (with rollback) and the NVIDIADriver apply body.

func (o *AssignOptions) labelChanges(targets []plan.Node) []nodeChange {
	var out []nodeChange
	for _, n := range targets {
		ch := nodeChange{name: n.Name}
		if v, ok := n.Labels[o.LabelKey]; ok {
			v := v
			ch.previous = &v
		}
		out = append(out, ch)
	}
	return out
}

func (o *AssignOptions) applyLabels(ctx context.Context, c client.Client, changes []nodeChange, dryRun bool) ([]nodeChange, error) {
	var done []nodeChange
	for _, ch := range changes {
		if ch.previous != nil && *ch.previous == o.Name {
			continue
		}
		if err := patchLabel(ctx, c, ch.name, o.LabelKey, &o.Name, dryRun); err != nil {
			return done, fmt.Errorf("node %s: %w", ch.name, err)
		}
		if !dryRun {
			done = append(done, ch)
		}
	}
	return done, nil
}

func (o *AssignOptions) rollback(ctx context.Context, c client.Client, done []nodeChange) {
	// The restore must run even when the failure was an interrupt (the
	// command's context is then cancelled): all or nothing.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, ch := range done {
		if err := patchLabel(ctx, c, ch.name, o.LabelKey, ch.previous, false); err != nil {
			fmt.Fprintf(o.Streams.ErrOut, "error: restoring label %s on node %s: %v: fix it with kubectl label node %s %s\n", o.LabelKey, ch.name, err, ch.name, restoreArg(o.LabelKey, ch.previous))
		}
	}
}

func restoreArg(key string, prev *string) string {
	if prev == nil {
		return key + "-"
	}
	return fmt.Sprintf("%s=%s --overwrite", key, *prev)
}

func patchLabel(ctx context.Context, c client.Client, node, key string, value *string, dryRun bool) error {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{key: value}}})
	n := &corev1.Node{}
	n.Name = node
	opts := []client.PatchOption{client.FieldOwner(FieldManager)}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	return c.Patch(ctx, n, client.RawPatch(types.MergePatchType, body), opts...)
}

// applyBody is the server-side apply request. The plugin's field set is its
// whole intent every time: on an existing CR it re-states every field it
// applied before and still owns, with its live value, plus the change. A
// narrower body would make the API server remove the fields left out (the
// version, the image, a first --label-key). See docs/design.md, "assign".
func (o *AssignOptions) applyBody(d *v1alpha1.NVIDIADriver, existing *v1alpha1.NVIDIADriver) (*unstructured.Unstructured, error) {
	spec := map[string]any{}
	if existing == nil {
		spec["driverType"] = string(d.Spec.DriverType)
		spec["version"] = d.Spec.Version
		spec["repository"] = d.Spec.Repository
		spec["image"] = d.Spec.Image
		if d.Spec.UsePrecompiled != nil {
			spec["usePrecompiled"] = *d.Spec.UsePrecompiled
		}
	} else {
		owned, err := ownedByPlugin(existing)
		if err != nil {
			return nil, err
		}
		if s, ok := owned["spec"].(map[string]any); ok {
			spec = s
		}
		if o.Version != "" {
			spec["version"] = d.Spec.Version
		}
	}
	sel, _ := spec["nodeSelector"].(map[string]any)
	if sel == nil {
		sel = map[string]any{}
	}
	sel[o.LabelKey] = o.Name
	spec["nodeSelector"] = sel
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "NVIDIADriver",
		"metadata": map[string]any{"name": o.Name}, "spec": spec,
	}}, nil
}

// ownedByPlugin extracts the fields the plugin's field manager applied and
// still owns, with their live values (client-go's Extract* functions do the
// same for built-in kinds; a CRD has no generated schema, so the field set is
// read against the object's own structure).
func ownedByPlugin(d *v1alpha1.NVIDIADriver) (map[string]any, error) {
	for _, mf := range d.ManagedFields {
		if mf.Manager != FieldManager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.Subresource != "" || mf.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.Raw)); err != nil {
			return nil, fmt.Errorf("reading the fields %s owns on NVIDIADriver %q: %w", FieldManager, d.Name, err)
		}
		live, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
		if err != nil {
			return nil, err
		}
		tv, err := typed.DeducedParseableType.FromUnstructured(live)
		if err != nil {
			return nil, err
		}
		out, _ := tv.ExtractItems(set.Leaves()).AsValue().Unstructured().(map[string]any)
		return out, nil
	}
	return map[string]any{}, nil
}
