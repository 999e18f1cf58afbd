// Package controller reconciles NVIDIADriver resources: it reads the cluster
// into a snapshot, calls plan.Compute and render.DaemonSet, applies the result
// with server-side apply and writes an honest status.
package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/nodewire"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// Options configure the controller.
type Options struct {
	Namespace    string // where driver DaemonSets live
	ManagerImage string // default k8s-driver-manager image
	HostRoot     string
	// ValidationTimeout overrides how long a new driver pod may take to become
	// Ready before its node is upgrade-failed (0: the policy default, 600s).
	ValidationTimeout time.Duration
	// ValidationPodSelector, when set, must match a Ready pod on the node
	// (e.g. NVIDIA's app=nvidia-operator-validator) before validation passes.
	ValidationPodSelector string
	// ImageCheck is enforce, warn or off (docs/design.md, "Image preflight");
	// empty means enforce.
	ImageCheck string
	// ImageCheckBackoff is the first re-check delay of an image that is
	// missing or could not be checked, doubling up to ImageCheckMaxBackoff
	// (0: 30s and 10m).
	ImageCheckBackoff, ImageCheckMaxBackoff time.Duration
	// Busy, if set, is called as each reconcile of the driver, node-label
	// and upgrade controllers starts (memlimit.Rest.Busy).
	Busy func()
}

// imageGate builds the registry check the options ask for.
func (o Options) imageGate(secrets client.Reader) (*imageGate, error) {
	mode := o.ImageCheck
	if mode == "" {
		mode = ImageCheckEnforce
	}
	if !slices.Contains(ImageCheckModes, mode) {
		return nil, fmt.Errorf("image check mode %q: want one of %v", mode, ImageCheckModes)
	}
	checker := &imagecheck.Checker{MinBackoff: o.ImageCheckBackoff, MaxBackoff: o.ImageCheckMaxBackoff, OnRequest: countRegistryRequest}
	return &imageGate{mode: mode, checker: checker, secrets: secrets, namespace: o.Namespace}, nil
}

// podControllerIndex indexes the cached ControllerRevisions by their
// DaemonSet's UID. Nodes and driver pods have indexes of their own
// (cachedReads).
const podControllerIndex = "nvdriver.revision.controller"

// CacheOptions keeps the cache small at thousands of nodes: nodes keep only
// what the plan and the upgrade logic read (docs/design.md, "Node cache"), and only our
// DaemonSets in the driver namespace are cached. The cache lists and
// watches through an HTTP client of its own, made from cfg, that trims the
// nodes on the wire before they are decoded (nodewire; with cfg in protobuf,
// as ClientConfig sets it); the controller's other reads and its writes see
// whole nodes.
func CacheOptions(cfg *rest.Config, namespace string) (cache.Options, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return cache.Options{}, fmt.Errorf("the cache's HTTP client: %w", err)
	}
	hc.Transport = nodewire.Transport(hc.Transport)
	req, _ := labels.NewRequirement(render.LabelState, selection.Equals, []string{render.StateDriver})
	component, _ := labels.NewRequirement(render.LabelComponent, selection.In, render.DriverComponents)
	byObject := map[client.Object]cache.ByObject{
		&corev1.Node{}: {Transform: trimNode},
		// Cluster-scoped with a namespace field selector, like the pods:
		// the pod predicate and the driver's passes read the store directly
		// (cachedReads); through the namespace-limited cache each read also
		// looked up the kind's REST mapping.
		&appsv1.DaemonSet{}: {
			Field: fields.OneTermEqualSelector("metadata.namespace", namespace),
			Label: labels.NewSelector().Add(*req),
		},
		// The driver DaemonSets' revisions (they carry the pod template's
		// labels): which template hash is current, so a pod on a template
		// that came back (an undo) is in sync. Data dropped: only the hash is read.
		&appsv1.ControllerRevision{}: {
			Namespaces: map[string]cache.Config{namespace: {}},
			Label:      labels.NewSelector().Add(*component),
			Transform:  trimRevision,
		},
		// Driver pods only (the upgrade machine reads their revision and
		// readiness). Cluster-scoped with a namespace field selector, not
		// namespace-limited: only then does the informer expose the store
		// the passes read (cachedReads). The ClusterRole already lists pods
		// everywhere (drain). The cache keeps them as driverPods: read them
		// through cachedReads, never through the cache client.
		&corev1.Pod{}: {
			Field:     fields.OneTermEqualSelector("metadata.namespace", namespace),
			Label:     labels.NewSelector().Add(*component),
			Transform: trimPod,
		},
	}
	maps.Copy(byObject, driverPodObjectsCache(namespace))
	return cache.Options{HTTPClient: hc, DefaultTransform: cache.TransformStripManagedFields(), ByObject: byObject}, nil
}

// ClientConfig sets cfg up as the controller talks to the API server:
// protobuf for built-in kinds (controller-runtime keeps JSON for our CRD)
// and no gzip. At thousands of nodes, decoding node watch events was most
// of the controller's idle CPU; in protobuf the cache also trims them
// before decoding (CacheOptions).
func ClientConfig(cfg *rest.Config) {
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.DisableCompression = true
}

// planLabels are the node labels the plan (and readiness) reads; a node event
// that changes none of them is ignored.
func planLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if isPlanLabel(k) {
			out[k] = v
		}
	}
	return out
}

func isPlanLabel(k string) bool {
	switch k {
	case plan.LabelGPUPresent, plan.LabelDeployDriver, plan.LabelOwner, plan.LabelOSID, plan.LabelOSVersion,
		plan.LabelOSVersionMajor, plan.LabelKernel, plan.LabelUpgradeState:
		return true
	}
	return slices.Contains(plan.NFDGPULabels, k)
}

// isMachineLabel: the upgrade machine reads this label on every node (its
// node facts: the plan's labels, the skip label, the platform).
func isMachineLabel(k string) bool {
	return isPlanLabel(k) || k == upgrade.LabelSkip || k == corev1.LabelOSStable || k == corev1.LabelArchStable
}

// machineLabelsChanged: the two label sets differ in a label the upgrade
// machine reads: one of its own, or one a CR's nodeSelector or canary
// selector names. Other labels are not the machine's business: in the
// benchmark's cluster kube-controller-manager adds the beta os/arch labels
// to every new node, one node at a time over minutes, and each woke a pass
// over every node.
func machineLabelsChanged(c client.Reader, o, n map[string]string) bool {
	if maps.Equal(o, n) {
		return false
	}
	differs := func(k string) bool {
		ov, ok1 := o[k]
		nv, ok2 := n[k]
		return ok1 != ok2 || ov != nv
	}
	var others []string
	for k := range n {
		if differs(k) {
			if isMachineLabel(k) {
				return true
			}
			others = append(others, k)
		}
	}
	for k := range o {
		if _, ok := n[k]; !ok {
			if isMachineLabel(k) {
				return true
			}
			others = append(others, k)
		}
	}
	return someCRSelectsOn(c, func(k string) bool { return slices.Contains(others, k) }, true)
}

// nodeChanged passes node events that matter: create, delete, and updates that
// change a label the plan reads or any label a CR selects on.
func nodeChanged(c client.Client) predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()
			if maps.Equal(o, n) {
				return false // a status heartbeat: most node updates
			}
			if !maps.Equal(planLabels(o), planLabels(n)) {
				return true
			}
			// Another label changed: it matters only if some CR selects on it.
			return someCRSelectsOn(c, func(k string) bool { return o[k] != n[k] }, false)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// labellerNodeChanged drops, for the node labeller, updates that change
// only the upgrade state (and annotations other than the move's) of a node
// that has an owner, before and after:
// the upgrade machine writes it at every step of every node, and the
// labeller reads it only on nodes without an owner (to release them) or
// when a CR selects nodes by it (docs/design.md, "What wakes a pass").
func labellerNodeChanged(c client.Client) predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()
			if o[plan.LabelOwner] == "" || n[plan.LabelOwner] == "" || o[plan.LabelOwner] != n[plan.LabelOwner] ||
				o[plan.LabelUpgradeState] == n[plan.LabelUpgradeState] || !onlyOwnerOrStateChanged(o, n) {
				return true
			}
			// Of an owned node's annotations it reads the move's only: the
			// machine writes its own (the state's start, a step's) with
			// every step, and each woke a pass over every node.
			if e.ObjectOld.GetAnnotations()[upgrade.AnnotationMoveTo] != e.ObjectNew.GetAnnotations()[upgrade.AnnotationMoveTo] {
				return true
			}
			return someCRSelectsOn(c, func(k string) bool { return k == plan.LabelUpgradeState }, false)
		},
	}
}

// someCRSelectsOn: some NVIDIADriver's nodeSelector (or, with canaries,
// its canary selector) names a key that matters (read from the cache,
// uncopied). On a failed read it answers yes: a needless pass is cheaper
// than a missed one.
func someCRSelectsOn(c client.Reader, matters func(key string) bool, canaries bool) bool {
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := c.List(context.Background(), drivers, client.UnsafeDisableDeepCopy); err != nil {
		return true
	}
	for _, d := range drivers.Items {
		keys := slices.Collect(maps.Keys(d.Spec.NodeSelector))
		if up := d.Spec.UpgradePolicy; canaries && up != nil && up.Canary != nil && up.Canary.Selector != nil {
			keys = slices.AppendSeq(keys, maps.Keys(up.Canary.Selector.MatchLabels))
			for _, e := range up.Canary.Selector.MatchExpressions {
				keys = append(keys, e.Key)
			}
		}
		if slices.ContainsFunc(keys, matters) {
			return true
		}
	}
	return false
}

// Setup registers the reconcilers with the manager.
func Setup(mgr ctrl.Manager, opts Options) error {
	if err := registerIndexes(mgr); err != nil {
		return err
	}
	c := mgr.GetClient()

	allDrivers := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		list := &v1alpha1.NVIDIADriverList{}
		if err := c.List(ctx, list); err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, len(list.Items))
		for i := range list.Items {
			reqs[i] = reconcile.Request{NamespacedName: client.ObjectKey{Name: list.Items[i].Name}}
		}
		return reqs
	})
	driverOfDS := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != "NVIDIADriver" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: ref.Name}}}
	})

	reads, err := newCachedReads(context.Background(), mgr.GetCache())
	if err != nil {
		return err
	}
	// One registration on the node informer for the three reconcilers
	// that watch nodes (nodeEvents).
	nodes, err := newNodeEvents(context.Background(), mgr.GetCache(), reads.nodes)
	if err != nil {
		return err
	}
	plans, pacer := &planCache{reads: reads, changes: &nodes.changes}, &statusPacer{}
	images, err := opts.imageGate(mgr.GetAPIReader())
	if err != nil {
		return err
	}
	dr := &DriverReconciler{Client: c, APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(FieldManager), Options: opts, Images: images, plans: plans, pacer: pacer}
	// A CR's change can move nodes to or from others (default fallback,
	// conflicts), so every CR event re-plans all CRs; the plan is in memory.
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("nvidiadriver").
		For(&v1alpha1.NVIDIADriver{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, deletionPredicate()), wakes("nvidiadriver", "NVIDIADriver"))).
		Watches(&v1alpha1.NVIDIADriver{}, allDrivers, builder.WithPredicates(predicate.GenerationChangedPredicate{}, wakes("nvidiadriver", "NVIDIADriver/other"))).
		Watches(&appsv1.DaemonSet{}, daemonSetToDriver(pacer, time.Now), builder.WithPredicates(wakes("nvidiadriver", "DaemonSet"))).
		WatchesRawSource(nodes.source(nodeToDrivers(c), nodeChanged(c), wakes("nvidiadriver", "Node"))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(gate("nvidiadriver", dr, opts.Busy)); err != nil {
		return err
	}

	nodesKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{nodeLabelsKey}
	})
	if err := setupUpgrades(mgr, opts, driverOfDS, pacer, reads, nodes); err != nil {
		return err
	}
	if err := setupDriverPodObjects(mgr, opts.Namespace); err != nil {
		return err
	}
	labeller := &NodeLabeler{Client: c, Namespace: opts.Namespace, plans: plans}
	gated := labellerGate(labeller, opts.Busy)
	hurry := func() { gated.hurry(nodeLabelsKey.NamespacedName) }
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-labels").
		WatchesRawSource(nodes.source(labellerWakes(c, &labeller.moves, hurry), nodeChanged(c), labellerNodeChanged(c), wakes("node-labels", "Node"))).
		Watches(&v1alpha1.NVIDIADriver{}, nodesKey, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletionPredicate()), wakes("node-labels", "NVIDIADriver"))).
		Complete(gated)
}

// labellerWakes queues the labeller's one request for each node event that
// passed its predicates, and tells the move clock of each update first, so
// the pass that takes the request finds it there. An update that changes a
// label some CR selects nodes by (an admin relabelling a node, which may
// move it) hurries the labeller's next pass (gated.hurry).
func labellerWakes(c client.Reader, moves *moveClock, hurry func()) handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(_ context.Context, _ event.CreateEvent, q queue) { q.Add(nodeLabelsKey) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			moves.woke(e.ObjectNew.GetName())
			if o, n := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels(); !maps.Equal(o, n) &&
				someCRSelectsOn(c, func(k string) bool { return o[k] != n[k] }, false) {
				hurry()
			}
			q.Add(nodeLabelsKey)
		},
		DeleteFunc:  func(_ context.Context, _ event.DeleteEvent, q queue) { q.Add(nodeLabelsKey) },
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { q.Add(nodeLabelsKey) },
	}
}

// labellerGate gates the node labeller at its own cost factor (docs/design.md,
// "What wakes a pass").
func labellerGate(l *NodeLabeler, busy func()) *gated {
	g := gate("node-labels", l, busy)
	g.factor = labellerCostFactor
	return g
}

// registerIndexes adds the cache index the reconcilers look objects up by
// through the client: ControllerRevisions by DaemonSet. DaemonSets, nodes
// and driver pods are read through indexes of our own (cachedReads).
func registerIndexes(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &appsv1.ControllerRevision{}, podControllerIndex, func(o client.Object) []string {
		if ref := metav1.GetControllerOfNoCopy(o); ref != nil && ref.Kind == "DaemonSet" {
			return []string{string(ref.UID)}
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

// nodeToDrivers maps node events to the CRs they can affect. A change of
// the upgrade state or the owner label alone (every step of a rollout or a
// move) concerns only the node's old and new owners: re-planning every CR for
// each would cost CRs × nodes per step at thousands of nodes. Any other
// change (selection labels, GPU-ness, a node added or removed) concerns the
// CRs driversTouched names: those whose nodeSelector matches the node before
// or after, its owners, and the default CRs.
func nodeToDrivers(c client.Client) handler.EventHandler {
	touched := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], o, n map[string]string) {
		list := &v1alpha1.NVIDIADriverList{}
		if err := c.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
			return
		}
		for _, name := range driversTouched(list.Items, o, n) {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			touched(ctx, q, nil, e.Object.GetLabels())
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			touched(ctx, q, e.Object.GetLabels(), nil)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			o, n := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()
			if !onlyOwnerOrStateChanged(o, n) {
				touched(ctx, q, o, n)
				return
			}
			for _, owner := range []string{o[plan.LabelOwner], n[plan.LabelOwner]} {
				if owner != "" {
					q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: owner}})
				}
			}
		},
	}
}

// driversTouched names the CRs whose part of the plan a node's change from
// labels o to labels n (nil: created, or deleted) can change: the plan
// gives a node to the one CR whose nodeSelector matches it, else to the
// default, and a CR's pools, conflicts, skipped nodes and warnings are made
// of the nodes it selects. So: every CR that selects the node before or
// after, the CRs its owner label names before and after (a conflicted node
// keeps its owner; a leaving node stays in its old owner's pools), and every
// default CR (the node may fall to it or leave it; its nodeSelector counts
// for nothing). A CR being deleted plans nothing. Every other CR's plan is
// the same (TestDriversTouchedCoversThePlan checks it against
// plan.Compute). When nodes moved between the 20 CRs of the 5,000-node
// benchmark, re-planning all of them for each move kept the node labeller
// waiting behind twenty passes.
func driversTouched(drivers []v1alpha1.NVIDIADriver, o, n map[string]string) []string {
	var out []string
	for i := range drivers {
		d := &drivers[i]
		if d.Spec.Default ||
			(o != nil && plan.Selects(&d.Spec, o)) || (n != nil && plan.Selects(&d.Spec, n)) ||
			d.Name == o[plan.LabelOwner] || d.Name == n[plan.LabelOwner] {
			out = append(out, d.Name)
		}
	}
	return out
}

// onlyOwnerOrStateChanged: the two label sets differ in the owner label or
// the upgrade state label and nowhere else.
func onlyOwnerOrStateChanged(o, n map[string]string) bool {
	for k, v := range n {
		if k != plan.LabelOwner && k != plan.LabelUpgradeState && o[k] != v {
			return false
		}
	}
	for k := range o {
		if _, ok := n[k]; !ok && k != plan.LabelOwner && k != plan.LabelUpgradeState {
			return false
		}
	}
	return true
}

// specApplied passes updates where the driver reconciler's status caught up
// with a new generation.
func specApplied() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*v1alpha1.NVIDIADriver)
		n, ok2 := e.ObjectNew.(*v1alpha1.NVIDIADriver)
		return ok1 && ok2 && o.Status.ObservedGeneration != n.Status.ObservedGeneration && n.Status.ObservedGeneration == n.Generation
	}}
}

// deletionPredicate passes updates that start a deletion (finalizers hold the object).
func deletionPredicate() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// setupUpgrades registers the upgrade machine: it runs per CR, woken by its
// nodes, its driver pods and its DaemonSets.
func setupUpgrades(mgr ctrl.Manager, opts Options, driverOfDS handler.EventHandler, pacer *statusPacer, reads *cachedReads, nodes *nodeEvents) error {
	c := mgr.GetClient()
	pods, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return fmt.Errorf("clientset for pod removal: %w", err)
	}
	// Both the owner and the CR running the node: when a move starts, the
	// owner must see the node leave its budget.
	ownerOfNode := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		owner := o.GetLabels()[plan.LabelOwner]
		if owner != "" {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: owner}})
		}
		if by := upgrade.RunBy(owner, o.GetAnnotations()[upgrade.AnnotationMoveTo]); by != owner {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: by}})
		}
		return reqs
	})
	// A driver pod's and a driver DaemonSet's revision both name their
	// DaemonSet as controller.
	ownerOfPod := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != "DaemonSet" {
			return nil
		}
		ds := &appsv1.DaemonSet{}
		// Read only, once per pod event: no copy of the whole DaemonSet.
		if err := c.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}, ds, client.UnsafeDisableDeepCopy); err != nil {
			return nil
		}
		if dref := metav1.GetControllerOfNoCopy(ds); dref != nil && dref.Kind == "NVIDIADriver" {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: dref.Name}}}
		}
		return nil
	})
	nodeMatters := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			return !maps.Equal(o.Annotations, n.Annotations) || o.Spec.Unschedulable != n.Spec.Unschedulable ||
				nodeReady(o) != nodeReady(n) || machineLabelsChanged(c, o.Labels, n.Labels)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("upgrade").
		// Annotations too (`rollout resume` is one), and the driver
		// reconciler catching up with a spec: the rollout holds its nodes
		// until then (trackRollout) and sets no timer.
		For(&v1alpha1.NVIDIADriver{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, specApplied()), wakes("upgrade", "NVIDIADriver"))).
		WatchesRawSource(nodes.source(ownerOfNode, nodeMatters, wakes("upgrade", "Node"))).
		Watches(&corev1.Pod{}, ownerOfPod, builder.WithPredicates(driverPodMatters(settledPod(reads.daemonSets, reads.nodes)), wakes("upgrade", "Pod"))).
		// Whether a pod is in sync is read from the DaemonSet's newest
		// revision (an undo): a pass that ran while the revision cache lagged
		// the DaemonSet (after an API server restart its watch may come back
		// seconds later) judged against the old one, and nothing else would
		// wake the machine when the revision arrives.
		Watches(&appsv1.ControllerRevision{}, ownerOfPod, builder.WithPredicates(revisionMattersToUpgrade(), wakes("upgrade", "ControllerRevision"))).
		Watches(&appsv1.DaemonSet{}, driverOfDS, builder.WithPredicates(daemonSetMattersToUpgrade(), wakes("upgrade", "DaemonSet"))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(gate("upgrade", &UpgradeReconciler{Client: c, APIReader: mgr.GetAPIReader(), Pods: pods, Recorder: mgr.GetEventRecorder(FieldManager), Options: opts, pacer: pacer, reads: reads}, opts.Busy))
}
