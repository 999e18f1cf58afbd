package doctor

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// The checks that read nodes, driver DaemonSets and their pods.

func checkNFD(s *Snapshot, _ *plan.Plan) []Finding {
	var noNFD, noOS []string
	for _, n := range s.Nodes {
		q, hasGPURes := n.Status.Capacity["nvidia.com/gpu"]
		hasGPURes = hasGPURes && !q.IsZero() // a CPU node may advertise "0"
		gpu := plan.IsGPUNode(n.Labels)
		if hasGPURes && !gpu {
			noNFD = append(noNFD, n.Name)
			continue
		}
		if gpu {
			if _, _, ok := plan.OSTag(n.Labels); !ok {
				noOS = append(noOS, n.Name)
			}
		}
	}
	var out []Finding
	if len(noNFD) > 0 {
		out = append(out, Finding{Severity: Warning,
			Message: fmt.Sprintf("%d node(s) advertise nvidia.com/gpu but carry no NFD NVIDIA PCI label nor nvidia.com/gpu.present=true: no driver is planned for them: %s; run node-feature-discovery on them, or label them", len(noNFD), strings.Join(limit(noNFD, 10), ", ")),
			Objects: nodeObjs(noNFD), Fix: "kubectl label node " + strings.Join(first(noNFD, 10), " ") + " nvidia.com/gpu.present=true"})
	}
	if len(noOS) > 0 {
		out = append(out, Finding{Severity: Warning,
			Message: fmt.Sprintf("%d GPU node(s) lack NFD's system-os_release labels, so no driver pool can be chosen for them: %s; check node-feature-discovery's worker on these nodes", len(noOS), strings.Join(limit(noOS, 10), ", ")),
			Objects: nodeObjs(noOS), Fix: "kubectl get pods -A -l app.kubernetes.io/name=node-feature-discovery -o wide"})
	}
	return out
}

func checkUncovered(s *Snapshot, p *plan.Plan) []Finding {
	if len(p.Uncovered) == 0 || s.Only != "" {
		return nil
	}
	f := Finding{Severity: Warning,
		Message: fmt.Sprintf("%d GPU node(s) are covered by no NVIDIADriver and get no driver: %s; assign them to an NVIDIADriver, or create a default: true one", len(p.Uncovered), strings.Join(limit(p.Uncovered, 10), ", ")),
		Objects: nodeObjs(p.Uncovered)}
	for _, d := range p.Drivers {
		if !d.Default && d.Error == nil {
			f.Fix = "kubectl nvdriver assign " + d.Name + " --nodes " + strings.Join(first(p.Uncovered, 10), ",")
			break
		}
	}
	return []Finding{f}
}

// checkSkipped lists GPU nodes no driver container will manage because of
// their own labels, whether or not an NVIDIADriver selects them.
func checkSkipped(s *Snapshot, p *plan.Plan) []Finding {
	byReason := map[string][]string{}
	if s.Only != "" {
		for _, d := range p.Drivers {
			if !s.wants(d.Name) {
				continue
			}
			for _, sk := range d.Skipped {
				byReason[sk.Reason] = append(byReason[sk.Reason], sk.Node)
			}
		}
	} else {
		for _, n := range s.Nodes {
			if !plan.IsGPUNode(n.Labels) {
				continue
			}
			switch n.Labels[plan.LabelDeployDriver] {
			case plan.DeployPreInstalled:
				byReason[plan.ReasonPreInstalled] = append(byReason[plan.ReasonPreInstalled], n.Name)
			case plan.DeployFalse:
				byReason[plan.ReasonDisabled] = append(byReason[plan.ReasonDisabled], n.Name)
			}
		}
	}
	var out []Finding
	if n := byReason[plan.ReasonPreInstalled]; len(n) > 0 {
		out = append(out, Finding{Severity: Info, Message: fmt.Sprintf("%d GPU node(s) use a driver installed on the host (nvidia.com/gpu.deploy.driver=pre-installed), so no NVIDIADriver manages them: %s; to let a driver container manage one, remove the host driver, then relabel it", len(n), strings.Join(limit(n, 10), ", ")),
			Objects: nodeObjs(n), Fix: "kubectl label node " + n[0] + " nvidia.com/gpu.deploy.driver=true --overwrite"})
	}
	if n := byReason[plan.ReasonDisabled]; len(n) > 0 {
		out = append(out, Finding{Severity: Info, Message: fmt.Sprintf("%d GPU node(s) have the driver disabled (nvidia.com/gpu.deploy.driver=false), so no NVIDIADriver manages them: %s", len(n), strings.Join(limit(n, 10), ", ")),
			Objects: nodeObjs(n), Fix: "kubectl label node " + strings.Join(first(n, 10), " ") + " nvidia.com/gpu.deploy.driver=true --overwrite"})
	}
	return out
}

func ownerName(o metav1.Object) string {
	if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "NVIDIADriver" {
		return ref.Name
	}
	return ""
}

func checkEmptyDaemonSets(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, ds := range s.DaemonSets {
		owner := ownerName(&ds)
		if owner == "" || !s.wants(owner) {
			continue
		}
		if ds.Status.ObservedGeneration == ds.Generation && ds.Status.DesiredNumberScheduled == 0 {
			out = append(out, Finding{Severity: Warning,
				Message: fmt.Sprintf("DaemonSet %s/%s of %s selects no node (its nodeSelector matches nothing schedulable)", ds.Namespace, ds.Name, owner),
				Objects: []string{"daemonset/" + ds.Namespace + "/" + ds.Name},
				Fix:     fmt.Sprintf("kubectl get nodes -l %s", labels.SelectorFromSet(ds.Spec.Template.Spec.NodeSelector).String())})
		}
	}
	return out
}

func checkOrphans(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, ds := range s.DaemonSets {
		if ownerName(&ds) != "" || s.Only != "" {
			continue
		}
		out = append(out, Finding{Severity: Warning,
			Message: fmt.Sprintf("driver DaemonSet %s/%s is owned by no NVIDIADriver (a ClusterPolicy driver, or left behind): its pods may hold the driver on nodes an NVIDIADriver targets; delete it if nothing manages it any more", ds.Namespace, ds.Name),
			Objects: []string{"daemonset/" + ds.Namespace + "/" + ds.Name},
			Fix:     fmt.Sprintf("kubectl -n %s delete daemonset %s", ds.Namespace, ds.Name)})
	}
	return out
}

func checkPods(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, pod := range s.DriverPods {
		obj := "pod/" + pod.Namespace + "/" + pod.Name
		node := pod.Spec.NodeName
		statuses := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
		reported := false
		for _, cs := range statuses {
			if cs.State.Waiting == nil {
				continue
			}
			switch cs.State.Waiting.Reason {
			case "ImagePullBackOff", "ErrImagePull", "InvalidImageName":
				out = append(out, Finding{Severity: Error,
					Message: fmt.Sprintf("driver pod %s on %s cannot pull image %s (%s): the tag may not exist (precompiled images exist only for some kernels and OS releases) or a pull secret is missing: check the tag in the registry, and set spec.imagePullSecrets if it is private", pod.Name, node, cs.Image, cs.State.Waiting.Reason),
					Objects: []string{obj, "node/" + node},
					Fix:     fmt.Sprintf("kubectl -n %s describe pod %s", pod.Namespace, pod.Name)})
				reported = true
			case "CrashLoopBackOff":
				out = append(out, Finding{Severity: Error,
					Message: fmt.Sprintf("container %s of driver pod %s on %s is crash-looping (%d restarts)", cs.Name, pod.Name, node, cs.RestartCount),
					Objects: []string{obj, "node/" + node},
					Fix:     fmt.Sprintf("kubectl -n %s logs %s -c %s --previous", pod.Namespace, pod.Name, cs.Name)})
				reported = true
			}
		}
		if reported {
			continue
		}
		if pod.Status.Phase == corev1.PodPending {
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					out = append(out, Finding{Severity: Error,
						Message: fmt.Sprintf("driver pod %s is Pending: %s (an untolerated taint goes into the NVIDIADriver's spec.tolerations)", pod.Name, c.Message), Objects: []string{obj},
						Fix: "kubectl -n " + pod.Namespace + " describe pod " + pod.Name})
				}
			}
		}
	}
	return out
}

func checkTaints(s *Snapshot, _ *plan.Plan) []Finding {
	tolerations := map[string][]corev1.Toleration{}
	for _, ds := range s.DaemonSets {
		if o := ownerName(&ds); o != "" {
			tolerations[o] = ds.Spec.Template.Spec.Tolerations
		}
	}
	var out []Finding
	for _, n := range s.Nodes {
		owner := n.Labels[plan.LabelOwner]
		tol, ok := tolerations[owner]
		if owner == "" || !ok || !s.wants(owner) {
			continue
		}
		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectPreferNoSchedule || strings.HasPrefix(t.Key, "node.kubernetes.io/") {
				continue
			}
			if tolerated(tol, t) {
				continue
			}
			out = append(out, Finding{Severity: Error,
				Message: fmt.Sprintf("node %s has taint %s which %s's driver pods do not tolerate: the DaemonSet places no driver there", n.Name, taintString(t), owner),
				Objects: []string{"node/" + n.Name, "nvidiadriver/" + owner},
				Fix:     tolerationFix(s, owner, t)})
		}
	}
	return out
}

// tolerationFix adds the toleration without replacing the ones the CR has
// (a merge patch would replace the whole list).
func tolerationFix(s *Snapshot, owner string, t corev1.Taint) string {
	tol := fmt.Sprintf(`{"key":%q,"operator":"Exists","effect":%q}`, t.Key, t.Effect)
	for _, d := range s.Drivers {
		if d.Name == owner && len(d.Spec.Tolerations) > 0 {
			return fmt.Sprintf(`kubectl patch nvidiadriver %s --type json -p '[{"op":"add","path":"/spec/tolerations/-","value":%s}]'`, owner, tol)
		}
	}
	return fmt.Sprintf(`kubectl patch nvidiadriver %s --type merge -p '{"spec":{"tolerations":[%s]}}'`, owner, tol)
}

func tolerated(tols []corev1.Toleration, t corev1.Taint) bool {
	for _, tol := range tols {
		if tol.ToleratesTaint(klog.Background(), &t, false) {
			return true
		}
	}
	return false
}

func taintString(t corev1.Taint) string {
	if t.Value == "" {
		return fmt.Sprintf("%s:%s", t.Key, t.Effect)
	}
	return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
}

func checkUpgrades(s *Snapshot, _ *plan.Plan) []Finding {
	var failed, inProgress []string
	held := map[string]bool{} // CRs whose rollout holds its waiting nodes (the rollouts check says why)
	for i := range s.Drivers {
		held[s.Drivers[i].Name] = rolloutWaits(&s.Drivers[i])
	}
	for _, n := range s.Nodes {
		if !s.wants(n.Labels[plan.LabelOwner]) {
			continue
		}
		switch st := n.Labels[plan.LabelUpgradeState]; st {
		case "", plan.UpgradeDone:
		case upgrade.StateRequired:
			if !held[n.Labels[plan.LabelOwner]] {
				inProgress = append(inProgress, n.Name+"("+st+")")
			}
		case plan.UpgradeFailed:
			failed = append(failed, n.Name)
		default:
			inProgress = append(inProgress, n.Name+"("+st+")")
		}
	}
	var out []Finding
	if len(failed) > 0 {
		out = append(out, failedFinding(s, failed))
	}
	if len(inProgress) > 0 {
		out = append(out, Finding{Severity: Info, Message: fmt.Sprintf("%d node(s) are being upgraded: %s", len(inProgress), strings.Join(limit(inProgress, 10), ", ")),
			Fix: "kubectl nvdriver status"})
	}
	return out
}

// pdbRefusal finds the namespace and name of the PodDisruptionBudget in a
// failure reason the controller wrote (pkg/controller, evictionRefusal).
var pdbRefusal = regexp.MustCompile(`The disruption budget (\S+) needs .*\(PodDisruptionBudget in namespace ([^)\s]+)\)`)

// failedFinding names the failed nodes with the reason stored on each (up
// to three), and the fix for the first: the blocking PodDisruptionBudget
// when there is one, else the driver pod; then the retry.
func failedFinding(s *Snapshot, failed []string) Finding {
	reasons := map[string]string{}
	for _, n := range s.Nodes {
		if r := n.Annotations[upgrade.AnnotationFailure]; r != "" {
			reasons[n.Name] = r
		}
	}
	var why []string
	for _, n := range first(failed, 3) {
		if r := reasons[n]; r != "" {
			why = append(why, n+": "+r)
		}
	}
	msg := fmt.Sprintf("%d node(s) ended upgrade-failed: %s", len(failed), strings.Join(limit(failed, 10), ", "))
	if len(why) > 0 {
		msg += " (" + strings.Join(why, "; ") + ")"
	}
	inspect := fmt.Sprintf("kubectl -n %s get pods -o wide --field-selector spec.nodeName=%s", s.Namespace, failed[0])
	if m := pdbRefusal.FindStringSubmatch(reasons[failed[0]]); m != nil {
		msg += fmt.Sprintf("; PodDisruptionBudget %s/%s allows no eviction: let its pods become healthy or relax it, then retry", m[2], m[1])
		inspect = fmt.Sprintf("kubectl -n %s get pdb %s -o wide", m[2], m[1])
	} else {
		msg += "; inspect the driver pod, then retry by setting the node back to upgrade-required"
	}
	return Finding{Severity: Error, Message: msg, Objects: nodeObjs(failed),
		Fix: fmt.Sprintf("%s; kubectl label node %s %s=upgrade-required --overwrite", inspect, failed[0], plan.LabelUpgradeState)}
}

func checkCordoned(s *Snapshot, _ *plan.Plan) []Finding {
	var left []string
	for _, n := range s.Nodes {
		if !n.Spec.Unschedulable || !plan.IsGPUNode(n.Labels) || !s.wants(n.Labels[plan.LabelOwner]) {
			continue
		}
		if st := n.Labels[plan.LabelUpgradeState]; st == "" || st == plan.UpgradeDone {
			left = append(left, n.Name)
		}
	}
	if len(left) == 0 {
		return nil
	}
	return []Finding{{Severity: Warning, Message: fmt.Sprintf("%d GPU node(s) are cordoned with no driver upgrade in progress (left cordoned?): %s; uncordon them if nobody cordoned them on purpose", len(left), strings.Join(limit(left, 10), ", ")),
		Objects: nodeObjs(left), Fix: "kubectl uncordon " + strings.Join(first(left, 10), " ")}}
}

func nodeObjs(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "node/" + strings.SplitN(n, "(", 2)[0]
	}
	return out
}
