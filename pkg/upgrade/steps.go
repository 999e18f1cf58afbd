package upgrade

import (
	"fmt"
	"strings"
	"time"
)

// The transitions of one node, state by state (Decide calls next for every
// node outside the budgeted entry).

// next is the transition of one node outside the budgeted entry.
func next(d *Decision, n Node, p Policy, now time.Time) {
	switch n.State {
	case StateUnknown, StateDone:
		fromIdle(d, n, p, now)
	case StateCordon:
		fromCordon(d, n, p, now)
	case StateWaitForJobs:
		fromWaitForJobs(d, n, p, now)
	case StatePodDeletion:
		fromPodDeletion(d, n, p, now)
	case StateDrain:
		fromDrain(d, n, p, now)
	case StatePodRestart:
		fromPodRestart(d, n, p, now)
	case StateValidation:
		fromValidation(d, n, p, now)
	case StateUncordon:
		fromUncordon(d, n, p, now)
	case StateFailed:
		fromFailed(d, n, p, now)
	default:
		// A state we do not know (another tool's): restart the machine for it.
		d.To = StateUnknown
	}
}

// fromIdle: a node at rest (no state, or done) enters the machine when its driver pod is out of date and autoUpgrade is on, or when asked (an upgrade request or a move).
func fromIdle(d *Decision, n Node, p Policy, now time.Time) {
	pod := n.DriverPod
	if pod == nil {
		if n.MoveTo() != "" {
			d.Actions = append(d.Actions, ActMove) // no driver runs here: nothing to protect
		}
		return // no driver pod here (yet): nothing to upgrade
	}
	requested := n.Annotations[AnnotationRequested] == "true" || n.MoveTo() != ""
	if (!pod.InSync && p.AutoUpgrade) || requested {
		d.To = StateRequired
		if n.Unschedulable {
			d.Annotate(AnnotationInitialUnsched, "true")
		}
		return
	}
	if n.State == StateUnknown && pod.InSync {
		d.To = StateDone
	}
}

// fromCordon: cordon, then wait for the jobs.
func fromCordon(d *Decision, n Node, p Policy, now time.Time) {
	d.Actions = append(d.Actions, ActCordon)
	d.To = StateWaitForJobs
	if p.WaitForJobsSelector != "" {
		d.Annotate(AnnotationWaitStart, stamp(now))
	}
}

// fromWaitForJobs: the node stays cordoned until the pods matching waitForCompletion.podSelector are gone, or the wait times out.
func fromWaitForJobs(d *Decision, n Node, p Policy, now time.Time) {
	if !n.Unschedulable {
		d.Actions = append(d.Actions, ActCordon) // someone uncordoned it: hold the node
	}
	if p.WaitForJobsSelector == "" || n.JobPods == 0 {
		d.To = StatePodDeletion
		d.Annotate(AnnotationWaitStart, "")
		return
	}
	if start, ok := startedAt(n, AnnotationWaitStart); ok && p.WaitForJobsTimeout > 0 && now.Sub(start) >= p.WaitForJobsTimeout {
		d.To = StatePodDeletion
		d.Annotate(AnnotationWaitStart, "")
	} else if !ok {
		d.Annotate(AnnotationWaitStart, stamp(now))
	}
}

// fromPodDeletion: evict the GPU pods; a pod the policy keeps, or the timeout, hands over to the drain or fails the node.
func fromPodDeletion(d *Decision, n Node, p Policy, now time.Time) {
	if n.GPUPods == 0 {
		d.To = StatePodRestart
		if n.Annotations[AnnotationDeletionStart] != "" {
			d.Annotate(AnnotationDeletionStart, "")
		}
		return
	}
	if len(n.Refused) > 0 {
		// NVIDIA's rule: a step that cannot remove every pod it must
		// removes none, and hands over to the drain or fails; the node
		// stays cordoned with its jobs running.
		if n.Annotations[AnnotationDeletionStart] != "" {
			d.Annotate(AnnotationDeletionStart, "")
		}
		if p.DrainEnabled {
			d.To = StateDrain
			return
		}
		fail(d, p, "spec.upgradePolicy.podDeletion does not allow removing "+strings.Join(n.Refused, "; "))
		return
	}
	if p.PodDeletionTimeout > 0 && clock(d, n, AnnotationDeletionStart, now) >= p.PodDeletionTimeout {
		d.Annotate(AnnotationDeletionStart, "")
		if p.DrainEnabled {
			d.To = StateDrain
			return
		}
		fail(d, p, fmt.Sprintf("%d GPU pod(s) still on the node after %s of eviction (%s)", n.GPUPods, p.PodDeletionTimeout, evictionBlocker(n)))
		return
	}
	d.Actions = append(d.Actions, ActEvictGPUPods)
}

// fromDrain: evict what the drain selects, within its timeout; a pod the policy keeps fails the node.
func fromDrain(d *Decision, n Node, p Policy, now time.Time) {
	if !p.DrainEnabled || n.GPUPods == 0 {
		d.To = StatePodRestart
		d.Annotate(AnnotationDeletionStart, "")
		return
	}
	if len(n.Refused) > 0 {
		if n.Annotations[AnnotationDeletionStart] != "" {
			d.Annotate(AnnotationDeletionStart, "")
		}
		fail(d, p, "spec.upgradePolicy.drain does not allow removing "+strings.Join(n.Refused, "; "))
		return
	}
	if p.DrainTimeout > 0 && clock(d, n, AnnotationDeletionStart, now) >= p.DrainTimeout {
		d.Annotate(AnnotationDeletionStart, "")
		fail(d, p, fmt.Sprintf("drain did not empty the node within %s (%s)", p.DrainTimeout, evictionBlocker(n)))
		return
	}
	d.Actions = append(d.Actions, ActDrain)
}

// evictionBlocker says what kept the pods: the API's last refusal, or the
// likely cause when none was seen (a restart since, or a pod slow to stop).
func evictionBlocker(n Node) string {
	if n.EvictionRefused != "" {
		return n.EvictionRefused
	}
	return "no eviction was refused: the pods may be slow to terminate, or a PodDisruptionBudget blocked them before the controller restarted"
}

// fromPodRestart: with the node empty, replace the driver pod (or hand the node to its new driver), then wait for the new pod to be Ready.
func fromPodRestart(d *Decision, n Node, p Policy, now time.Time) {
	pod := n.DriverPod
	d.RestartOnly = onRestartOnlyPath(n)
	switch {
	case d.RestartOnly && pod != nil && !pod.InSync && !pod.RestartOnly:
		// The spec changed again since, and now it is an install change:
		// the node takes the whole machine.
		d.To = StateCordon
		d.Annotate(AnnotationRestartOnly, "")
	case d.RestartOnly && pod == nil:
		// The old pod is gone; the DaemonSet controller is creating the new one.
	case d.RestartOnly && !pod.InSync:
		if !pod.Deleting {
			d.Actions = append(d.Actions, ActDeleteDriverPod)
		}
	case n.MoveTo() != "" && n.GPUPods > 0:
		d.To = StatePodDeletion
	case n.MoveTo() != "":
		d.Actions = append(d.Actions, ActMove)
	case n.GPUPods > 0 && (pod == nil || !pod.InSync):
		// A GPU pod landed after the eviction (the scheduler can bind one
		// that raced the cordon): empty the node again before touching the driver.
		d.To = StatePodDeletion
	case pod == nil:
		// The old pod is gone; the DaemonSet controller is creating the new one.
	case !pod.InSync:
		if !pod.Deleting {
			d.Actions = append(d.Actions, ActDeleteDriverPod)
		}
	case pod.Ready:
		d.To = StateValidation
		if _, ok := startedAt(n, AnnotationValidationStart); !ok {
			d.Annotate(AnnotationValidationStart, stamp(now))
		}
	case pod.Restarts > maxDriverPodRestarts:
		fail(d, p, fmt.Sprintf("the new driver pod %s restarted %d times without becoming Ready", pod.Name, pod.Restarts))
		d.Annotate(AnnotationValidationStart, "")
	default:
		// The new pod runs but is not Ready: the validation clock starts now
		// (NVIDIA waits forever here unless the pod restarts >10 times).
		if clock(d, n, AnnotationValidationStart, now) >= p.ValidationTimeout {
			d.Annotate(AnnotationValidationStart, "")
			fail(d, p, fmt.Sprintf("the new driver pod %s did not become Ready within %s", pod.Name, p.ValidationTimeout))
		}
	}
}

// fromValidation: the new driver pod (and the validators, when a selector is set) must be Ready within the validation timeout.
func fromValidation(d *Decision, n Node, p Policy, now time.Time) {
	pod := n.DriverPod
	if pod != nil && pod.InSync && pod.Ready && !n.ValidatorsPending {
		afterValidation(d, n)
		d.Annotate(AnnotationValidationStart, "")
		return
	}
	start, ok := startedAt(n, AnnotationValidationStart)
	if !ok {
		d.Annotate(AnnotationValidationStart, stamp(now))
		return
	}
	if now.Sub(start) >= p.ValidationTimeout {
		d.Annotate(AnnotationValidationStart, "")
		name := "(none)"
		if pod != nil {
			name = pod.Name
		}
		if pod != nil && pod.InSync && pod.Ready && n.ValidatorsPending {
			fail(d, p, fmt.Sprintf("no validation pod became Ready on the node within %s (driver pod %s is Ready)", p.ValidationTimeout, name))
			return
		}
		fail(d, p, fmt.Sprintf("the new driver pod %s did not become Ready within %s", name, p.ValidationTimeout))
	}
}

// fromUncordon: uncordon and finish.
func fromUncordon(d *Decision, n Node, p Policy, now time.Time) {
	d.Actions = append(d.Actions, ActUncordon)
	d.To = StateDone
	if n.Annotations[AnnotationInitialUnsched] != "" {
		d.Annotate(AnnotationInitialUnsched, "")
	}
}

// fromFailed: a failed node recovers when its driver pod is in sync and
// Ready; one that failed on an older revision is retried on the new one (the
// spec changed since: an undo, a fixed version).
func fromFailed(d *Decision, n Node, p Policy, now time.Time) {
	pod := n.DriverPod
	if pod != nil && pod.InSync && pod.Ready {
		afterValidation(d, n)
		return
	}
	if rev := n.Annotations[AnnotationFailedRevision]; rev != "" && p.Revision != "" && rev != p.Revision && pod != nil {
		d.To = StateRequired
	}
}
