package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// status --nodes: one row per node with its pool, image, ages, who cordoned
// it and what it waits for.
func TestNodeViews(t *testing.T) {
	now := time.Unix(10000, 0)
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"},
		Status: v1alpha1.NVIDIADriverStatus{Rollout: &v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutWaiting, CanaryNodes: []string{"a"}, Message: "canary done on 1 node(s)"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "drv-a", CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Hour)),
		OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "nvidia-gpu-driver-ubuntu22.04-x", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04"}}}}
	canary := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{plan.LabelOwner: "gold", plan.LabelUpgradeState: upgrade.StateDone},
		Annotations: map[string]string{upgrade.AnnotationStateSince: "9400"}}}
	waiting := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{plan.LabelOwner: "gold", plan.LabelUpgradeState: upgrade.StateRequired}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	va, vb := nodeView(canary, d, pod, now), nodeView(waiting, d, nil, now)
	if !va.Canary || va.Pool != "nvidia-gpu-driver-ubuntu22.04-x" || va.PodAgeSeconds != 7200 || va.InStateSeconds != 600 || va.Waiting != "" {
		t.Errorf("canary node view %+v", va)
	}
	if vb.Canary || vb.Cordoned != "admin" || !strings.HasPrefix(vb.Waiting, "waiting for the canary") || vb.Fix != "kubectl nvdriver rollout resume gold" {
		t.Errorf("waiting node view %+v", vb)
	}
	var out bytes.Buffer
	if err := printNodeTables(&out, &StatusReport{Drivers: []DriverStatus{{Name: "gold", Nodes: []NodeView{va, vb}}}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gold: 2 node(s)", "a (canary)", "2h0m", "10m", "waiting for the canary"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
