package controller

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// What the upgrade machine reads of pods: the driver pods of a CR's nodes
// (from the cache) and, per node when a step needs them, the pods on it.

// driverPods maps node name -> the driver pod there, as the machine sees it
// and as the object to delete: this CR's pods, and on nodes moving in from
// another CR that CR's pod (never in sync: it is the driver being replaced).
func (r *UpgradeReconciler) driverPods(ctx context.Context, d *v1alpha1.NVIDIADriver, nodes []*corev1.Node, facts []*nodeFact) (map[string]*upgrade.DriverPod, map[string]*driverPod, error) {
	movingIn := map[string]bool{}
	for i := range nodes {
		if facts[i].plan.Owner != d.Name {
			movingIn[nodes[i].Name] = true
		}
	}
	// The cache's own objects (read only): this CR's DaemonSets, or every
	// driver DaemonSet when nodes move in from other CRs.
	var dss []*appsv1.DaemonSet
	var err error
	if len(movingIn) == 0 {
		dss, err = r.reads.daemonSetsOf(r.Options.Namespace, string(d.UID))
	} else {
		dss = r.reads.daemonSetsIn(r.Options.Namespace)
	}
	if err != nil {
		return nil, nil, err
	}
	// What the pods are judged against, per DaemonSet: one lookup per pod.
	type dsInfo struct {
		ours    bool   // this CR's (else another CR's, for nodes moving in)
		gen     string // its template generation
		digest  string // its config digest
		hash    string // its newest revision's hash ("" while pending)
		pending bool   // its template not yet observed
	}
	info := map[types.UID]*dsInfo{}
	for _, ds := range dss {
		ref := metav1.GetControllerOfNoCopy(ds)
		switch {
		case ref != nil && ref.UID == d.UID:
			in := &dsInfo{ours: true, gen: ds.Annotations[templateGenerationAnnotation],
				digest: render.PodConfigDigest(&ds.Spec.Template.Spec), pending: ds.Status.ObservedGeneration < ds.Generation}
			if !in.pending {
				h, err := r.currentHash(ctx, ds.UID)
				if err != nil {
					return nil, nil, err
				}
				in.hash = h
			}
			info[ds.UID] = in
		case ref != nil && ref.Kind == "NVIDIADriver":
			info[ds.UID] = &dsInfo{}
		}
	}
	// Only this CR's pods (by DaemonSet) and the pods on nodes moving in (by
	// node), through the store's indexes: listing every driver pod of the
	// cluster for each CR's pass made a rollout quadratic in nodes. The
	// objects are the cache's own (read, never modified).
	var items []*driverPod
	for uid, in := range info {
		if in.ours {
			pods, err := r.reads.podsBy(idxPodController, string(uid))
			if err != nil {
				return nil, nil, err
			}
			items = append(items, pods...)
		}
	}
	for node := range movingIn {
		pods, err := r.reads.podsBy(idxPodNode, node)
		if err != nil {
			return nil, nil, err
		}
		items = append(items, pods...)
	}
	out := make(map[string]*upgrade.DriverPod, len(items))
	objs := make(map[string]*driverPod, len(items))
	for _, p := range items {
		ref := metav1.GetControllerOfNoCopy(p)
		if ref == nil || ref.Kind != "DaemonSet" || p.NodeName == "" {
			continue
		}
		ds := info[ref.UID]
		if ds == nil || (!ds.ours && !movingIn[p.NodeName]) {
			continue
		}
		// In sync: made from the current template generation, or from an
		// earlier one identical to it (the same revision hash, as the
		// DaemonSet controller judges it): an undo does not restart pods
		// that never left the template it returns to.
		inSync := fromTemplateGeneration(p.Labels, ds.gen) || (ds.gen != "" && ds.hash != "" && p.Labels[appsv1.ControllerRevisionHashLabelKey] == ds.hash)
		// Out of date but with the same config digest: a restart-only change.
		restartOnly := !inSync && p.Digest != "" && p.Digest == ds.digest
		dp := &upgrade.DriverPod{Name: p.Name, InSync: inSync, RestartOnly: restartOnly,
			Ready: p.Ready, Deleting: p.DeletionTimestamp != nil, TemplatePending: ds.pending, Restarts: p.Restarts}
		// Prefer the live pod over one being deleted.
		if cur, ok := out[p.NodeName]; !ok || (cur.Deleting && !dp.Deleting) {
			out[p.NodeName] = dp
			objs[p.NodeName] = p
		}
	}
	return out, objs, nil
}

// currentHash is the template hash of a DaemonSet's newest revision ("" when
// the DaemonSet controller has made none yet), from the cache.
func (r *UpgradeReconciler) currentHash(ctx context.Context, ds types.UID) (string, error) {
	list := &appsv1.ControllerRevisionList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.Options.Namespace), client.MatchingFields{podControllerIndex: string(ds)}, client.UnsafeDisableDeepCopy); err != nil {
		return "", err
	}
	var newest *appsv1.ControllerRevision
	for i := range list.Items {
		if newest == nil || list.Items[i].Revision > newest.Revision {
			newest = &list.Items[i]
		}
	}
	if newest == nil {
		return "", nil
	}
	return newest.Labels[appsv1.ControllerRevisionHashLabelKey], nil
}

func (r *UpgradeReconciler) podsOnNode(ctx context.Context, node string) ([]corev1.Pod, error) {
	list := &corev1.PodList{}
	if err := r.APIReader.List(ctx, list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return nil, fmt.Errorf("listing pods on %s: %w", node, err)
	}
	return list.Items, nil
}

// gpuPods are the running or pending pods that request GPUs or MIG slices.
func gpuPods(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if usesGPU(&p) {
			out = append(out, p)
		}
	}
	return out
}

func usesGPU(p *corev1.Pod) bool { return upgrade.UsesGPU(p) }

func countMatching(pods []corev1.Pod, selector string) int {
	sel, err := labels.Parse(selector)
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range pods {
		if (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending) && sel.Matches(labels.Set(p.Labels)) {
			n++
		}
	}
	return n
}

// anyReadyMatching: some pod matching the selector is Ready (the selector was
// validated at start-up).
func anyReadyMatching(pods []corev1.Pod, selector string) bool {
	sel, err := labels.Parse(selector)
	if err != nil {
		return false
	}
	for i := range pods {
		if sel.Matches(labels.Set(pods[i].Labels)) && pods[i].DeletionTimestamp == nil && podIsReady(&pods[i]) {
			return true
		}
	}
	return false
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true // unknown: do not count it against the budget
}

// fromTemplateGeneration: the pod was made from its DaemonSet's template
// generation gen (the deprecated.daemonset.template.generation annotation;
// "" when unknown).
func fromTemplateGeneration(podLabels map[string]string, gen string) bool {
	return gen != "" && podLabels[podTemplateGenerationLabel] == gen
}

// stepPods are the pods a node's step listed on it, and of those the ones
// it may evict. A step carried out without them (nil) listed none.
type stepPods struct {
	onNode, evictable []corev1.Pod
}

// observePods lists the pods on the node of in and fills what its state's
// decision needs: validators, GPU pods and what may remove them, job pods.
func (r *UpgradeReconciler) observePods(ctx context.Context, in *upgrade.Node, policy upgrade.Policy) (*stepPods, error) {
	onNode, err := r.podsOnNode(ctx, in.Name)
	if err != nil {
		return nil, err
	}
	sp := &stepPods{onNode: onNode}
	if in.State == upgrade.StateValidation {
		in.ValidatorsPending = !anyReadyMatching(onNode, r.Options.ValidationPodSelector)
		return sp, nil
	}
	targets := stepTargets(onNode, in.State, policy.Drain)
	in.GPUPods = len(targets)
	if (in.State == upgrade.StatePodDeletion || in.State == upgrade.StateDrain) && len(targets) > 0 {
		rm, err := r.plannedRemoval(ctx, in.Name, in.State, policy, targets)
		if err != nil {
			return nil, err
		}
		in.Refused = rm.refused
		sp.evictable = rm.evict
	}
	if in.State == upgrade.StateDrain {
		// The driver never restarts under a GPU pod: one the drain's
		// selector leaves is refused too (else the node would go back
		// and forth between pod deletion and the drain).
		unselected := unselectedGPUPods(onNode, targets)
		in.Refused = append(in.Refused, unselected...)
		in.GPUPods += len(unselected)
	}
	if policy.WaitForJobsSelector != "" {
		in.JobPods = countMatching(onNode, policy.WaitForJobsSelector)
	}
	if v, ok := r.refusals.Load(in.Name); ok {
		in.EvictionRefused = v.(string)
	}
	return sp, nil
}
