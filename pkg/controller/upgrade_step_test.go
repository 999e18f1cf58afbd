package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// podsListedOn is the node whose pods a LIST asks for ("" for any other LIST).
func podsListedOn(opts []client.ListOption) string {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	if o.FieldSelector == nil {
		return ""
	}
	v, _ := o.FieldSelector.RequiresExactMatch("spec.nodeName")
	return v
}

func (b blockingLister) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if podsListedOn(opts) == b.node {
		select {
		case <-b.release:
		case <-ctx.Done():
			return ctx.Err()
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

// countingLister counts the pod listings per node.
type countingLister struct {
	client.Reader
	mu    sync.Mutex
	lists map[string]int
}

func (c *countingLister) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if v := podsListedOn(opts); v != "" {
		c.mu.Lock()
		c.lists[v]++
		c.mu.Unlock()
	}
	return c.Reader.List(ctx, list, opts...)
}

// The driver pod's deletion reads the listing its step decided on, made
// just before: one LIST per step, not two. A GPU pod in that listing keeps
// the driver (the step sends the node back to pod deletion), and so does a
// GPU pod the deletion's own last look finds when the step had no listing.
func TestDriverPodDeletionReadsItsStepsListing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gpuPod     bool
		wantState  string
		wantDriver bool // the driver pod is still there
	}{
		{"empty node: deleted after one listing", false, upgrade.StatePodRestart, false},
		{"a GPU pod landed: kept, back to pod deletion", true, upgrade.StatePodDeletion, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{upgrade.LabelState: upgrade.StatePodRestart},
				Annotations: map[string]string{}}, Spec: corev1.NodeSpec{Unschedulable: true}}
			driver := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "driver", Namespace: "gpu", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "n1"}}
			objs := []client.Object{node, driver}
			if tc.gpuPod {
				objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "default"},
					Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}})
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
				WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).Build()
			lister := &countingLister{Reader: c, lists: map[string]int{}}
			r := &UpgradeReconciler{Client: c, APIReader: lister, Recorder: &events.FakeRecorder{}}
			policy := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
			pods := map[string]*upgrade.DriverPod{"n1": {Name: "driver", InSync: false, Ready: true}}
			podObjs := map[string]*driverPod{"n1": {ObjectMeta: metav1.ObjectMeta{Name: "driver", Namespace: "gpu", UID: "u1"}, NodeName: "n1"}}
			ps := r.observe(policy, []*corev1.Node{node}, []*nodeFact{{state: upgrade.StatePodRestart, ready: true}}, pods, podObjs)
			d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d"}}
			if _, err := r.carryOut(context.Background(), d, ps, policy, time.Now(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if n := lister.lists["n1"]; n != 1 {
				t.Errorf("%d listings of the pods on n1, want 1", n)
			}
			err := c.Get(context.Background(), client.ObjectKeyFromObject(driver), &corev1.Pod{})
			if tc.wantDriver != (err == nil) {
				t.Errorf("driver pod there: %v, want %v", err == nil, tc.wantDriver)
			}
			got := &corev1.Node{}
			if err := c.Get(context.Background(), client.ObjectKey{Name: "n1"}, got); err != nil {
				t.Fatal(err)
			}
			if s := got.Labels[upgrade.LabelState]; s != tc.wantState {
				t.Errorf("state %q, want %q", s, tc.wantState)
			}

			// Without a listing of its step, the deletion looks itself.
			lister.lists = map[string]int{}
			dec := upgrade.Decision{Node: "n1", From: upgrade.StatePodRestart, To: upgrade.StatePodRestart, Actions: []upgrade.Action{upgrade.ActDeleteDriverPod}}
			if err := r.execute(context.Background(), d, got, podObjs["n1"], nil, dec); err != nil {
				t.Fatal(err)
			}
			if n := lister.lists["n1"]; n != 1 {
				t.Errorf("a deletion without its step's listing listed %d times, want 1", n)
			}
		})
	}
}

// heldPatches holds the node patches in waves of PassWorkers, each until
// its channel is closed, and times each patch in its step's answer clock as
// the client's transport does (TimeAnswers), on the test's clock.
type heldPatches struct {
	client.Client
	clk   *fakeNow
	waves []chan struct{}
	mu    sync.Mutex
	held  int
}

func (h *heldPatches) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	start := h.clk.now()
	h.mu.Lock()
	wave := h.held / PassWorkers
	h.held++
	h.mu.Unlock()
	if wave < len(h.waves) {
		<-h.waves[wave]
	}
	err := h.Client.Patch(ctx, obj, patch, opts...)
	if c, _ := ctx.Value(answerClockKey{}).(*answerClock); c != nil {
		c.add(h.clk.now().Sub(start))
	}
	return err
}

func (h *heldPatches) heldNow() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// A transition's latency is split by whose time it was, step by step. The
// API server takes a second to answer each of two waves of patches, every
// worker of the pass busy with one; the steps decided with them wait for a
// worker: the second wave a second, the last step two. Those waits are the
// queue's however the pass hands steps out, each patch's second is the
// answer's, and none of it is the controller's own.
func TestTransitionPartsWhileWorkersWait(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	var objs []client.Object
	var nodes []*corev1.Node
	var facts []*nodeFact
	for i := range 2*PassWorkers + 1 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%03d", i), Labels: map[string]string{upgrade.LabelState: upgrade.StateUncordon},
			Annotations: map[string]string{}}, Spec: corev1.NodeSpec{Unschedulable: true}}
		objs, nodes = append(objs, n), append(nodes, n)
		facts = append(facts, &nodeFact{state: upgrade.StateUncordon, ready: true})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	clk := &fakeNow{}
	held := &heldPatches{Client: c, clk: clk, waves: []chan struct{}{make(chan struct{}), make(chan struct{})}}
	r := &UpgradeReconciler{Client: held, APIReader: c, Recorder: &events.FakeRecorder{}, latencyClock: clk.now}
	policy := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
	ps := r.observe(policy, nodes, facts, nil, nil)

	sum := func(part string) float64 {
		return metricNow(t, upgradeTransitionParts.WithLabelValues(upgrade.StateDone, part).(prometheus.Metric)).GetHistogram().GetSampleSum()
	}
	before := map[string]float64{"answer": sum("answer"), "worker": sum("worker"), "own": sum("own")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.carryOut(ctx, &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d"}}, ps, policy, time.Now(), clk.now())
		done <- err
	}()
	for w, release := range held.waves {
		for held.heldNow() < (w+1)*PassWorkers {
			select {
			case err := <-done:
				t.Fatalf("the pass ended (%v) before wave %d held every worker", err, w+1)
			case <-ctx.Done():
				t.Fatalf("%d patches held, want %d", held.heldNow(), (w+1)*PassWorkers)
			case <-time.After(5 * time.Millisecond):
			}
		}
		clk.advance(time.Second)
		close(release)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for part, want := range map[string]float64{"answer": 2 * PassWorkers, "worker": PassWorkers + 2, "own": 0} {
		if got := sum(part) - before[part]; got < want-1e-6 || got > want+1e-6 {
			t.Errorf("%s: %.3f s over the %d transitions, want %.0f", part, got, 2*PassWorkers+1, want)
		}
	}
}
