package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// nodeEvents hands the node informer's events to the three reconcilers that
// watch nodes (driver, node labeller, upgrade machine) through one
// registration on the informer, and drops there the updates none of them
// reads (docs/design.md, "Node events"). Most node updates are status
// heartbeats: kwok writes every node's status every 20–45 s, a kubelet
// every few minutes. With a registration per reconciler, client-go hands
// each event to each registration's own pair of goroutines before any
// predicate runs: six hand-offs per heartbeat instead of two.
type nodeEvents struct {
	store toolscache.Store // the informer's, to replay to a late subscriber

	// changes counts the node events that change something a pass over
	// the nodes reads: added, deleted, or updated in more than the
	// resourceVersion and the labels no reconciler reads (scanChanged).
	// It is counted before any reconciler is woken, so a pass an event
	// wakes reads a count that includes it: the plan cache reuses its last
	// listing of the nodes while the count stands (docs/design.md, "Node
	// scans").
	changes atomic.Uint64
	// crs reads the CRs whose selectors name the labels that matter
	// (nil: every label change counts).
	crs client.Reader

	mu   sync.RWMutex
	subs []*nodeSub
}

// nodeSub is one reconciler's watch: its handler, predicates and queue.
type nodeSub struct {
	ctx   context.Context
	h     handler.EventHandler
	preds []predicate.Predicate
	q     workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// newNodeEvents adds the one handler to the cache's node informer; store
// is that informer's (cachedReads), replayed to each reconciler that starts.
func newNodeEvents(ctx context.Context, c cache.Cache, store toolscache.Store) (*nodeEvents, error) {
	inf, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	ne := &nodeEvents{store: store, crs: c}
	if _, err := inf.AddEventHandler(ne); err != nil {
		return nil, fmt.Errorf("node event handler: %w", err)
	}
	return ne, nil
}

// source is a reconciler's node watch, as builder.WatchesRawSource takes
// it. On start it is sent every node in the cache (a create event each, as
// a watch of its own would be), then every event from then on.
func (ne *nodeEvents) source(h handler.EventHandler, preds ...predicate.Predicate) source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		sub := &nodeSub{ctx: ctx, h: h, preds: preds, q: q}
		ne.mu.Lock()
		ne.subs = append(ne.subs, sub)
		ne.mu.Unlock()
		// Subscribed first, replayed second: an event in between reaches
		// the reconciler twice at worst, and its queue keeps one request.
		for _, obj := range ne.store.List() {
			sub.create(obj)
		}
		return nil
	})
}

func (ne *nodeEvents) changed(kind string) {
	ne.changes.Add(1)
	nodeChangesSeen.WithLabelValues(kind).Inc()
}

func (ne *nodeEvents) each(f func(*nodeSub)) {
	ne.mu.RLock()
	subs := ne.subs
	ne.mu.RUnlock()
	for _, s := range subs {
		if s.ctx.Err() == nil { // its controller has stopped
			f(s)
		}
	}
}

// OnAdd implements toolscache.ResourceEventHandler.
func (ne *nodeEvents) OnAdd(obj any, _ bool) {
	ne.changed("added")
	ne.each(func(s *nodeSub) { s.create(obj) })
}

// OnUpdate implements toolscache.ResourceEventHandler.
func (ne *nodeEvents) OnUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if ok1 && ok2 && sameToReconcilers(o, n) {
		nodeHeartbeats.Inc()
		return
	}
	if !ok1 || !ok2 || ne.scanChanged(o, n) {
		ne.changed("updated")
	}
	ne.each(func(s *nodeSub) { s.update(oldObj, newObj) })
}

// OnDelete implements toolscache.ResourceEventHandler.
func (ne *nodeEvents) OnDelete(obj any) {
	ne.changed("deleted")
	ne.each(func(s *nodeSub) { s.delete(obj) })
}

func (s *nodeSub) create(obj any) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	e := event.CreateEvent{Object: o}
	for _, p := range s.preds {
		if !p.Create(e) {
			return
		}
	}
	s.h.Create(s.ctx, e, s.q)
}

func (s *nodeSub) update(oldObj, newObj any) {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 {
		return
	}
	e := event.UpdateEvent{ObjectOld: o, ObjectNew: n}
	for _, p := range s.preds {
		if !p.Update(e) {
			return
		}
	}
	s.h.Update(s.ctx, e, s.q)
}

func (s *nodeSub) delete(obj any) {
	e := event.DeleteEvent{}
	switch t := obj.(type) {
	case client.Object:
		e.Object = t
	case toolscache.DeletedFinalStateUnknown:
		o, ok := t.Obj.(client.Object)
		if !ok {
			return
		}
		e.Object, e.DeleteStateUnknown = o, true
	default:
		return
	}
	for _, p := range s.preds {
		if !p.Delete(e) {
			return
		}
	}
	s.h.Delete(s.ctx, e, s.q)
}

// scanChanged: the update changes more than what no pass over the nodes
// reads: its taints (the cache keeps them, no reconciler reads them) and
// labels no reconciler reads (machineLabelsChanged). In the benchmark's
// cluster kube-controller-manager adds the beta os/arch labels to every new
// node and takes its not-ready taint off, a few nodes a second for as long
// as a fleet comes up, and each of those made the driver's next pass list
// every node again.
func (ne *nodeEvents) scanChanged(o, n *corev1.Node) bool {
	if !sameBesideLabelsAndTaints(o, n) || ne.crs == nil {
		return true
	}
	return machineLabelsChanged(ne.crs, o.Labels, n.Labels)
}

// sameToReconcilers: the two cached versions of a node differ in nothing
// the cache keeps (trimNode) but the resourceVersion. No reconciler reads
// anything else of a node, so none has anything to do; each one's own
// predicates would drop such an update too (TestSameToReconcilers).
func sameToReconcilers(o, n *corev1.Node) bool {
	return sameBesideLabelsAndTaints(o, n) && maps.Equal(o.Labels, n.Labels) &&
		slices.EqualFunc(o.Spec.Taints, n.Spec.Taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value })
}

// sameBesideLabelsAndTaints compares the rest of what the cache keeps of a
// node: identity, deletion, our annotations, cordon and readiness.
func sameBesideLabelsAndTaints(o, n *corev1.Node) bool {
	return o.Name == n.Name && o.UID == n.UID &&
		o.DeletionTimestamp.Equal(n.DeletionTimestamp) &&
		maps.Equal(o.Annotations, n.Annotations) &&
		o.Spec.Unschedulable == n.Spec.Unschedulable &&
		nodeReady(o) == nodeReady(n)
}
