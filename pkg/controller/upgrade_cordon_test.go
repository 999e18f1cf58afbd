package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// A cordon or uncordon goes in the same patch as the state it leads to
// (docs/design.md, "Cordon with the state"): one round trip per step, and
// the node is never cordoned without its state saying why. A cordon that a
// later action of the same decision relies on is done first, on its own.
func TestCordonGoesWithTheState(t *testing.T) {
	for _, tc := range []struct {
		name        string
		unsched     bool // the node before
		dec         upgrade.Decision
		wantPatches int
		wantUnsched bool
	}{
		{"cordon", false, upgrade.Decision{From: upgrade.StateCordon, To: upgrade.StateWaitForJobs,
			Actions: []upgrade.Action{upgrade.ActCordon}}, 1, true},
		{"uncordon", true, upgrade.Decision{From: upgrade.StateUncordon, To: upgrade.StateDone,
			Actions: []upgrade.Action{upgrade.ActUncordon}}, 1, false},
		{"cordon again, same state", false, upgrade.Decision{From: upgrade.StateWaitForJobs, To: upgrade.StateWaitForJobs,
			Actions: []upgrade.Action{upgrade.ActCordon}}, 1, true},
		{"already cordoned", true, upgrade.Decision{From: upgrade.StateCordon, To: upgrade.StateWaitForJobs,
			Actions: []upgrade.Action{upgrade.ActCordon}}, 1, true},
		{"cordon before an eviction", false, upgrade.Decision{From: upgrade.StateWaitForJobs, To: upgrade.StatePodDeletion,
			Actions: []upgrade.Action{upgrade.ActCordon, upgrade.ActEvictGPUPods}}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
				Labels: map[string]string{upgrade.LabelState: tc.dec.From}}, Spec: corev1.NodeSpec{Unschedulable: tc.unsched}}
			var patches []string
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node).WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					body, _ := patch.Data(obj)
					patches = append(patches, string(body))
					return c.Patch(ctx, obj, patch, opts...)
				},
			}).Build()
			r := &UpgradeReconciler{Client: c, Recorder: &events.FakeRecorder{}}
			d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d"}}
			if err := r.execute(context.Background(), d, node.DeepCopy(), nil, nil, tc.dec); err != nil {
				t.Fatal(err)
			}
			if len(patches) != tc.wantPatches {
				t.Errorf("%d patches, want %d: %q", len(patches), tc.wantPatches, patches)
			}
			got := &corev1.Node{}
			if err := c.Get(context.Background(), client.ObjectKey{Name: "n1"}, got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.Unschedulable != tc.wantUnsched {
				t.Errorf("unschedulable %v, want %v", got.Spec.Unschedulable, tc.wantUnsched)
			}
			if got.Labels[upgrade.LabelState] != tc.dec.To {
				t.Errorf("state %q, want %q", got.Labels[upgrade.LabelState], tc.dec.To)
			}
		})
	}
}
