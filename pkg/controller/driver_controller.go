package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// AppliedHashAnnotation records the hash of what we last applied, so an
// unchanged DaemonSet costs no write (NVIDIA uses the same key for the same purpose).
const AppliedHashAnnotation = "nvidia.com/last-applied-hash"

// FieldManager is the server-side apply field owner of everything we write.
const FieldManager = "nvdriver-controller"

// Event reasons.
const (
	EventCreated  = "DaemonSetCreated"
	EventUpdated  = "DaemonSetUpdated"
	EventDeleted  = "DaemonSetDeleted"
	EventConflict = "ConflictingNodeSelector"
	EventDefault  = "ConflictingDefault"
	// EventImageFound: a held pool's image appeared and its rollout goes on.
	EventImageFound = "ImageFound"
)

// DriverReconciler turns one NVIDIADriver into its pool DaemonSets and status.
// It plans the whole cluster from the cache (cheap, in memory) and acts only on
// its own CR, so a slow or broken CR never blocks another.
type DriverReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Options  Options
	// APIReader reads what is not cached (the secretEnv Secret's existence,
	// by name in the driver namespace: never a cluster-wide Secret watch).
	APIReader client.Reader
	// Images checks the registry before a pool is created or given a new
	// image (nil: off).
	Images *imageGate

	plans *planCache
	pacer *statusPacer
	// intact remembers the pools whose live DaemonSet was last found to be
	// what we render, so a pass over an unchanged pool renders nothing.
	intact intactPools
}

// recheckMissing is how often a CR waiting for a missing object is looked at
// again (Secrets are not watched).
const recheckMissing = 30 * time.Second

// Reconcile implements reconcile.Reconciler.
func (r *DriverReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	d := &v1alpha1.NVIDIADriver{}
	if err := r.Client.Get(ctx, req.NamespacedName, d); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	snap, p, err := r.plans.compute(ctx, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}

	if !d.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, d, snap)
	}
	if !controllerutil.ContainsFinalizer(d, v1alpha1.Finalizer) {
		patch := client.MergeFrom(d.DeepCopy())
		controllerutil.AddFinalizer(d, v1alpha1.Finalizer)
		if err := r.Client.Patch(ctx, d, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}

	pd := p.DriverByName(d.Name)
	if pd == nil { // cannot happen for a live CR; be safe
		return ctrl.Result{}, nil
	}

	owned, err := r.ownedDaemonSets(ctx, d)
	if err != nil {
		return ctrl.Result{}, err
	}
	var failure error
	var images *imageVerdict
	// A driver in error keeps its existing DaemonSets (its nodes keep running)
	// but gets no new ones: fail closed for the CRs involved, and only for them.
	if pd.Error != nil && r.Images != nil && r.Images.mode != ImageCheckOff {
		images = &imageVerdict{keep: true} // nothing is applied: nothing to check
	}
	if pd.Error == nil {
		images = r.Images.check(ctx, d, pd.Pools, owned, snap.platformsOf())
		failure = r.applyPools(ctx, d, pd, owned, images)
		if failure == nil {
			failure = r.deleteStale(ctx, d, pd, owned)
		}
	}
	missing := false
	if failure == nil && pd.Error == nil {
		if failure = r.checkSecretEnv(ctx, d); failure != nil {
			missing = apierrors.IsNotFound(errors.Unwrap(failure))
		}
	}
	if failure != nil && !missing {
		logger.Error(failure, "reconcile failed")
	}
	r.eventOnNewError(d, pd)

	st := computeStatus(statusInput{Driver: d, Plan: pd, DaemonSets: owned, Nodes: snap.poolNodesOf(pd, d.Name), Namespace: r.Options.Namespace, Failure: failure, Images: images})
	r.eventOnImages(d, st)
	paced, err := r.writeStatus(ctx, d, st)
	if errors.Is(err, errStatusConflict) {
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	recordState(d.Name, st.State)
	if failure != nil && !missing {
		return ctrl.Result{}, failure // retried with backoff, which writes any counts held back
	}
	after := requeueAfter(missing, images)
	if paced > 0 && (after == 0 || paced < after) {
		after = paced // the counts held back are written then
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// requeueAfter is when to look at a CR again that waits for something no
// watch tells of: a missing secretEnv Secret (valid at admission,
// impossible at runtime: looked at again calmly rather than retried hot),
// or an image that was missing or could not be checked (asked about again
// when its answer goes stale, the checker's backoff). 0: no need.
func requeueAfter(missingSecret bool, images *imageVerdict) time.Duration {
	var after time.Duration
	if missingSecret {
		after = recheckMissing
	}
	if images != nil && !images.next.IsZero() {
		if a := max(time.Until(images.next), time.Second); after == 0 || a < after {
			after = a
		}
	}
	return after
}

// eventOnImages tells of a pool held for a missing image, and of its release.
func (r *DriverReconciler) eventOnImages(d *v1alpha1.NVIDIADriver, st v1alpha1.NVIDIADriverStatus) {
	was := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionImageAvailable)
	now := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionImageAvailable)
	wasMissing := was != nil && was.Reason == imagecheck.ReasonMissing
	switch {
	case now != nil && now.Reason == imagecheck.ReasonMissing && !wasMissing:
		r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, EventImageMissing, "CheckImage", "%s", now.Message)
	case wasMissing && now != nil && now.Reason == imagecheck.ReasonFound:
		r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventImageFound, "CheckImage", "The registry now has the image(s) that were missing; the rollout goes on")
	}
}

// checkSecretEnv: the Secret spec.secretEnv names must exist in the driver
// namespace, or the driver pods cannot start. Metadata only: its data is
// none of our business.
func (r *DriverReconciler) checkSecretEnv(ctx context.Context, d *v1alpha1.NVIDIADriver) error {
	if d.Spec.SecretEnv == "" || r.APIReader == nil {
		return nil
	}
	sec := &metav1.PartialObjectMetadata{}
	sec.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.Options.Namespace, Name: d.Spec.SecretEnv}, sec)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("spec.secretEnv names Secret %s/%s, which does not exist: the driver pods cannot start until it does (kubectl -n %s create secret generic %s --from-literal=KEY=VALUE, or remove spec.secretEnv): %w",
			r.Options.Namespace, d.Spec.SecretEnv, r.Options.Namespace, d.Spec.SecretEnv, err)
	case err != nil:
		return fmt.Errorf("checking Secret %s/%s (spec.secretEnv): %w", r.Options.Namespace, d.Spec.SecretEnv, err)
	}
	return nil
}

// ownedDaemonSets lists the DaemonSets this CR controls, by name.
func (r *DriverReconciler) ownedDaemonSets(ctx context.Context, d *v1alpha1.NVIDIADriver) (map[string]*appsv1.DaemonSet, error) {
	// The cached objects, uncopied, from the informer's store: a pass reads
	// them and replaces (never changes) an entry it applies; one pass per CR
	// on every node event made their deep copies a tenth of the controller's
	// CPU while nodes move.
	dss, err := r.plans.reads.daemonSetsOf(r.Options.Namespace, string(d.UID))
	if err != nil {
		return nil, fmt.Errorf("listing DaemonSets: %w", err)
	}
	out := make(map[string]*appsv1.DaemonSet, len(dss))
	for _, ds := range dss {
		out[ds.Name] = ds
	}
	return out, nil
}

func (r *DriverReconciler) applyPools(ctx context.Context, d *v1alpha1.NVIDIADriver, pd *plan.Driver, owned map[string]*appsv1.DaemonSet, images *imageVerdict) error {
	opts := render.Options{Namespace: r.Options.Namespace, ManagerImage: r.Options.ManagerImage, HostRoot: r.Options.HostRoot}
	for _, pool := range pd.Pools {
		if images.isHeld(pool.DaemonSet) {
			// The live DaemonSet (if any) keeps its template, so its nodes keep
			// their running driver and the upgrade machine starts none of them.
			continue
		}
		cur := owned[pool.DaemonSet]
		renderKey := poolRenderKey(d, pool)
		if r.intact.still(pool.DaemonSet, renderKey, cur) {
			continue // the same input and the same live object as when last found intact
		}
		ds := render.DaemonSet(d, pool, opts)
		hash := hashObject(ds)
		if ds.Annotations == nil {
			ds.Annotations = map[string]string{}
		}
		ds.Annotations[AppliedHashAnnotation] = hash
		obj, err := applyObject(ds)
		if err != nil {
			return err
		}
		repair := false
		if cur != nil && cur.Annotations[AppliedHashAnnotation] == hash {
			live, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cur)
			if err != nil {
				return err
			}
			if !drifted(obj, &unstructured.Unstructured{Object: live}) {
				r.intact.found(pool.DaemonSet, renderKey, cur)
				continue // unchanged and intact: no write
			}
			repair = true
		}
		if cur == nil {
			// Not ours by index; it may exist under another owner. Never take it over.
			existing := &appsv1.DaemonSet{}
			err := r.Client.Get(ctx, types.NamespacedName{Namespace: ds.Namespace, Name: ds.Name}, existing)
			if err == nil && !metav1.IsControlledBy(existing, d) {
				return fmt.Errorf("DaemonSet %s/%s exists and is not owned by NVIDIADriver %q: delete or rename it", ds.Namespace, ds.Name, d.Name)
			}
		}
		waited := excludeFromCost(ctx)
		err = r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldManager), client.ForceOwnership)
		waited()
		if err != nil {
			return fmt.Errorf("applying DaemonSet %s: %w", ds.Name, err)
		}
		// Keep the server's answer: its generation and status say the new
		// template is not rolled out yet.
		applied := &appsv1.DaemonSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, applied); err != nil {
			return err
		}
		owned[pool.DaemonSet] = applied
		switch {
		case cur == nil:
			r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventCreated, "Create", "Created DaemonSet %s/%s for %s (%d node(s), image %s)", ds.Namespace, ds.Name, poolName(pool), len(pool.Nodes), pool.Image)
		case repair:
			r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, EventUpdated, "Repair", "Restored DaemonSet %s/%s for %s: it was edited by hand (the NVIDIADriver is its source; edit the NVIDIADriver instead)", ds.Namespace, ds.Name, poolName(pool))
		default:
			r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventUpdated, "Update", "Updated DaemonSet %s/%s for %s (image %s)", ds.Namespace, ds.Name, poolName(pool), pool.Image)
		}
	}
	return nil
}

// deleteStale removes this CR's DaemonSets whose pool no longer exists.
func (r *DriverReconciler) deleteStale(ctx context.Context, d *v1alpha1.NVIDIADriver, pd *plan.Driver, owned map[string]*appsv1.DaemonSet) error {
	want := map[string]bool{}
	for _, pool := range pd.Pools {
		want[pool.DaemonSet] = true
	}
	names := make([]string, 0, len(owned))
	for name := range owned {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ds := owned[name]
		if want[name] || !metav1.IsControlledBy(ds, d) || !ds.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Client.Delete(ctx, ds, client.Preconditions{UID: &ds.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting stale DaemonSet %s: %w", name, err)
		}
		delete(owned, name)
		r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventDeleted, "Delete", "Deleted DaemonSet %s/%s: its pool has no node any more", ds.Namespace, name)
	}
	return nil
}

// finalize releases a deleted CR: the plan no longer gives it nodes, the node
// labeller moves its owner labels away, and once no node carries its owner
// label the finalizer goes and garbage collection removes the DaemonSets.
func (r *DriverReconciler) finalize(ctx context.Context, d *v1alpha1.NVIDIADriver, snap *snapshot) error {
	if !controllerutil.ContainsFinalizer(d, v1alpha1.Finalizer) {
		return nil
	}
	for _, n := range snap.nodes {
		if n.Labels[plan.LabelOwner] == d.Name {
			return nil // the node labeller releases it; its label change requeues us
		}
	}
	patch := client.MergeFrom(d.DeepCopy())
	controllerutil.RemoveFinalizer(d, v1alpha1.Finalizer)
	if err := r.Client.Patch(ctx, d, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	forgetState(d.Name)
	r.pacer.forget(d.UID)
	return nil
}

func (r *DriverReconciler) eventOnNewError(d *v1alpha1.NVIDIADriver, pd *plan.Driver) {
	if pd.Error == nil {
		return
	}
	for _, c := range d.Status.Conditions {
		if c.Type == CondError && c.Status == metav1.ConditionTrue && c.Reason == pd.Error.Reason && c.Message == pd.Error.Message {
			return // already reported
		}
	}
	reason := EventConflict
	if pd.Error.Reason == plan.ReasonConflictingDefault {
		reason = EventDefault
	}
	r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", pd.Error.Message)
}

// writeStatus writes the status when it changed; a change of counts only
// waits its turn (statusPacer), and paced says how long.
func (r *DriverReconciler) writeStatus(ctx context.Context, d *v1alpha1.NVIDIADriver, st v1alpha1.NVIDIADriverStatus) (paced time.Duration, err error) {
	if equality.Semantic.DeepEqual(d.Status, st) {
		return 0, nil
	}
	now := time.Now()
	if wait := r.pacer.holdBack(d.UID, writerDriver, d.Status, st, now); wait > 0 {
		return wait, nil
	}
	// With the resourceVersion as a precondition: the upgrade reconciler
	// writes status.rollout and its condition, and a patch from a stale copy
	// would put back the conditions list it had.
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	d.Status = st
	waited := excludeFromCost(ctx)
	err = r.Client.Status().Patch(ctx, d, patch)
	waited()
	if apierrors.IsConflict(err) {
		statusWrites.WithLabelValues(writerDriver, "conflict").Inc()
		return 0, errStatusConflict
	} else if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("writing status: %w", err)
	}
	r.pacer.written(d.UID, writerDriver, now)
	return 0, nil
}

func poolName(p plan.Pool) string {
	if p.Kernel != "" {
		return p.OSTag + "/" + p.Kernel
	}
	return p.OSTag
}

// hashObject hashes the rendered object (before the hash annotation is added).
func hashObject(obj any) string {
	data, _ := json.Marshal(obj)
	h := fnv.New32a()
	_, _ = h.Write(data)
	return fmt.Sprint(h.Sum32())
}

// applyObject turns a typed object into the body of a server-side apply: no
// status and no zero-valued metadata, so we own only the fields we set.
func applyObject(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	if spec, ok := m["spec"].(map[string]any); ok {
		if tpl, ok := spec["template"].(map[string]any); ok {
			if md, ok := tpl["metadata"].(map[string]any); ok {
				delete(md, "creationTimestamp")
			}
		}
	}
	return &unstructured.Unstructured{Object: m}, nil
}
