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

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// blockingLister holds the listing of the pods on one node until released.
type blockingLister struct {
	client.Reader
	node    string
	release chan struct{}
}

func (b blockingLister) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	if o.FieldSelector != nil {
		if v, ok := o.FieldSelector.RequiresExactMatch("spec.nodeName"); ok && v == b.node {
			select {
			case <-b.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return b.Reader.List(ctx, list, opts...)
}

// One node's step does not wait for another node's pod listing
// (docs/design.md, "One node's step"): with the listing of slow's pods
// held, quick (whose step reads no pods) is carried out; once released,
// slow is decided with its pods (none: on to the driver restart).
func TestAStepWaitsOnlyForItsOwnPods(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	state := func(name, s string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{upgrade.LabelState: s}, Annotations: map[string]string{}},
			Spec: corev1.NodeSpec{Unschedulable: true}}
	}
	slow, quick := state("slow", upgrade.StatePodDeletion), state("quick", upgrade.StateUncordon)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(slow, quick).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
	lister := blockingLister{Reader: c, node: "slow", release: make(chan struct{})}
	r := &UpgradeReconciler{Client: c, APIReader: lister, Recorder: &events.FakeRecorder{}}
	policy := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
	nodes := []*corev1.Node{slow, quick}
	facts := []*nodeFact{{state: upgrade.StatePodDeletion, ready: true}, {state: upgrade.StateUncordon, ready: true}}
	ps := r.observe(policy, nodes, facts, nil, nil)
	if !ps.listPods[0] || ps.listPods[1] {
		t.Fatalf("listings %v, want the pods of slow only", ps.listPods)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d"}}
	done := make(chan error, 1)
	go func() {
		_, err := r.carryOut(ctx, d, ps, policy, time.Now(), time.Now())
		done <- err
	}()
	stateOf := func(name string) string {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		return n.Labels[upgrade.LabelState]
	}
	for stateOf("quick") != upgrade.StateDone {
		select {
		case err := <-done:
			t.Fatalf("the pass ended (%v) with slow's listing held", err)
		case <-ctx.Done():
			t.Fatal("quick was not carried out while slow's pods were being listed")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if s := stateOf("slow"); s != upgrade.StatePodDeletion {
		t.Fatalf("slow is %q before its pods were listed", s)
	}
	close(lister.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := stateOf("slow"); s != upgrade.StatePodRestart {
		t.Errorf("slow is %q, want %q (no GPU pods on it)", s, upgrade.StatePodRestart)
	}
}
