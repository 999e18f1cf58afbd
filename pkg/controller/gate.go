package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// passEvery is the shortest time between two passes of one reconciler for
// one object (docs/design.md, "What wakes a pass").
const passEvery = 250 * time.Millisecond

// gated runs the inner reconciler at most once every passEvery per request.
// A pass reads the whole cluster (the plan) or all of a CR's nodes (the
// upgrade machine), so it costs O(nodes); while a fleet comes up or rolls,
// events arrive faster than passes end, and each would start a pass of its
// own. A request that comes sooner is put back for the rest of the interval:
// the work queue keeps one entry per request, so everything that arrives
// meanwhile joins that one pass, which reads the cache as it is then. The
// first event after a quiet spell runs at once.
type gated struct {
	inner reconcile.Reconciler
	every time.Duration
	name  string // the controller's, for the metric

	mu   sync.Mutex
	last map[types.NamespacedName]time.Time
	now  func() time.Time
}

func gate(name string, inner reconcile.Reconciler) *gated {
	return &gated{inner: inner, every: passEvery, name: name, last: map[types.NamespacedName]time.Time{}, now: time.Now}
}

// Reconcile implements reconcile.Reconciler.
func (g *gated) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if wait := g.turn(req.NamespacedName); wait > 0 {
		passesDeferred.WithLabelValues(g.name).Inc()
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	return g.inner.Reconcile(ctx, req)
}

// turn is how long the request must wait for its pass (0: run it now,
// which starts its interval).
func (g *gated) turn(key types.NamespacedName) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if last, ok := g.last[key]; ok {
		if wait := g.every - now.Sub(last); wait > 0 {
			return wait
		}
	}
	g.last[key] = now
	if len(g.last) > 4096 { // deleted CRs: forget intervals long over
		for k, t := range g.last {
			if now.Sub(t) > time.Minute {
				delete(g.last, k)
			}
		}
	}
	return 0
}
