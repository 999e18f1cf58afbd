package controller

import (
	"context"
	"testing"
	"time"

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

// A node whose new driver pod is Ready goes validation-required,
// uncordon-required and upgrade-done in one pass, uncordoned; when something
// else writes the node between two of those patches, the chain stops at the
// step before (its next patch is refused, nothing is lost or written twice),
// and the machine waits for the cache to pass every version it wrote over.
func TestChainedSteps(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	fresh := &upgrade.DriverPod{Name: "new", InSync: true, Ready: true}
	for _, tc := range []struct {
		name        string
		foreignOn   int // the foreign write lands right after our patch number foreignOn (0: none)
		wantState   string
		wantCordon  bool
		wantPatches int
	}{
		{"no other writer: the whole chain", 0, upgrade.StateDone, false, 4},
		{"another writer after the first step", 1, upgrade.StateValidation, true, 1},
		{"another writer after the uncordon", 3, upgrade.StateUncordon, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
				Labels: map[string]string{upgrade.LabelState: upgrade.StatePodRestart}},
				Spec: corev1.NodeSpec{Unschedulable: true}}
			patches := 0
			var c client.Client
			c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(node).WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if err := cl.Patch(ctx, obj, patch, opts...); err != nil {
						return err
					}
					patches++
					if patches == tc.foreignOn {
						other := &corev1.Node{}
						_ = cl.Get(ctx, client.ObjectKeyFromObject(obj), other)
						other.Annotations = map[string]string{"someone": "else"}
						if err := cl.Update(ctx, other); err != nil {
							t.Fatal(err)
						}
					}
					return nil
				},
			}).Build()
			read := &corev1.Node{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(node), read); err != nil {
				t.Fatal(err)
			}
			r := &UpgradeReconciler{Client: c, Recorder: events.NewFakeRecorder(10)}
			in := upgrade.Node{Name: "n1", State: upgrade.StatePodRestart, Unschedulable: true, DriverPod: fresh}
			policy := upgrade.Policy{ValidationTimeout: time.Minute}
			ps := &pass{inputs: []upgrade.Node{in}, nodes: []*corev1.Node{read}}
			dec := upgrade.Decide(ps.inputs, policy, time.Now())[0]
			if err := r.executeChain(ctx, &v1alpha1.NVIDIADriver{}, ps, 0, dec, policy, time.Now(), time.Now()); err != nil {
				t.Fatal(err)
			}
			got := &corev1.Node{}
			_ = c.Get(ctx, client.ObjectKeyFromObject(node), got)
			if s := got.Labels[upgrade.LabelState]; s != tc.wantState || got.Spec.Unschedulable != tc.wantCordon {
				t.Errorf("node in %q, unschedulable %v; want %q, %v", s, got.Spec.Unschedulable, tc.wantState, tc.wantCordon)
			}
			if patches != tc.wantPatches {
				t.Errorf("%d patches made, want %d", patches, tc.wantPatches)
			}
			// The cache still at any version we wrote over holds the next pass.
			if len(r.written.behind([]*corev1.Node{read})) != 1 {
				t.Error("the cache at the version the pass read: want the node held")
			}
			if len(r.written.behind([]*corev1.Node{got})) != 0 {
				t.Error("the cache at the node's last version: want nothing held")
			}
		})
	}
}
