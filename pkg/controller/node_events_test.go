package controller

import (
	"context"
	"fmt"
	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"k8s.io/apimachinery/pkg/runtime"
	"maps"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// cachedNode is a node as the cache holds it (trimNode of a full one).
func cachedNode(edit func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1", ResourceVersion: "1",
			Labels:      map[string]string{plan.LabelGPUPresent: "true", plan.LabelOwner: "gold", "pool": "gold"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Unix(100, 0)}},
			NodeInfo:   corev1.NodeSystemInfo{KernelVersion: "5.15"},
		},
	}
	if edit != nil {
		edit(n)
	}
	out, _ := trimNode(n)
	return out.(*corev1.Node)
}

// An update is dropped for every reconciler exactly when it changes nothing
// the cache keeps but the resourceVersion: a heartbeat. Every other change
// of a kept field reaches the reconcilers' own predicates.
func TestSameToReconcilers(t *testing.T) {
	cases := []struct {
		name string
		edit func(*corev1.Node)
		same bool
	}{
		{"a heartbeat", func(n *corev1.Node) {
			n.ResourceVersion = "2"
			n.Status.Conditions[0].LastHeartbeatTime = metav1.Unix(200, 0)
		}, true},
		{"a status field the cache drops", func(n *corev1.Node) { n.ResourceVersion = "2"; n.Status.NodeInfo.KernelVersion = "6.8" }, true},
		{"an annotation nobody reads", func(n *corev1.Node) { n.Annotations["x"] = "y" }, true},
		{"a label", func(n *corev1.Node) { n.Labels["pool"] = "silver" }, false},
		{"a label added", func(n *corev1.Node) { n.Labels["tier"] = "a" }, false},
		{"a label removed", func(n *corev1.Node) { delete(n.Labels, "pool") }, false},
		{"our annotation", func(n *corev1.Node) { n.Annotations[upgrade.AnnotationMoveTo] = "silver" }, false},
		{"cordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, false},
		{"a taint's value", func(n *corev1.Node) { n.Spec.Taints[0].Value = "no" }, false},
		{"a taint added", func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute})
		}, false},
		{"NotReady", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, false},
		{"being deleted", func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: metav1.Unix(300, 0).Time} }, false},
		{"recreated under the same name", func(n *corev1.Node) { n.UID = "u2" }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, n := cachedNode(nil), cachedNode(tc.edit)
			if got := sameToReconcilers(o, n); got != tc.same {
				t.Errorf("sameToReconcilers = %v, want %v", got, tc.same)
			}
			if tc.same {
				// What is dropped here, each reconciler's own predicates
				// would have dropped too.
				e := event.UpdateEvent{ObjectOld: o, ObjectNew: n}
				if nodeChanged(nil).Update(e) {
					t.Error("the driver reconciler's and the labeller's predicate would pass it")
				}
				if o.Spec.Unschedulable != n.Spec.Unschedulable || !maps.Equal(o.Annotations, n.Annotations) || nodeReady(o) != nodeReady(n) || machineLabelsChanged(nil, o.Labels, n.Labels) {
					t.Error("the upgrade machine's predicate would pass it")
				}
			}
		})
	}
}

// recorder enqueues the name of each object it is handed, by event kind.
func recorder() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: "create/" + e.Object.GetName()}})
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: "update/" + e.ObjectNew.GetName() + "@" + e.ObjectNew.GetResourceVersion()}})
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			name := "delete/" + e.Object.GetName()
			if e.DeleteStateUnknown {
				name += "/unknown"
			}
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		},
	}
}

func takeAll(q workqueue.TypedRateLimitingInterface[reconcile.Request]) map[string]bool {
	out := map[string]bool{}
	for q.Len() > 0 {
		r, _ := q.Get()
		out[r.Name] = true
		q.Done(r)
	}
	return out
}

// Each subscriber is replayed the nodes already cached when it starts, then
// gets every event its predicates pass; a heartbeat reaches none of them,
// and a stopped subscriber gets nothing more.
func TestNodeEventsFanOut(t *testing.T) {
	store := toolscache.NewStore(toolscache.MetaNamespaceKeyFunc)
	existing := cachedNode(func(n *corev1.Node) { n.Name = "n0" })
	_ = store.Add(existing)
	ne := &nodeEvents{store: store}

	newQueue := func() workqueue.TypedRateLimitingInterface[reconcile.Request] {
		return workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	}
	all, labelsOnly := newQueue(), newQueue()
	defer all.ShutDown()
	defer labelsOnly.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ne.source(recorder()).Start(ctx, all); err != nil {
		t.Fatal(err)
	}
	onlyLabels := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetLabels()["pool"] != e.ObjectNew.GetLabels()["pool"]
	}}
	stopped, stop := context.WithCancel(context.Background())
	if err := ne.source(recorder(), onlyLabels).Start(stopped, labelsOnly); err != nil {
		t.Fatal(err)
	}
	if got := takeAll(all); !got["create/n0"] || len(got) != 1 {
		t.Fatalf("replay at start: got %v, want the cached node created", got)
	}
	takeAll(labelsOnly)

	// The count of changes, as a woken reconciler would read it.
	var seen []uint64
	counted := predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { seen = append(seen, ne.changes.Load()); return true },
		UpdateFunc: func(event.UpdateEvent) bool { seen = append(seen, ne.changes.Load()); return true },
	}
	counting := newQueue()
	defer counting.ShutDown()
	if err := ne.source(recorder(), counted).Start(ctx, counting); err != nil {
		t.Fatal(err)
	}
	seen = nil

	n1 := cachedNode(nil)
	ne.OnAdd(n1, false)
	beats := metricNow(t, nodeHeartbeats).GetCounter().GetValue()
	beat := cachedNode(func(n *corev1.Node) { n.ResourceVersion = "2" })
	ne.OnUpdate(n1, beat)
	if got := metricNow(t, nodeHeartbeats).GetCounter().GetValue() - beats; got != 1 {
		t.Errorf("heartbeats counted: %v, want 1", got)
	}
	cordoned := cachedNode(func(n *corev1.Node) { n.ResourceVersion = "3"; n.Spec.Unschedulable = true })
	ne.OnUpdate(beat, cordoned)
	// The add and the cordon are counted, each before the reconcilers
	// hear of it; the heartbeat is not.
	if got := ne.changes.Load(); got != 2 || !slices.Equal(seen, []uint64{1, 2}) {
		t.Errorf("changes counted %d, seen by the subscriber as %v: want 2, seen as [1 2]", got, seen)
	}
	if got := takeAll(all); !got["create/n1"] || !got["update/n1@3"] || len(got) != 2 {
		t.Errorf("all events: got %v, want n1 created and updated once (the cordon, not the heartbeat)", got)
	}
	if got := takeAll(labelsOnly); !got["create/n1"] || len(got) != 1 {
		t.Errorf("a subscriber's own predicate: got %v, want only the create", got)
	}

	relabelled := cachedNode(func(n *corev1.Node) { n.ResourceVersion = "4"; n.Labels["pool"] = "silver" })
	ne.OnUpdate(cordoned, relabelled)
	if got := takeAll(labelsOnly); !got["update/n1@4"] {
		t.Errorf("relabel: got %v, want the update", got)
	}
	takeAll(all)

	ne.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "n1", Obj: relabelled})
	if got := takeAll(all); !got["delete/n1/unknown"] {
		t.Errorf("tombstone: got %v, want a delete with its state unknown", got)
	}
	if got := ne.changes.Load(); got != 4 {
		t.Errorf("changes counted after the relabel and the delete: %d, want 4", got)
	}
	takeAll(labelsOnly)

	stop()
	ne.OnAdd(cachedNode(func(n *corev1.Node) { n.Name = "n2" }), false)
	if got := takeAll(labelsOnly); len(got) != 0 {
		t.Errorf("a stopped subscriber got %v", got)
	}
	if got := takeAll(all); !got["create/n2"] {
		t.Errorf("the running subscriber: got %v, want n2 created", got)
	}
}

// A label no reconciler reads (kube-controller-manager's beta os/arch
// labels) or a taint is no change to the passes' listing of the nodes; a
// label a CR selects by, a label the plan or the machine reads, and
// anything else the cache keeps are. Every update still reaches the
// subscribers.
func TestNodeScanChanges(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	gold := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, Spec: v1alpha1.NVIDIADriverSpec{NodeSelector: map[string]string{"pool": "gold"}}}
	ne := &nodeEvents{store: toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), crs: fake.NewClientBuilder().WithScheme(scheme).WithObjects(gold).Build()}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	if err := ne.source(recorder()).Start(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	prev := cachedNode(nil)
	for i, tc := range []struct {
		name    string
		edit    func(*corev1.Node)
		counted bool
	}{
		{"beta os label", func(n *corev1.Node) { n.Labels["beta.kubernetes.io/os"] = "linux" }, false},
		{"a label nobody selects by", func(n *corev1.Node) { n.Labels["team"] = "a" }, false},
		{"a label a CR selects by", func(n *corev1.Node) { n.Labels["pool"] = "silver" }, true},
		{"the upgrade state", func(n *corev1.Node) { n.Labels[plan.LabelUpgradeState] = upgrade.StateRequired }, true},
		{"the architecture", func(n *corev1.Node) { n.Labels[corev1.LabelArchStable] = "arm64" }, true},
		{"the skip label", func(n *corev1.Node) { n.Labels[upgrade.LabelSkip] = "true" }, true},
		{"the not-ready taint taken off", func(n *corev1.Node) { n.Spec.Taints = nil }, false},
		{"a label nobody reads, and cordoned", func(n *corev1.Node) { n.Labels["team"] = "b"; n.Spec.Unschedulable = true }, true},
		{"our annotation", func(n *corev1.Node) { n.Annotations = map[string]string{upgrade.AnnotationMoveTo: "silver"} }, true},
		{"a label nobody reads, and readiness", func(n *corev1.Node) {
			n.Labels["team"] = "c"
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}, true},
	} {
		cur := cachedNode(func(n *corev1.Node) {
			n.ResourceVersion = fmt.Sprint(10 + i)
			tc.edit(n)
		})
		before := ne.changes.Load()
		ne.OnUpdate(prev, cur)
		if got := ne.changes.Load() > before; got != tc.counted {
			t.Errorf("%s: counted %v, want %v", tc.name, got, tc.counted)
		}
		if got := takeAll(q); !got["update/n1@"+cur.ResourceVersion] {
			t.Errorf("%s: the subscriber got %v, want the update", tc.name, got)
		}
	}
}
