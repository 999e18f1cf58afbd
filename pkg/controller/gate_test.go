package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

type countingReconciler struct{ passes map[string]int }

func (c *countingReconciler) Reconcile(_ context.Context, req ctrl.Request) (ctrl.Result, error) {
	c.passes[req.Name]++
	return ctrl.Result{}, nil
}

// A burst of requests for one object costs one pass now and one when the
// interval ends (the deferred request's RequeueAfter), whatever the burst's
// size; another object is gated apart; a request after the interval runs.
func TestGateRunsOnePassPerInterval(t *testing.T) {
	inner := &countingReconciler{passes: map[string]int{}}
	g := gate("test", inner, nil)
	clock := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	g.now, g.cpu = func() time.Time { return clock }, wallOnly
	req := func(name string) ctrl.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}
	}

	var deferred []time.Duration
	for i := 0; i < 50; i++ {
		res, err := g.Reconcile(context.Background(), req("a"))
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter > 0 {
			deferred = append(deferred, res.RequeueAfter)
		}
		clock = clock.Add(time.Millisecond)
	}
	if inner.passes["a"] != 1 || len(deferred) != 49 {
		t.Fatalf("burst of 50: %d passes, %d deferred; want 1 and 49", inner.passes["a"], len(deferred))
	}
	if deferred[0] != passEvery-time.Millisecond || deferred[48] != passEvery-49*time.Millisecond {
		t.Errorf("deferred by %v .. %v: want the rest of the interval", deferred[0], deferred[48])
	}
	if _, _ = g.Reconcile(context.Background(), req("b")); inner.passes["b"] != 1 {
		t.Error("another object waited for the first one's interval")
	}
	clock = clock.Add(passEvery)
	if res, _ := g.Reconcile(context.Background(), req("a")); res.RequeueAfter != 0 || inner.passes["a"] != 2 {
		t.Errorf("after the interval: %d passes, requeue %v; want 2 and none", inner.passes["a"], res.RequeueAfter)
	}
}

// wallOnly is a CPU clock that cannot be read: the gate falls back to the
// pass's wall time, on the test's clock.
func wallOnly(f func()) (time.Duration, bool) { f(); return 0, false }

// slowReconciler's passes cost what it is told, part of it waiting on the
// API server (excludeFromCost), on the gate's clock.
type slowReconciler struct {
	clock        *time.Time
	work, waited time.Duration
	passes       int
}

func (s *slowReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	s.passes++
	*s.clock = s.clock.Add(s.work)
	// Two overlapping waits (concurrent writes) count once.
	a, b := excludeFromCost(ctx), excludeFromCost(ctx)
	*s.clock = s.clock.Add(s.waited)
	a()
	b()
	return ctrl.Result{}, nil
}

// The interval after a pass is passCostFactor times what the pass cost,
// never less than passEvery nor more than passEveryMax, and the pass's
// waits on the API server are not its cost.
func TestGateIntervalGrowsWithThePassCost(t *testing.T) {
	if 20*time.Millisecond*passCostFactor >= passEveryMax || 2*time.Millisecond*passCostFactor >= passEvery {
		t.Fatal("the cases assume a 2ms pass stays at passEvery and a 20ms one below passEveryMax")
	}
	cases := []struct {
		name         string
		work, waited time.Duration
		want         time.Duration
	}{
		{"a cheap pass", 2 * time.Millisecond, 0, passEvery},
		{"a pass of 20ms", 20 * time.Millisecond, 0, 20 * time.Millisecond * passCostFactor},
		{"a pass of 1s, capped", time.Second, 0, passEveryMax},
		{"a cheap pass that waited 3s on writes", 2 * time.Millisecond, 3 * time.Second, passEvery},
		{"a pass of 20ms that waited 1s on writes", 20 * time.Millisecond, time.Second, 20 * time.Millisecond * passCostFactor},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
			inner := &slowReconciler{clock: &clock, work: tc.work, waited: tc.waited}
			g := gate("test", inner, nil)
			g.now, g.cpu = func() time.Time { return clock }, wallOnly
			req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "a"}}
			start := clock
			if _, err := g.Reconcile(context.Background(), req); err != nil || inner.passes != 1 {
				t.Fatalf("first pass: %d passes, %v", inner.passes, err)
			}
			// Just before the interval ends (from the pass's start): deferred
			// by the rest of it.
			clock = start.Add(tc.want - time.Millisecond)
			res, _ := g.Reconcile(context.Background(), req)
			if inner.passes != 1 || res.RequeueAfter != time.Millisecond {
				t.Fatalf("before the interval: %d passes, requeue %v; want 1 and 1ms (interval %v)", inner.passes, res.RequeueAfter, tc.want)
			}
			clock = start.Add(tc.want)
			if res, _ := g.Reconcile(context.Background(), req); inner.passes != 2 || res.RequeueAfter != 0 {
				t.Fatalf("at the interval: %d passes, requeue %v; want 2 and none", inner.passes, res.RequeueAfter)
			}
		})
	}
}

// Where the thread's CPU time can be read, it is the pass's cost: a pass
// that spent most of its time waiting for a core (a busy machine) does not
// stretch the next interval, and one that burnt CPU does.
func TestGateCostIsThePassCPU(t *testing.T) {
	for _, tc := range []struct {
		name      string
		wall, cpu time.Duration
		want      time.Duration
	}{
		{"waited 200ms for a core, 2ms of CPU", 200 * time.Millisecond, 2 * time.Millisecond, passEvery},
		{"20ms of CPU", 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond * passCostFactor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
			inner := &slowReconciler{clock: &clock, work: tc.wall}
			g := gate("test", inner, nil)
			g.now = func() time.Time { return clock }
			g.cpu = func(f func()) (time.Duration, bool) { f(); return tc.cpu, true }
			req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "a"}}
			start := clock
			_, _ = g.Reconcile(context.Background(), req)
			clock = start.Add(tc.want - time.Millisecond)
			if res, _ := g.Reconcile(context.Background(), req); res.RequeueAfter != time.Millisecond {
				t.Errorf("just before %v: requeue %v, want 1ms", tc.want, res.RequeueAfter)
			}
		})
	}
}

// labellerGateAfterAPass is the node labeller's gate on the test's clock,
// after one pass that cost 20ms of CPU.
func labellerGateAfterAPass(clock *time.Time) *gated {
	g := labellerGate(&NodeLabeler{}, nil)
	g.inner = &slowReconciler{clock: clock}
	g.now = func() time.Time { return *clock }
	g.cpu = func(f func()) (time.Duration, bool) { f(); return 20 * time.Millisecond, true }
	_, _ = g.Reconcile(context.Background(), nodeLabelsKey)
	return g
}

// The node labeller's interval is labellerCostFactor times its pass's
// cost, not passCostFactor: a 20ms pass (one that computed the plan of a
// large cluster) holds an admin's next move for 400ms, not a second.
func TestLabellerGateHasItsOwnFactor(t *testing.T) {
	clock := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	g := labellerGateAfterAPass(&clock)
	start := clock
	want := 20 * time.Millisecond * labellerCostFactor
	if want >= 20*time.Millisecond*passCostFactor || want <= passEvery {
		t.Fatalf("the case assumes the labeller's interval for 20ms lies between passEvery and the others' (%v)", want)
	}
	clock = start.Add(want - time.Millisecond)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != time.Millisecond {
		t.Errorf("just before %v: requeue %v, want 1ms", want, res.RequeueAfter)
	}
	clock = start.Add(want)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != 0 {
		t.Errorf("at %v: requeue %v, want a pass", want, res.RequeueAfter)
	}
}

// Every request tells the memory rest the controller is busy, deferred or
// not.
func TestGateSaysBusy(t *testing.T) {
	busy := 0
	g := gate("test", &countingReconciler{passes: map[string]int{}}, func() { busy++ })
	clock := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	g.now, g.cpu = func() time.Time { return clock }, wallOnly
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "a"}}
	_, _ = g.Reconcile(context.Background(), req)
	if res, _ := g.Reconcile(context.Background(), req); res.RequeueAfter == 0 || busy != 2 {
		t.Errorf("a pass and a deferred request: busy told %d times (deferred: %v), want 2", busy, res.RequeueAfter > 0)
	}
}

// A hurried turn (a relabelled node waits for it) comes after
// hurryCostFactor times the last pass's cost, not labellerCostFactor
// times; the hurry is spent by the pass it brings forward.
func TestHurriedTurnComesSooner(t *testing.T) {
	clock := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	g := labellerGateAfterAPass(&clock)
	start := clock
	normal, hurried := 20*time.Millisecond*labellerCostFactor, 20*time.Millisecond*hurryCostFactor
	if hurried <= hurryEvery || hurried >= normal {
		t.Fatalf("the case assumes a hurried interval (%v) between hurryEvery and the labeller's (%v)", hurried, normal)
	}
	clock = start.Add(30 * time.Millisecond)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != normal-30*time.Millisecond {
		t.Fatalf("not hurried: requeue %v, want %v", res.RequeueAfter, normal-30*time.Millisecond)
	}
	g.hurry(nodeLabelsKey.NamespacedName)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != hurried-30*time.Millisecond {
		t.Errorf("hurried: requeue %v, want %v", res.RequeueAfter, hurried-30*time.Millisecond)
	}
	clock = start.Add(hurried)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != 0 {
		t.Fatalf("hurried, at %v: requeue %v, want a pass", hurried, res.RequeueAfter)
	}
	passed := clock
	clock = passed.Add(30 * time.Millisecond)
	if res, _ := g.Reconcile(context.Background(), nodeLabelsKey); res.RequeueAfter != normal-30*time.Millisecond {
		t.Errorf("after the hurried pass: requeue %v, want the labeller's interval again (%v)", res.RequeueAfter, normal-30*time.Millisecond)
	}
}
