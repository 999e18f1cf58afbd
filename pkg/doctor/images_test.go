package doctor

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func TestImageAvailable(t *testing.T) {
	cr := func(name string, conds ...metav1.Condition) v1alpha1.NVIDIADriver {
		return v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, Conditions: conds}}
	}
	checked := &plan.Plan{Drivers: []plan.Driver{{
		Name: "gold",
		Pools: []plan.Pool{
			{DaemonSet: "ds-a", Image: "reg/driver:2-ubuntu22.04", Nodes: []string{"a", "b"}, ImageCheck: []plan.ImageCheck{{Image: "reg/driver:2-ubuntu22.04", Status: plan.ImageStatusMissing, Message: "not found in the registry"}}},
			{DaemonSet: "ds-b", Image: "reg/driver:2-rhel9", Nodes: []string{"c"}, ImageCheck: []plan.ImageCheck{{Image: "reg/driver:2-rhel9", Status: plan.ImageStatusUnknown, Reason: v1alpha1.ReasonRegistryAuthFailed, Message: "401"}}},
			{DaemonSet: "ds-c", Image: "reg/driver:2-ubuntu20.04", Nodes: []string{"d"}, ImageCheck: []plan.ImageCheck{{Image: "reg/driver:2-ubuntu20.04", Status: plan.ImageStatusOK}}},
		},
		KernelImages: []plan.KernelImage{
			{OSTag: "ubuntu22.04", Kernel: "6.8.0-1", Nodes: 3, Check: plan.ImageCheck{Image: "reg/driver:535-6.8.0-1-ubuntu22.04", Status: plan.ImageStatusMissing}},
			{OSTag: "ubuntu22.04", Kernel: "5.15.0-1", Nodes: 2, Selected: 2, Check: plan.ImageCheck{Image: "x", Status: plan.ImageStatusMissing}},
		},
	}}}
	r := Run(&Snapshot{CRDInstalled: true, Drivers: []v1alpha1.NVIDIADriver{cr("gold", metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonImageMissing, Message: "Holding ds-a"})}, ImagePlan: checked})
	got := findings(r, "image-available")
	if len(got) != 3 {
		t.Fatalf("want a missing image (error), an unchecked one and an unselected kernel (warnings); got %+v", got)
	}
	if got[0].Severity != Error || !strings.Contains(got[0].Message, "gold: image reg/driver:2-ubuntu22.04 is not in the registry: ds-a's 2 node(s) cannot run it") || got[0].Fix != "kubectl nvdriver preview gold" {
		t.Errorf("missing: %+v", got[0])
	}
	if got[1].Severity != Warning || !strings.Contains(got[1].Message, "could not check image reg/driver:2-rhel9 from here (RegistryAuthFailed: 401)") {
		t.Errorf("unknown: %+v", got[1])
	}
	if got[2].Severity != Warning || !strings.Contains(got[2].Message, "no precompiled image for kernel 6.8.0-1 on ubuntu22.04") {
		t.Errorf("kernel: %+v", got[2])
	}
	if f := findings(r, "driver-conditions"); len(f) != 0 {
		t.Errorf("a pool held for its image is the image check's finding, not also a condition finding: %+v", f)
	}

	// Without asking the registry: the controller's condition.
	r = Run(&Snapshot{CRDInstalled: true, Drivers: []v1alpha1.NVIDIADriver{
		cr("gold", metav1.Condition{Type: v1alpha1.ConditionImageAvailable, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonImageMissing, Message: "Image not found in the registry: reg/driver:2"}),
		cr("silver", metav1.Condition{Type: v1alpha1.ConditionImageAvailable, Status: metav1.ConditionUnknown, Reason: v1alpha1.ReasonRegistryUnreachable, Message: "Could not check: reg: dial tcp"}),
		cr("bronze", metav1.Condition{Type: v1alpha1.ConditionImageAvailable, Status: metav1.ConditionTrue}),
	}})
	got = findings(r, "image-available")
	if len(got) != 2 || got[0].Severity != Error || !strings.Contains(got[0].Message, "gold: Image not found in the registry: reg/driver:2") ||
		got[1].Severity != Warning || !strings.Contains(got[1].Message, "silver: the controller could not check: reg: dial tcp") {
		t.Errorf("from conditions: %+v", got)
	}
}
