package controller

import (
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/kubectl/pkg/drain"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// The two pod-removing steps of an upgrade choose their pods with the code
// kubectl drain runs (k8s.io/kubectl/pkg/drain): GPU-pod deletion removes
// the GPU pods, the drain step every pod matching its selector, DaemonSet
// and mirror pods never, and each only as far as its force and
// deleteEmptyDir allow. Pods are evicted one call each, without the
// helper's wait: the machine's step timeout (an annotation on the node)
// replaces that wait, so one slow node never holds a CR's whole pass.
// See docs/design.md, "Removing pods".

// removal is what a step found on a node: the pods to evict, and the pods it
// must remove but may not (as "namespace/name (why)").
type removal struct {
	evict   []corev1.Pod
	refused []string
}

func (r *UpgradeReconciler) drainHelper(ctx context.Context, rm upgrade.Removal, gpuOnly bool) *drain.Helper {
	h := &drain.Helper{
		Ctx: ctx, Client: r.Pods, Out: io.Discard, ErrOut: io.Discard,
		IgnoreAllDaemonSets: true, GracePeriodSeconds: -1,
		Force: rm.Force, DeleteEmptyDirData: rm.DeleteEmptyDir, PodSelector: rm.PodSelector,
	}
	if gpuOnly {
		h.AdditionalFilters = []drain.PodFilter{func(p corev1.Pod) drain.PodDeleteStatus {
			if usesGPU(&p) {
				return drain.MakePodDeleteStatusOkay()
			}
			return drain.MakePodDeleteStatusSkip()
		}}
	}
	return h
}

// stepTargets are the pods a step must see gone before the driver restarts:
// the GPU pods for pod deletion; for the drain, every running pod matching
// its selector that no DaemonSet owns and that is no mirror pod.
func stepTargets(pods []corev1.Pod, state string, rm upgrade.Removal) []corev1.Pod {
	if state != upgrade.StateDrain {
		return gpuPods(pods)
	}
	sel, err := labels.Parse(rm.PodSelector)
	if err != nil {
		sel = labels.Nothing() // admission validates it; an unparsable one drains nothing
	}
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" {
			continue
		}
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		out = append(out, p)
	}
	return out
}

// plannedRemoval asks the drain helper which of the step's targets it may
// remove; a target it leaves out is refused, with the policy field to change.
func (r *UpgradeReconciler) plannedRemoval(ctx context.Context, node, state string, policy upgrade.Policy, targets []corev1.Pod) (removal, error) {
	rm, field := policy.PodDeletion, "podDeletion"
	if state == upgrade.StateDrain {
		rm, field = policy.Drain, "drain"
	}
	list, errs := r.drainHelper(ctx, rm, state != upgrade.StateDrain).GetPodsForDeletion(node)
	if list == nil {
		return removal{}, fmt.Errorf("listing pods to remove from %s: %w", node, errors.Join(errs...))
	}
	var out removal
	allowed := map[string]bool{}
	for _, p := range list.Pods() {
		allowed[p.Namespace+"/"+p.Name] = true
		out.evict = append(out.evict, p)
	}
	for _, p := range targets {
		if key := p.Namespace + "/" + p.Name; !allowed[key] && p.DeletionTimestamp == nil {
			out.refused = append(out.refused, fmt.Sprintf("%s (%s)", key, refusal(&p, rm, field)))
		}
	}
	return out, nil
}

// refusal says why the helper kept a pod, as the field that would allow it.
func refusal(p *corev1.Pod, rm upgrade.Removal, field string) string {
	if why := upgrade.Refusal(p, rm, field); why != "" {
		return why
	}
	return "refused by the drain rules"
}

// evictPods evicts through the Eviction API, as kubectl drain does; a
// PodDisruptionBudget refusal (429) is retried on the next pass, and the
// last one is kept for the node's timeout to name.
func (r *UpgradeReconciler) evictPods(ctx context.Context, node string, pods []corev1.Pod) error {
	h := r.drainHelper(ctx, upgrade.Removal{}, false)
	r.refusals.Delete(node)
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if err := h.EvictPod(p, policyv1.SchemeGroupVersion); err != nil {
			if apierrors.IsTooManyRequests(err) {
				r.refusals.Store(node, evictionRefusal(&p, err))
				continue
			}
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// evictionRefusal is the API's refusal of one eviction in its own words:
// for a PodDisruptionBudget, kube-apiserver names the budget in a cause
// ("The disruption budget job-pdb needs 1 healthy pods and has 1 currently").
func evictionRefusal(p *corev1.Pod, err error) string {
	msg := err.Error()
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if d := status.Status().Details; d != nil {
			for _, c := range d.Causes {
				if c.Type == policyv1.DisruptionBudgetCause {
					msg = c.Message + " (PodDisruptionBudget in namespace " + p.Namespace + ")"
				}
			}
		}
	}
	return fmt.Sprintf("eviction of %s/%s refused: %s", p.Namespace, p.Name, msg)
}

// unselectedGPUPods are the GPU pods on the node the drain's targets leave
// out, as refusals naming the field to change.
func unselectedGPUPods(onNode, targets []corev1.Pod) []string {
	selected := map[string]bool{}
	for _, p := range targets {
		selected[p.Namespace+"/"+p.Name] = true
	}
	var out []string
	for _, p := range gpuPods(onNode) {
		if key := p.Namespace + "/" + p.Name; !selected[key] && p.DeletionTimestamp == nil {
			out = append(out, key+" (a GPU pod spec.upgradePolicy.drain.podSelector does not select, and the driver cannot restart under it: widen the selector or remove the pod)")
		}
	}
	return out
}
