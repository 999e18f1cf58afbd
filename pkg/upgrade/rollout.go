package upgrade

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// AnnotationResumedAt is set on the CR by `kubectl nvdriver rollout resume`
// (a timestamp): each new value promotes a waiting canary and lets a halted
// rollout go on past the failures so far, once (docs/design.md, "Rollouts").
const AnnotationResumedAt = "nvdriver.io/rollout-resumed-at"

// AnnotationFailedRevision is ours, on a failed node: the rollout revision it
// failed on. A node that failed on an older revision is retried when the spec
// changes (an undo brings it back through the machine).
const AnnotationFailedRevision = "nvidia.com/gpu-driver-upgrade.failed-revision"

// maxFailedNodes bounds status.rollout.failedNodes.
const maxFailedNodes = 10

// DefaultBake is how long an Automatic canary runs before the rest.
const DefaultBake = 300 * time.Second

// Canary is a CR's canary wave, resolved.
type Canary struct {
	Nodes intstr.IntOrString
	// Matches reports whether a node (by its labels) may be a canary.
	Matches func(labels map[string]string) bool
	// SelectorError is set when spec.upgradePolicy.canary.selector cannot be
	// used: no node is chosen and the rollout waits, saying why.
	SelectorError error
	Manual        bool
	Bake          time.Duration
}

// Gate is what the rollout allows this pass: Held gives, per node that may
// not start its upgrade now, why (nodes absent may start within the budget).
type Gate struct {
	Status v1alpha1.RolloutStatus
	Held   map[string]string
	// WakeAt is when the rollout changes by itself (a bake time ending); zero
	// when only an event can change it.
	WakeAt time.Time
	// Halted is true when the failure budget is spent.
	Halted bool
}

// HeldTemplatePending is why a node waits whose driver pod's DaemonSet has
// a template the DaemonSet controller has not observed yet.
const HeldTemplatePending = "the DaemonSet controller has not yet observed the new template"

// needsUpgrade: the node runs a driver pod that is not the current template
// (a node moving in or out is the admin's move, not this rollout's).
func needsUpgrade(n Node) bool {
	return !n.Skip && n.MoveTo() == "" && n.DriverPod != nil && !n.DriverPod.InSync
}

// doneOn: the node has finished on the current revision.
func doneOn(n Node) bool {
	return n.State == StateDone && (n.DriverPod == nil || n.DriverPod.InSync)
}

// failedOn: the node failed on this revision (a failure with no revision
// recorded, from before we recorded it, counts as this one's).
func failedOn(n Node, rev string) bool {
	if n.State != StateFailed {
		return false
	}
	r := n.Annotations[AnnotationFailedRevision]
	return r == "" || r == rev
}

// Track advances a CR's rollout one pass: prev is what status.rollout said,
// resumedAt the CR's AnnotationResumedAt. It is pure; the controller writes
// Status back and holds the nodes in Held. See docs/design.md, "Rollouts".
func Track(nodes []Node, p Policy, prev *v1alpha1.RolloutStatus, resumedAt string, now time.Time) Gate {
	sorted := byName(nodes)

	var st v1alpha1.RolloutStatus
	if prev != nil && prev.Revision == p.Revision {
		st = *prev.DeepCopy()
	} else {
		// A new rollout. The resume annotation stays on the CR: the value
		// already acted on (or, with no status, whatever is there) is not a
		// resume of this rollout.
		st = v1alpha1.RolloutStatus{Revision: p.Revision, StartedAt: metav1.NewTime(now), ResumedAt: resumedAt}
		if prev != nil {
			st.ResumedAt = prev.ResumedAt
		}
	}
	g := Gate{Held: map[string]string{}}

	total, needing := 0, 0
	for _, n := range sorted {
		if n.Skip {
			continue
		}
		total++
		if needsUpgrade(n) {
			needing++
		}
	}

	// A resume acts once per new annotation value: the canary is promoted and
	// the failures so far stop counting.
	if resumedAt != "" && resumedAt != st.ResumedAt {
		st.ResumedAt = resumedAt
		st.Promoted = true
		accepted := map[string]bool{}
		for _, a := range st.AcceptedFailures {
			accepted[a] = true
		}
		for _, n := range sorted {
			if failedOn(n, p.Revision) && !accepted[n.Name] {
				st.AcceptedFailures = append(st.AcceptedFailures, n.Name)
			}
		}
		sort.Strings(st.AcceptedFailures)
	}
	accepted := map[string]bool{}
	for _, a := range st.AcceptedFailures {
		accepted[a] = true
	}

	// Counts.
	st.Total, st.Done, st.InFlight, st.Failed = int32(total), 0, 0, 0
	st.FailedNodes = nil
	counting := 0
	for _, n := range sorted {
		switch {
		case n.Skip:
		case doneOn(n):
			st.Done++
		case InProgress(n.State):
			st.InFlight++
		case failedOn(n, p.Revision):
			st.Failed++
			if !accepted[n.Name] {
				counting++
			}
			if len(st.FailedNodes) < maxFailedNodes {
				st.FailedNodes = append(st.FailedNodes, v1alpha1.FailedNode{Node: n.Name, Reason: n.Annotations[AnnotationFailure]})
			}
		}
	}

	// The canary is chosen the first time a node needs the new revision (not
	// when the revision is first seen: the DaemonSets may not show it yet),
	// and never again for this revision: a restarted controller keeps it.
	c := p.Canary
	inCanary := map[string]bool{}
	canaryWaiting := ""
	if c != nil && !st.Promoted {
		if st.CanaryNodes == nil && needing > 0 {
			st.CanaryNodes = chooseCanary(sorted, c, total)
		}
		for _, name := range st.CanaryNodes {
			inCanary[name] = true
		}
		switch {
		case needing > 0 && len(st.CanaryNodes) == 0:
			why := "no node that needs the upgrade matches spec.upgradePolicy.canary.selector"
			if c.SelectorError != nil {
				why = "spec.upgradePolicy.canary.selector is invalid (" + c.SelectorError.Error() + ")"
			}
			canaryWaiting = why + "; `kubectl nvdriver rollout resume` goes on without a canary"
			st.Phase = v1alpha1.RolloutWaiting
		case len(st.CanaryNodes) > 0:
			done, failed := canaryProgress(sorted, inCanary, p.Revision)
			switch {
			case done < len(st.CanaryNodes):
				st.Phase = v1alpha1.RolloutCanary
				canaryWaiting = fmt.Sprintf("canary wave: %d/%d node(s) done (%s)", done, len(st.CanaryNodes), strings.Join(st.CanaryNodes, ", "))
				if failed > 0 {
					canaryWaiting += fmt.Sprintf("; %d failed", failed)
				}
			case needing == 0:
				// The canary was every node that needed the upgrade.
				st.Promoted = true
			case c.Manual:
				if st.CanaryDoneAt == nil {
					st.CanaryDoneAt = ptrTime(now)
				}
				st.Phase = v1alpha1.RolloutWaiting
				canaryWaiting = fmt.Sprintf("canary done on %d node(s); `kubectl nvdriver rollout resume` upgrades the other %d", len(st.CanaryNodes), max(0, needing))
			default:
				if st.CanaryDoneAt == nil {
					st.CanaryDoneAt = ptrTime(now)
				}
				at := st.CanaryDoneAt.Add(c.Bake)
				if now.Before(at) {
					st.Phase = v1alpha1.RolloutBaking
					canaryWaiting = fmt.Sprintf("canary done on %d node(s); the other %d start at %s if none fails", len(st.CanaryNodes), needing, at.UTC().Format(time.RFC3339))
					g.WakeAt = at
				} else {
					st.Promoted = true
				}
			}
		}
	}
	if st.Promoted {
		canaryWaiting = ""
		inCanary = nil
	}

	budget := FailureBudgetNodes(p.FailureBudget, total)
	g.Halted = counting >= budget
	switch {
	case g.Halted:
		st.Phase = v1alpha1.RolloutHalted
		st.Message = fmt.Sprintf("halted: %d node(s) failed, failure budget %d (%s); in-flight nodes finish, no other node starts. "+
			"Retry a node once fixed (kubectl label node NODE %s=upgrade-required --overwrite), go on past the failures (kubectl nvdriver rollout resume), or go back (kubectl nvdriver rollout undo)",
			counting, budget, failedNames(st.FailedNodes, accepted), LabelState)
	case p.Paused:
		st.Phase = v1alpha1.RolloutPaused
		st.Message = "paused (spec.upgradePolicy.paused): in-flight nodes finish, no other node starts; kubectl nvdriver rollout resume goes on"
	case canaryWaiting != "":
		st.Message = canaryWaiting
	case needing == 0 && int(st.Done) == total:
		st.Phase = v1alpha1.RolloutComplete
		st.Message = ""
		if st.CompletedAt == nil {
			st.CompletedAt = ptrTime(now)
		}
	default:
		st.Phase = v1alpha1.RolloutProgressing
		st.Message = ""
		if st.Failed > 0 {
			st.Message = fmt.Sprintf("%d node(s) failed (%s), within the failure budget of %d", st.Failed, failedNames(st.FailedNodes, nil), budget)
		}
	}
	if st.Phase != v1alpha1.RolloutComplete {
		st.CompletedAt = nil
	}

	for _, n := range sorted {
		// A move (assign, a node leaving, the CR deleted) is never held: it is
		// an admin's act on where drivers run, not this spec's rollout, and a
		// paused or halted CR must still let its nodes go.
		if n.Skip || n.State != StateRequired || n.MoveTo() != "" {
			continue
		}
		switch {
		case g.Halted:
			g.Held[n.Name] = "rollout halted"
		case p.Paused:
			g.Held[n.Name] = "rollout paused"
		case canaryWaiting != "" && !inCanary[n.Name]:
			g.Held[n.Name] = "waiting for the canary"
		case n.DriverPod != nil && n.DriverPod.TemplatePending:
			// Whether the pod already runs the template is not known until
			// the DaemonSet controller observes it: after an undo, a node
			// that never left the template would restart for nothing.
			g.Held[n.Name] = HeldTemplatePending
		}
	}
	st.Pools = poolShares(sorted)
	g.Status = st
	return g
}

// Change kinds of a pool in a rollout.
const (
	ChangeDisruptive  = "disruptive"
	ChangeRestartOnly = "restart-only"
)

// poolShares says per pool with nodes still to go whether the change is
// restart-only there (every such node's pod has the template's config
// digest, or is on the restart-only path) or disruptive.
func poolShares(sorted []Node) []v1alpha1.RolloutPool {
	byPool := map[string]*v1alpha1.RolloutPool{}
	var names []string
	for _, n := range sorted {
		pending := needsUpgrade(n) || (InProgress(n.State) && n.MoveTo() == "")
		if !pending || n.Pool == "" {
			continue
		}
		p := byPool[n.Pool]
		if p == nil {
			p = &v1alpha1.RolloutPool{DaemonSet: n.Pool, Change: ChangeRestartOnly}
			byPool[n.Pool] = p
			names = append(names, n.Pool)
		}
		p.Pending++
		restartOnly := onRestartOnlyPath(n) || (n.DriverPod != nil && n.DriverPod.RestartOnly && !InProgress(n.State))
		if !restartOnly {
			p.Change = ChangeDisruptive
		}
	}
	sort.Strings(names)
	out := make([]v1alpha1.RolloutPool, 0, len(names))
	for _, name := range names {
		out = append(out, *byPool[name])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// chooseCanary takes the first nodes in name order that need the upgrade and
// match the selector: count or percentage of the CR's nodes, rounded up.
func chooseCanary(sorted []Node, c *Canary, total int) []string {
	if c.SelectorError != nil {
		return []string{}
	}
	want, err := intstr.GetScaledValueFromIntOrPercent(&c.Nodes, total, true)
	if err != nil || want < 1 {
		want = 1
	}
	out := []string{}
	for _, n := range sorted {
		if len(out) == want {
			break
		}
		if needsUpgrade(n) && (c.Matches == nil || c.Matches(n.Labels)) {
			out = append(out, n.Name)
		}
	}
	return out
}

// canaryProgress counts the canary nodes done on the revision and failed.
// A canary node that left the CR counts as done: it is not waited for.
func canaryProgress(sorted []Node, inCanary map[string]bool, rev string) (done, failed int) {
	seen := 0
	for _, n := range sorted {
		if !inCanary[n.Name] {
			continue
		}
		seen++
		switch {
		case doneOn(n) || n.Skip:
			done++
		case failedOn(n, rev):
			failed++
		}
	}
	return done + (len(inCanary) - seen), failed
}

// FailureBudgetNodes resolves failureBudget against the CR's node count: a
// percentage rounds up, and the result is at least 1.
func FailureBudgetNodes(v intstr.IntOrString, total int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, total, true)
	if err != nil {
		n = 1
	}
	return max(n, 1)
}

func failedNames(fs []v1alpha1.FailedNode, skip map[string]bool) string {
	var out []string
	for _, f := range fs {
		if skip[f.Node] {
			continue
		}
		if f.Reason != "" {
			out = append(out, f.Node+": "+f.Reason)
		} else {
			out = append(out, f.Node)
		}
	}
	return strings.Join(out, "; ")
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}
