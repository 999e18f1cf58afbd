package controller

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// cachedReads reads nodes straight from the informer's store and an index
// of our own on it: pointers to the cached objects, shared and read-only
// (docs/design.md, "Node cache"). The cache client's List copies every
// object it returns into a typed list, by reflection, even without a deep
// copy: every pass reads all nodes (the plan) or all of a CR's nodes (the
// upgrade machine), and at 1,000 nodes those copies were a tenth of the
// controller's CPU and much of its garbage.
//
// The objects must never be modified: copy one before changing it (the
// upgrade machine copies the nodes it patches).
//
// Driver pods are read the same way, from a store indexed by DaemonSet and
// by node. Their informer is cluster-scoped with a metadata.namespace field
// selector rather than namespace-limited (CacheOptions): controller-runtime's
// informer for a namespace-limited cache does not expose its store.
type cachedReads struct {
	nodes      toolscache.Indexer
	pods       toolscache.Indexer
	daemonSets toolscache.Indexer
	memo       nodeMemo // the nodes' facts
}

// idxRunBy is our own index on the node informer (not a controller-runtime
// field index, whose keys are its internal format): nodes by the CR whose
// upgrade machine carries them (upgrade.RunBy).
const idxRunBy = "nvdriver.runBy"

// idxPodController and idxPodNode index the cached driver pods by their
// DaemonSet's UID and by their node.
const (
	idxPodController = "nvdriver.pod.controller"
	idxPodNode       = "nvdriver.pod.node"
)

// idxDaemonSetOwner indexes the cached DaemonSets by the UID of the
// NVIDIADriver that controls them.
const idxDaemonSetOwner = "nvdriver.daemonset.owner"

// newCachedReads adds our indexes to the cache's node, driver pod and
// DaemonSet informers and keeps their stores, and gives the node informer
// the transform that shares with its store (nodeTrim). It fails when the
// cache does not expose them.
func newCachedReads(ctx context.Context, c cache.Cache) (*cachedReads, error) {
	nodes, err := informerOf(ctx, c, &corev1.Node{}, toolscache.Indexers{idxRunBy: func(obj any) ([]string, error) {
		o, ok := obj.(client.Object)
		if !ok {
			return nil, nil
		}
		if by := upgrade.RunBy(o.GetLabels()[plan.LabelOwner], o.GetAnnotations()[upgrade.AnnotationMoveTo]); by != "" {
			return []string{by}, nil
		}
		return nil, nil
	}})
	if err != nil {
		return nil, err
	}
	// The transform CacheOptions set, now with the store to share with
	// (nodeTrim). The informer has not started: Setup runs before the
	// manager does.
	if err := nodes.SetTransform(nodeTrim{cached: nodes.GetIndexer()}.trim); err != nil {
		return nil, fmt.Errorf("node transform: %w", err)
	}
	pods, err := informerOf(ctx, c, &corev1.Pod{}, toolscache.Indexers{
		idxPodController: func(obj any) ([]string, error) {
			if p, ok := obj.(*driverPod); ok {
				if ref := metav1.GetControllerOfNoCopy(p); ref != nil && ref.Kind == "DaemonSet" {
					return []string{string(ref.UID)}, nil
				}
			}
			return nil, nil
		},
		idxPodNode: func(obj any) ([]string, error) {
			if p, ok := obj.(*driverPod); ok && p.NodeName != "" {
				return []string{p.NodeName}, nil
			}
			return nil, nil
		},
	})
	if err != nil {
		return nil, err
	}
	// Read directly by the pod predicate (once per driver pod event) and by
	// the driver and upgrade passes: through the client, each read also
	// looked up the kind's REST mapping, which cost more than the read
	// (docs/design.md, "Node cache").
	daemonSets, err := informerOf(ctx, c, &appsv1.DaemonSet{}, toolscache.Indexers{idxDaemonSetOwner: func(obj any) ([]string, error) {
		if o, ok := obj.(*appsv1.DaemonSet); ok {
			if ref := metav1.GetControllerOfNoCopy(o); ref != nil && ref.Kind == "NVIDIADriver" && ref.APIVersion == v1alpha1.GroupVersion.String() {
				return []string{string(ref.UID)}, nil
			}
		}
		return nil, nil
	}})
	if err != nil {
		return nil, err
	}
	return &cachedReads{nodes: nodes.GetIndexer(), pods: pods.GetIndexer(), daemonSets: daemonSets.GetIndexer()}, nil
}

// informerOf is the cache's informer for obj, with our indexes added.
// controller-runtime hands out client-go's shared informer itself, whose
// store the passes read and whose transform Setup may set.
func informerOf(ctx context.Context, c cache.Cache, obj client.Object, idx toolscache.Indexers) (toolscache.SharedIndexInformer, error) {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, fmt.Errorf("informer for %T: %w", obj, err)
	}
	if err := inf.AddIndexers(idx); err != nil {
		return nil, fmt.Errorf("indexes on %T: %w", obj, err)
	}
	si, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, fmt.Errorf("the cache's informer for %T (%T) does not expose its store", obj, inf)
	}
	return si, nil
}

// daemonSetsOf are the cached DaemonSets in namespace that the CR of uid
// controls, as the store holds them: read them, never change them.
func (c *cachedReads) daemonSetsOf(namespace, uid string) ([]*appsv1.DaemonSet, error) {
	objs, err := c.daemonSets.ByIndex(idxDaemonSetOwner, uid)
	if err != nil {
		return nil, err
	}
	return inNamespace(typed[*appsv1.DaemonSet](objs), namespace), nil
}

// daemonSetsIn are the cached driver DaemonSets in namespace, as the store
// holds them.
func (c *cachedReads) daemonSetsIn(namespace string) []*appsv1.DaemonSet {
	return inNamespace(typed[*appsv1.DaemonSet](c.daemonSets.List()), namespace)
}

// inNamespace keeps the DaemonSets of namespace (the cache's field selector
// already does; a store shared with another namespace's controller would not).
func inNamespace(dss []*appsv1.DaemonSet, namespace string) []*appsv1.DaemonSet {
	return slices.DeleteFunc(dss, func(ds *appsv1.DaemonSet) bool { return ds.Namespace != namespace })
}

func (c *cachedReads) allNodes() []*corev1.Node { return typed[*corev1.Node](c.nodes.List()) }

// nodesRunBy are the nodes whose upgrade machine is driver's (upgrade.RunBy).
func (c *cachedReads) nodesRunBy(driver string) ([]*corev1.Node, error) {
	objs, err := c.nodes.ByIndex(idxRunBy, driver)
	return typed[*corev1.Node](objs), err
}

// allPods are every cached driver pod.
func (c *cachedReads) allPods() []*driverPod { return typed[*driverPod](c.pods.List()) }

// podsBy are the cached driver pods of a DaemonSet (idxPodController, by
// UID) or on a node (idxPodNode, by name).
func (c *cachedReads) podsBy(index, value string) ([]*driverPod, error) {
	objs, err := c.pods.ByIndex(index, value)
	return typed[*driverPod](objs), err
}

// typed keeps the store's objects of type T (all of them: a store holds one
// type), as the pointers the store holds.
func typed[T any](objs []any) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
