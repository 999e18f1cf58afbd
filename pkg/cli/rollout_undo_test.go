package cli

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// TestUndoPatchRestoresTheRevisionExactly: applied as the API server applies
// a merge patch, the undo patch gives the revision's driver fields, with
// fields added since removed at any depth, and leaves nodeSelector, default
// and upgradePolicy as they are.
func TestUndoPatchRestoresTheRevisionExactly(t *testing.T) {
	old := v1alpha1.NVIDIADriverSpec{DriverType: v1alpha1.GPU, Version: "535.104.12", Repository: "nvcr.io/nvidia", Image: "driver",
		Manager: v1alpha1.DriverManagerSpec{Version: "v0.6.2"}}
	data, _ := upgrade.RevisionOf(&old)
	var rev map[string]any
	if err := json.Unmarshal(data, &rev); err != nil {
		t.Fatal(err)
	}
	d := &v1alpha1.NVIDIADriver{Spec: old}
	d.ResourceVersion = "42"
	d.Spec.Version = "550.90.07"
	d.Spec.Manager.Env = []v1alpha1.EnvVar{{Name: "ENABLE_GPU_POD_EVICTION", Value: "false"}} // nested, added since
	d.Spec.Labels = map[string]string{"team": "ml"}                                           // top level, added since
	d.Spec.NodeSelector = map[string]string{"driver.config": "gold"}
	d.Spec.UpgradePolicy = &v1alpha1.DriverUpgradePolicySpec{Paused: true, FailureBudget: nil, RevisionHistoryLimit: ptr.To[int32](3)}

	body, err := undoPatch(d, rev)
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := json.Marshal(d)
	got, err := jsonpatch.MergePatch(cur, body)
	if err != nil {
		t.Fatal(err)
	}
	after := &v1alpha1.NVIDIADriver{}
	if err := json.Unmarshal(got, after); err != nil {
		t.Fatal(err)
	}
	want := old.DeepCopy()
	want.NodeSelector, want.UpgradePolicy = d.Spec.NodeSelector, d.Spec.UpgradePolicy
	if !reflect.DeepEqual(&after.Spec, want) {
		t.Errorf("after undo:\n%+v\nwant\n%+v\npatch %s", after.Spec, *want, body)
	}
	if after.ResourceVersion != "42" {
		t.Errorf("the patch does not carry the resourceVersion it was made from: %s", body)
	}
}
