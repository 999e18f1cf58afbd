package controller

import (
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// What wakes the upgrade machine (docs/design.md, "What wakes a pass"). Each
// pass reads all of a CR's nodes, so a pass for an update that changed
// nothing the machine reads is O(nodes) spent for nothing, and while a fleet
// comes up such updates arrive faster than passes end.

// driverPodMatters passes driver pod updates that change what the machine
// reads of a pod. The cache keeps exactly that (trimPod), so two cached
// versions that differ only in resourceVersion are, to the machine, the
// same pod: kwok's and the kubelet's status updates of fields trimPod drops
// (IPs, start times, other conditions) arrive as such pairs.
func driverPodMatters(settled func(*driverPod) bool) predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool {
			p, ok := e.Object.(*driverPod)
			return !ok || !settled(p)
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*driverPod)
			n, ok2 := e.ObjectNew.(*driverPod)
			if !ok1 || !ok2 {
				return true
			}
			return !samePodToMachine(o, n) && !(settled(o) && settled(n))
		},
		DeleteFunc: func(e event.DeleteEvent) bool {
			p, ok := e.Object.(*driverPod)
			return !ok || !settled(p)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// settledPod says whether a driver pod is, to the upgrade machine, settled:
// not yet bound to a node (the machine reads bound pods only), or the
// in-sync pod of its DaemonSet on a node that rests in upgrade-done, neither
// moving nor asked to upgrade. The machine has nothing to do for such a
// pod whatever its phase, readiness or restarts, or whether it comes or
// goes: every driver pod of a fleet coming up is one (docs/design.md, "What
// wakes a pass"). Whatever it cannot tell from the cache (the node or the
// DaemonSet not there yet, a template the DaemonSet controller has not
// observed) is not settled: a needless pass is cheaper than a missed one.
func settledPod(daemonSets, nodes toolscache.Indexer) func(*driverPod) bool {
	return func(p *driverPod) bool {
		if p.NodeName == "" {
			return true
		}
		obj, ok, err := nodes.GetByKey(p.NodeName)
		if err != nil || !ok {
			return false
		}
		n, ok := obj.(*corev1.Node)
		if !ok || n.Labels[upgrade.LabelState] != upgrade.StateDone ||
			n.Annotations[upgrade.AnnotationMoveTo] != "" || n.Annotations[upgrade.AnnotationRequested] == "true" {
			return false
		}
		ref := metav1.GetControllerOfNoCopy(p)
		if ref == nil || ref.Kind != "DaemonSet" {
			return false
		}
		obj, ok, err = daemonSets.GetByKey(p.Namespace + "/" + ref.Name)
		if err != nil || !ok {
			return false
		}
		ds, ok := obj.(*appsv1.DaemonSet)
		return ok && ds.UID == ref.UID && ds.Status.ObservedGeneration >= ds.Generation &&
			fromTemplateGeneration(p.Labels, ds.Annotations[templateGenerationAnnotation])
	}
}

// samePodToMachine compares what trimPod keeps, resourceVersion aside,
// field by field: it runs on every driver pod event, and a reflective
// comparison of the metadata was a third of the pod predicate's cost.
// TestSamePodToMachineComparesWhatTrimPodKeeps fails when trimPod keeps a
// field this does not compare.
func samePodToMachine(o, n *driverPod) bool {
	return o.Name == n.Name && o.Namespace == n.Namespace && o.UID == n.UID &&
		maps.Equal(o.Labels, n.Labels) &&
		slices.EqualFunc(o.OwnerReferences, n.OwnerReferences, sameOwner) &&
		o.CreationTimestamp.Equal(&n.CreationTimestamp) && o.DeletionTimestamp.Equal(n.DeletionTimestamp) &&
		o.NodeName == n.NodeName && o.Phase == n.Phase && o.Ready == n.Ready &&
		o.Restarts == n.Restarts && o.Digest == n.Digest
}

func sameOwner(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		ptr.Equal(a.Controller, b.Controller) && ptr.Equal(a.BlockOwnerDeletion, b.BlockOwnerDeletion)
}

// daemonSetMattersToUpgrade passes DaemonSet updates that change what the
// machine reads of a DaemonSet: its template (the config digest), its
// template generation annotation, its owner, and whether the DaemonSet
// controller has observed its generation (only then is its newest revision's
// hash trusted). The DaemonSet controller rewrites the status counts each
// time a pod becomes ready — once per node while a fleet comes up — and the
// machine reads none of them: the pods themselves wake it.
func daemonSetMattersToUpgrade() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*appsv1.DaemonSet)
			n, ok2 := e.ObjectNew.(*appsv1.DaemonSet)
			if !ok1 || !ok2 {
				return true
			}
			return o.Generation != n.Generation ||
				o.Status.ObservedGeneration != n.Status.ObservedGeneration ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
				!maps.Equal(o.Annotations, n.Annotations) ||
				!maps.Equal(o.Labels, n.Labels) ||
				!slices.EqualFunc(o.OwnerReferences, n.OwnerReferences, sameOwner)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// revisionMattersToUpgrade passes a driver DaemonSet's revision created or
// renumbered (the newest one says which pods are in sync), not its deletion
// nor an update that leaves its number.
func revisionMattersToUpgrade() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*appsv1.ControllerRevision)
			n, ok2 := e.ObjectNew.(*appsv1.ControllerRevision)
			return ok1 && ok2 && o.Revision != n.Revision
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// wakes counts, last in a watch's predicates, the events that passed the
// others (nvdriver_wakeups_total).
func wakes(controller, source string) predicate.Funcs {
	c := wakeups.WithLabelValues(controller, source)
	pass := func() bool { c.Inc(); return true }
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return pass() },
		UpdateFunc:  func(event.UpdateEvent) bool { return pass() },
		DeleteFunc:  func(event.DeleteEvent) bool { return pass() },
		GenericFunc: func(event.GenericEvent) bool { return pass() },
	}
}
