package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A burst of node events for one CR waits eventBatch and then asks for one
// reconcile; a CR's own event (not batched) is queued at once.
func TestBatchedHandler(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock})
	defer q.ShutDown()

	toCR := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "gpu"}}}
	})
	h := batched(toCR)
	ctx := context.Background()
	for i := range 50 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node", ResourceVersion: "1"}}
		m := n.DeepCopy()
		m.ResourceVersion = string(rune('a' + i%26))
		h.Update(ctx, event.UpdateEvent{ObjectOld: n, ObjectNew: m}, q)
	}
	h.Create(ctx, event.CreateEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}}, q)
	if n := q.Len(); n != 0 {
		t.Fatalf("queued %d requests before eventBatch passed, want 0", n)
	}

	clock.Step(eventBatch)
	// The delaying queue moves ready items on its own goroutine.
	_ = wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return q.Len() > 0, nil
	})
	if n := q.Len(); n != 1 {
		t.Fatalf("after eventBatch: %d requests queued, want the burst folded into 1", n)
	}

	// The unbatched handler still enqueues immediately.
	q2 := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q2.ShutDown()
	toCR.Create(ctx, event.CreateEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}}, q2)
	if n := q2.Len(); n != 1 {
		t.Fatalf("unbatched handler queued %d, want 1 at once", n)
	}
}
