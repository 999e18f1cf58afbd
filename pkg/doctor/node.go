package doctor

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// Who cordoned a node, as status --nodes shows it.
const (
	CordonedByNVDriver = "nvdriver"
	CordonedByAdmin    = "admin"
)

// CordonedBy says who holds a cordoned node: the upgrade machine (in flight,
// or failed, which stays cordoned) or an admin (cordoned before the upgrade
// started, or with no upgrade running); "" when it is schedulable.
func CordonedBy(n *corev1.Node) string {
	if !n.Spec.Unschedulable {
		return ""
	}
	st := n.Labels[plan.LabelUpgradeState]
	if n.Annotations[upgrade.AnnotationInitialUnsched] == "true" || !(upgrade.InProgress(st) || st == upgrade.StateFailed) {
		return CordonedByAdmin
	}
	return CordonedByNVDriver
}

// InState is how long the node has been in its upgrade state (0 when not known).
func InState(n *corev1.Node, now time.Time) time.Duration {
	sec, err := strconv.ParseInt(n.Annotations[upgrade.AnnotationStateSince], 10, 64)
	if err != nil {
		return 0
	}
	return now.Sub(time.Unix(sec, 0)).Truncate(time.Second)
}

// NodeWaiting says what a node of d waits for, and the command that moves
// it on ("" when it waits for nothing). It reads only the node, its CR and
// its driver pod (nil: none), so status can say it for every node.
func NodeWaiting(n *corev1.Node, d *v1alpha1.NVIDIADriver, pod *corev1.Pod) (why, fix string) {
	st := n.Labels[plan.LabelUpgradeState]
	name := "NAME"
	if d != nil {
		name = d.Name
	}
	var r *v1alpha1.RolloutStatus
	if d != nil {
		r = d.Status.Rollout
	}
	switch st {
	case upgrade.StateFailed:
		why = "upgrade failed"
		if reason := n.Annotations[upgrade.AnnotationFailure]; reason != "" {
			why += ": " + reason
		}
		return why, fmt.Sprintf("kubectl label node %s %s=upgrade-required --overwrite (once fixed); or kubectl nvdriver rollout undo %s", n.Name, plan.LabelUpgradeState, name)
	case upgrade.StateRequired:
		if n.Annotations[upgrade.AnnotationMoveTo] != "" {
			return "moving: waiting for a slot in the upgrade budget", "kubectl nvdriver status " + name
		}
		if r != nil {
			switch r.Phase {
			case v1alpha1.RolloutHalted:
				return "rollout halted: " + r.Message, "kubectl nvdriver rollout undo " + name + "; or kubectl nvdriver rollout resume " + name
			case v1alpha1.RolloutPaused:
				return "rollout paused", "kubectl nvdriver rollout resume " + name
			case v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking, v1alpha1.RolloutCanary:
				if !slices.Contains(r.CanaryNodes, n.Name) {
					return "waiting for the canary: " + r.Message, "kubectl nvdriver rollout resume " + name
				}
			}
		}
		if d != nil && d.Spec.UpgradePolicy != nil && !d.Spec.UpgradePolicy.AutoUpgrade && n.Annotations[upgrade.AnnotationRequested] != "true" {
			return "autoUpgrade is false: waiting to be requested", fmt.Sprintf("kubectl nvdriver upgrade %s --nodes %s", name, n.Name)
		}
		p := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
		if d != nil {
			p = upgrade.PolicyFor(&d.Spec)
		}
		return fmt.Sprintf("waiting for a slot (maxParallelUpgrades %d, maxUnavailable %s)", p.MaxParallelUpgrades, p.MaxUnavailable.String()), "kubectl nvdriver status " + name + " --nodes"
	case upgrade.StateCordon:
		return "being cordoned", ""
	case upgrade.StateWaitForJobs:
		sel := ""
		if d != nil && d.Spec.UpgradePolicy != nil && d.Spec.UpgradePolicy.WaitForCompletion != nil {
			sel = d.Spec.UpgradePolicy.WaitForCompletion.PodSelector
		}
		return fmt.Sprintf("waiting for the pods matching waitForCompletion.podSelector %q to finish", sel),
			fmt.Sprintf("kubectl get pods -A -l %q --field-selector spec.nodeName=%s", sel, n.Name)
	case upgrade.StatePodDeletion, upgrade.StateDrain:
		return "evicting GPU pods", fmt.Sprintf("kubectl get pods -A -o wide --field-selector spec.nodeName=%s", n.Name)
	case upgrade.StatePodRestart:
		if n.Annotations[upgrade.AnnotationRestartOnly] == "true" {
			return "restart-only: replacing the driver pod (GPU pods stay)", ""
		}
		return "replacing the driver pod", ""
	case upgrade.StateValidation:
		if pod != nil && !podReady(pod) {
			return fmt.Sprintf("waiting for the new driver pod %s to become Ready", pod.Name), fmt.Sprintf("kubectl -n %s describe pod %s", pod.Namespace, pod.Name)
		}
		return "validating the new driver", ""
	case upgrade.StateUncordon:
		return "being uncordoned", ""
	}
	if pod == nil && n.Labels[plan.LabelOwner] != "" {
		return "no driver pod on the node yet", "kubectl nvdriver doctor " + name
	}
	return "", ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodImage is the driver container's image of a driver pod.
func PodImage(p *corev1.Pod) string {
	if p == nil || len(p.Spec.Containers) == 0 {
		return ""
	}
	return p.Spec.Containers[0].Image
}

// ShortAge prints a duration as kubectl does for ages (3d4h, 5m, 12s).
func ShortAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// NodeInputs are what explaining one node reads beyond the snapshot: the
// pods on it and the PodDisruptionBudgets of their namespaces.
type NodeInputs struct {
	Pods []corev1.Pod
	PDBs []policyv1.PodDisruptionBudget
	// PDBsForbidden holds the API's answer when they may not be listed.
	PDBsForbidden string
}

// ExplainNode is `doctor node/NAME`: one node end to end. Which NVIDIADriver
// selects it and why not, its pool and driver pod, its upgrade state and for
// how long, what it waits for, which pod blocks it and why, and the command
// that unblocks it. Findings are errors when the node is stuck for good
// (failed, a pod the policy may not remove, a budget allowing no eviction).
func ExplainNode(s *Snapshot, name string, in NodeInputs) Report {
	r := Report{Findings: []Finding{}, Summary: map[string]int{Error: 0, Warning: 0, Info: 0}}
	add := func(f Finding) {
		f.Check = "node"
		if f.Objects == nil {
			f.Objects = []string{"node/" + name}
		}
		r.Findings = append(r.Findings, f)
		r.Summary[f.Severity]++
	}
	var n *corev1.Node
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			n = &s.Nodes[i]
		}
	}
	if n == nil {
		add(Finding{Severity: Error, Message: "node " + name + " not found", Fix: "kubectl get nodes"})
		return r
	}
	owner := n.Labels[plan.LabelOwner]
	p := s.Plan()
	var selecting []string
	var pool *plan.Pool
	for i := range p.Drivers {
		pd := &p.Drivers[i]
		for j := range pd.Pools {
			if slices.Contains(pd.Pools[j].Nodes, name) {
				selecting = append(selecting, pd.Name)
				pool = &pd.Pools[j]
			}
		}
		for _, sk := range pd.Skipped {
			if sk.Node == name {
				add(Finding{Severity: Warning, Message: fmt.Sprintf("%s selects %s but skips it: %s", pd.Name, name, sk.Reason), Fix: "kubectl get node " + name + " --show-labels"})
			}
		}
	}
	if owner == "" && len(selecting) == 0 {
		add(Finding{Severity: Info, Message: fmt.Sprintf("no NVIDIADriver runs a driver on %s (none selects it, or it is not a GPU node)", name),
			Fix: "kubectl nvdriver preview; kubectl nvdriver assign NAME --nodes " + name + " --version VERSION"})
		return r
	}
	var d *v1alpha1.NVIDIADriver
	for i := range s.Drivers {
		if s.Drivers[i].Name == owner {
			d = &s.Drivers[i]
		}
	}
	var pod *corev1.Pod
	for i := range s.DriverPods {
		if p := &s.DriverPods[i]; p.Spec.NodeName == name && (pod == nil || pod.DeletionTimestamp != nil) {
			pod = p
		}
	}
	st := n.Labels[plan.LabelUpgradeState]
	msg := fmt.Sprintf("%s: NVIDIADriver %s", name, dashIfEmpty(owner))
	if pool != nil {
		msg += fmt.Sprintf(", pool %s (%s)", pool.DaemonSet, pool.Image)
	}
	if pod != nil {
		msg += fmt.Sprintf("; driver pod %s runs %s, %s old", pod.Name, PodImage(pod), ShortAge(s.Now.Sub(pod.CreationTimestamp.Time)))
	} else {
		msg += "; no driver pod"
	}
	msg += "; upgrade state " + dashIfEmpty(st)
	if since := InState(n, s.Now); since > 0 {
		msg += " for " + ShortAge(since)
	}
	if by := CordonedBy(n); by != "" {
		msg += "; cordoned by " + by
	}
	add(Finding{Severity: Info, Message: msg, Objects: []string{"node/" + name, "nvidiadriver/" + owner}})
	if len(selecting) > 0 && owner != "" && !slices.Contains(selecting, owner) {
		add(Finding{Severity: Info, Message: fmt.Sprintf("%s is moving from %s to %s", name, owner, selecting[0]), Fix: "kubectl nvdriver status " + selecting[0] + " --nodes"})
	}

	why, fix := NodeWaiting(n, d, pod)
	if why != "" {
		sev := Info
		if st == upgrade.StateFailed || strings.HasPrefix(why, "rollout halted") {
			sev = Error
		} else if upgrade.InProgress(st) || st == upgrade.StateRequired {
			sev = Warning
		}
		add(Finding{Severity: sev, Message: name + " waits: " + why, Fix: fix})
	}
	if st == upgrade.StatePodDeletion || st == upgrade.StateDrain || st == upgrade.StateWaitForJobs || st == upgrade.StateFailed {
		for _, f := range blockingPods(name, d, st, in) {
			add(f)
		}
	}
	return r
}

// blockingPods names the pods on the node that keep it in its state, each
// with why and the command to look at (or past) it.
func blockingPods(node string, d *v1alpha1.NVIDIADriver, state string, in NodeInputs) []Finding {
	p := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
	if d != nil {
		p = upgrade.PolicyFor(&d.Spec)
	}
	var out []Finding
	for i := range in.Pods {
		pod := &in.Pods[i]
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		obj := []string{"node/" + node, "pod/" + key}
		if state == upgrade.StateWaitForJobs {
			if sel, err := labels.Parse(p.WaitForJobsSelector); err == nil && p.WaitForJobsSelector != "" && sel.Matches(labels.Set(pod.Labels)) {
				out = append(out, Finding{Severity: Info, Objects: obj, Message: fmt.Sprintf("%s: job %s is still running (waitForCompletion.podSelector %q)", node, key, p.WaitForJobsSelector),
					Fix: fmt.Sprintf("kubectl -n %s get pod %s", pod.Namespace, pod.Name)})
			}
			continue
		}
		if !upgrade.UsesGPU(pod) {
			continue
		}
		if why := upgrade.Refusal(pod, p.PodDeletion, "podDeletion"); why != "" {
			out = append(out, Finding{Severity: Error, Objects: obj, Message: fmt.Sprintf("%s: GPU pod %s may not be removed: %s", node, key, why),
				Fix: fmt.Sprintf("kubectl -n %s delete pod %s (if it may go); or change spec.upgradePolicy.podDeletion", pod.Namespace, pod.Name)})
			continue
		}
		for _, pdb := range BlockingPDBs(pod, in.PDBs) {
			out = append(out, Finding{Severity: Error, Objects: append(obj, "poddisruptionbudget/"+pdb.Namespace+"/"+pdb.Name),
				Message: fmt.Sprintf("%s: GPU pod %s cannot be evicted: PodDisruptionBudget %s/%s allows no disruption (%d healthy, %d desired)",
					node, key, pdb.Namespace, pdb.Name, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy),
				Fix: fmt.Sprintf("kubectl -n %s get pdb %s -o wide", pdb.Namespace, pdb.Name)})
		}
	}
	if in.PDBsForbidden != "" && state != upgrade.StateWaitForJobs {
		out = append(out, Finding{Severity: Info, Message: "cannot check PodDisruptionBudgets (" + in.PDBsForbidden + ")"})
	}
	return out
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// BlockingPDBs are the PodDisruptionBudgets that select the pod and allow no
// disruption now: what an eviction of it would be refused for.
func BlockingPDBs(pod *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) []policyv1.PodDisruptionBudget {
	var out []policyv1.PodDisruptionBudget
	for _, pdb := range pdbs {
		if pdb.Namespace != pod.Namespace || pdb.Status.DisruptionsAllowed > 0 {
			continue
		}
		if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err == nil && sel.Matches(labels.Set(pod.Labels)) {
			out = append(out, pdb)
		}
	}
	return out
}
