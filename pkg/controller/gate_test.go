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
	g := gate("test", inner)
	clock := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	g.now = func() time.Time { return clock }
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
