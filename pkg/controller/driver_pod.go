package controller

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// driverPod is what the cache keeps of a driver pod (trimPod): what the
// upgrade machine, the node labeller and their predicates read, and
// nothing else (docs/design.md, "Node cache"). Not a corev1.Pod: that
// struct is 1.2 KiB before any field is set, and a trimmed one with its
// container (for the config digest), container statuses and Ready
// condition took 2.3 KiB; with one driver pod per GPU node, that was a
// quarter of the live heap at 5,000 nodes.
//
// Only the informer's store and its event handlers hold these: driver pods
// are read through cachedReads, never through the cache client (which
// would refuse the type). A pod to write (delete) is made from its name,
// namespace and UID (podRef).
type driverPod struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	NodeName string
	Phase    corev1.PodPhase
	Ready    bool   // its Ready condition is True
	Restarts int32  // the most restarts of any of its containers, init or not
	Digest   string // its driver config digest (render.PodConfigDigest; "" without one)
}

// DeepCopyObject implements runtime.Object.
func (p *driverPod) DeepCopyObject() runtime.Object {
	out := *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// podRef is the pod to write for p: its identity only.
func (p *driverPod) podRef() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID}}
}
