package controller

import (
	"context"
	"maps"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// daemonSetToDriver wakes the driver reconciler for its DaemonSets' events.
// An update that moves only the DaemonSet's status counts (a pod became
// ready, one more is scheduled), and not whether it is rolled out, can
// change only counts in the CR's status, and those are written at most
// every statusEvery (docs/design.md, "Status writes"). So such an update
// wakes the CR when its next counts-only write is due, not at once: while
// a fleet comes up the DaemonSet controller rewrites those counts with
// nearly every pod, and each woke a pass over every node that could only
// hold its write back. Anything else (created, deleted, spec, metadata,
// observed generation, rolled out or no longer) wakes it at once.
func daemonSetToDriver(pacer *statusPacer, now func() time.Time) handler.EventHandler {
	owner := func(o client.Object) (reconcile.Request, *metav1.OwnerReference) {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != "NVIDIADriver" {
			return reconcile.Request{}, nil
		}
		return reconcile.Request{NamespacedName: client.ObjectKey{Name: ref.Name}}, ref
	}
	add := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if req, ref := owner(o); ref != nil {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			req, ref := owner(e.ObjectNew)
			if ref == nil {
				add(e.ObjectOld, q) // taken from its CR: the old one looks again
				return
			}
			o, ok1 := e.ObjectOld.(*appsv1.DaemonSet)
			n, ok2 := e.ObjectNew.(*appsv1.DaemonSet)
			if ok1 && ok2 && countsOnly(o, n) {
				if wait := pacer.wait(ref.UID, writerDriver, now()); wait > 0 {
					q.AddAfter(req, wait)
					return
				}
			}
			q.Add(req)
		},
	}
}

// countsOnly: the two versions of a DaemonSet differ at most in their
// status counts, and agree on whether it is rolled out (rolledOut).
func countsOnly(o, n *appsv1.DaemonSet) bool {
	return o.Generation == n.Generation && o.Status.ObservedGeneration == n.Status.ObservedGeneration &&
		rolledOut(o) == rolledOut(n) &&
		o.DeletionTimestamp.IsZero() == n.DeletionTimestamp.IsZero() &&
		maps.Equal(o.Labels, n.Labels) && maps.Equal(o.Annotations, n.Annotations) &&
		equality.Semantic.DeepEqual(o.OwnerReferences, n.OwnerReferences)
}
