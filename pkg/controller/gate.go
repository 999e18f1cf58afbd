package controller

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The interval between two passes of one reconciler for one object
// (docs/design.md, "What wakes a pass"): passEvery at least, and
// passCostFactor (the node labeller: labellerCostFactor) times what the last
// pass cost, up to passEveryMax.
const (
	passEvery      = 250 * time.Millisecond
	passCostFactor = 50
	passEveryMax   = 2 * time.Second
	// labellerCostFactor is the node labeller's: one object for the whole
	// cluster, whose pass is what an admin's relabelled node waits for.
	labellerCostFactor = 20
	// hurryEvery and hurryCostFactor make the interval of a turn someone
	// waits for (hurry): a relabelled node, whose move starts with the
	// node labeller's next pass (docs/design.md, "What wakes a pass").
	hurryEvery      = 25 * time.Millisecond
	hurryCostFactor = 5
)

// gated runs the inner reconciler at most once per interval per request.
// A pass reads the whole cluster (the plan) or all of a CR's nodes (the
// upgrade machine), so it costs O(nodes); while a fleet comes up or rolls,
// events arrive faster than passes end, and each would start a pass of its
// own. A request that comes sooner is put back for the rest of the interval:
// the work queue keeps one entry per request, so everything that arrives
// meanwhile joins that one pass, which reads the cache as it is then. The
// first event after a quiet spell runs at once.
//
// The interval grows with the pass's own cost (the CPU time of the thread
// it ran on, or where that cannot be read its time less the time it spent
// waiting on the API server, see excludeFromCost), so a reconciler
// spends at most about 1/factor of a core on one object however
// large the cluster: at a few dozen nodes a pass costs a millisecond and the
// interval stays passEvery; at thousands it stretches to passEveryMax, and
// the events of a burst join fewer, larger passes.
type gated struct {
	inner  reconcile.Reconciler
	every  time.Duration
	factor time.Duration // the interval is this many times a pass's cost
	name   string        // the controller's, for the metric
	// busy, if set, is told of each request (memlimit.Rest).
	busy func()

	mu    sync.Mutex
	turns map[types.NamespacedName]turn
	// hurried: the objects whose next turn someone waits for (hurry),
	// until that turn starts.
	hurried map[types.NamespacedName]bool
	now     func() time.Time
	// cpu runs a pass and says what CPU it cost (onThread); when it
	// cannot, the cost is the pass's wall time less its API waits.
	cpu func(func()) (time.Duration, bool)
}

// turn is when an object's last pass started and how long the next one
// must wait after that start.
type turn struct {
	start    time.Time
	interval time.Duration
	cost     time.Duration // the pass's, for a hurried turn's interval
}

func gate(name string, inner reconcile.Reconciler, busy func()) *gated {
	return &gated{inner: inner, every: passEvery, factor: passCostFactor, name: name, busy: busy,
		turns: map[types.NamespacedName]turn{}, now: time.Now, cpu: onThread}
}

// Reconcile implements reconcile.Reconciler.
func (g *gated) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if g.busy != nil {
		g.busy()
	}
	if wait := g.turn(req.NamespacedName); wait > 0 {
		passesDeferred.WithLabelValues(g.name).Inc()
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	start := g.now()
	costs := &passCost{now: g.now}
	var (
		res ctrl.Result
		err error
	)
	cpu, measured := g.cpu(func() { res, err = g.inner.Reconcile(context.WithValue(ctx, passCostKey{}, costs), req) })
	cost := max(g.now().Sub(start)-costs.waited(), 0)
	if measured {
		cost = cpu
	}
	passSeconds.WithLabelValues(g.name).Observe(cost.Seconds())
	g.passed(req.NamespacedName, start, cost)
	return res, err
}

// turn is how long the request must wait for its pass (0: run it now,
// which starts its interval).
func (g *gated) turn(key types.NamespacedName) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if t, ok := g.turns[key]; ok {
		interval := t.interval
		if g.hurried[key] {
			interval = min(interval, intervalFor(hurryEvery, hurryCostFactor, t.cost))
		}
		if wait := interval - now.Sub(t.start); wait > 0 {
			return wait
		}
	}
	// Held until the pass ends and says what it cost (passed). The pass
	// reads everything up to now, a hurried request's change with it.
	g.turns[key] = turn{start: now, interval: g.every}
	delete(g.hurried, key)
	if len(g.turns) > 4096 { // deleted CRs: forget intervals long over
		for k, t := range g.turns {
			if now.Sub(t.start) > time.Minute {
				delete(g.turns, k)
			}
		}
	}
	return 0
}

// passed sets the object's next interval from what its pass cost.
func (g *gated) passed(key types.NamespacedName, start time.Time, cost time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.turns[key] = turn{start: start, interval: intervalFor(g.every, g.factor, cost), cost: cost}
}

// hurry shortens the object's current interval, for its next turn only, to
// hurryCostFactor times its last pass's cost, at least hurryEvery: someone
// waits for that pass. The reconciler's CPU on the object is then bounded
// by a fifth of a core, not a twentieth or a fiftieth, for as long as
// hurried requests keep coming. Called before the request is queued.
func (g *gated) hurry(key types.NamespacedName) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hurried == nil {
		g.hurried = map[types.NamespacedName]bool{}
	}
	g.hurried[key] = true
}

// intervalFor is the time from one pass's start to the next: every at
// least, factor times the pass's cost, at most passEveryMax (a pass slowed
// by a saturated machine must not leave an object alone for long).
func intervalFor(every, factor, cost time.Duration) time.Duration {
	return min(max(every, factor*cost), max(every, passEveryMax))
}

// passCost collects the time a pass spent waiting on the API server (its
// writes, and the uncached reads of pods on nodes mid-upgrade), which is not
// the controller's work: a rollout pass that patches a hundred nodes waits on
// the API server, and counting that wait would slow the rollout. Waits may
// overlap (concurrent writes): the time during which at least one is in
// flight is counted once.
type passCost struct {
	now      func() time.Time
	mu       sync.Mutex
	inFlight int
	since    time.Time
	wait     time.Duration
}

type passCostKey struct{}

func (c *passCost) waited() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wait
}

// excludeFromCost starts timing a wait on the API server within a pass; the
// returned func ends it.
func excludeFromCost(ctx context.Context) (done func()) {
	c, _ := ctx.Value(passCostKey{}).(*passCost)
	if c == nil {
		return func() {}
	}
	c.mu.Lock()
	if c.inFlight == 0 {
		c.since = c.now()
	}
	c.inFlight++
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		if c.inFlight--; c.inFlight == 0 {
			c.wait += c.now().Sub(c.since)
		}
		c.mu.Unlock()
	}
}
