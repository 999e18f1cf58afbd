package controller

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// eventBatch is how long the reconcile a node, pod or DaemonSet event asks
// for waits for the events that follow it. A fleet coming up sends
// thousands of such events a minute (each pod alone changes status four or
// five times), and every one used to run a whole pass over the CR's nodes;
// the queue keeps one request per CR while it waits, so a burst costs one
// pass. A CR's own changes are not delayed (docs/design.md, "Event batching").
const eventBatch = 250 * time.Millisecond

// batched wraps a handler so that what it enqueues is delayed by eventBatch.
func batched(h handler.EventHandler) handler.EventHandler {
	return batchedHandler{inner: h, delay: eventBatch}
}

type batchedHandler struct {
	inner handler.EventHandler
	delay time.Duration
}

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func (b batchedHandler) Create(ctx context.Context, e event.CreateEvent, q queue) {
	b.inner.Create(ctx, e, delayedQueue{q, b.delay})
}

func (b batchedHandler) Update(ctx context.Context, e event.UpdateEvent, q queue) {
	b.inner.Update(ctx, e, delayedQueue{q, b.delay})
}

func (b batchedHandler) Delete(ctx context.Context, e event.DeleteEvent, q queue) {
	b.inner.Delete(ctx, e, delayedQueue{q, b.delay})
}

func (b batchedHandler) Generic(ctx context.Context, e event.GenericEvent, q queue) {
	b.inner.Generic(ctx, e, delayedQueue{q, b.delay})
}

// delayedQueue turns Add into AddAfter. Both of controller-runtime's queues
// keep one entry per request and the earliest time asked for, so requests
// added during the wait join the first one. It deliberately does not
// implement priorityqueue.PriorityQueue, so handlers fall back to Add.
type delayedQueue struct {
	queue
	delay time.Duration
}

func (q delayedQueue) Add(r reconcile.Request) { q.AddAfter(r, q.delay) }
