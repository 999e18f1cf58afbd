// Package upgrade is the per-node driver upgrade state machine, in NVIDIA's
// k8s-operator-libs vocabulary (state names, labels, annotations) so tools
// written for NVIDIA's operator read our nodes correctly. It is pure: Decide
// takes what the cluster looks like and returns, per node, the next state and
// the actions to take; the controller carries them out. All state lives on the
// nodes, so a restarted controller resumes exactly where it was.
package upgrade

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// States (the values of LabelState).
const (
	StateUnknown         = ""
	StateRequired        = "upgrade-required"
	StateCordon          = "cordon-required"
	StateWaitForJobs     = "wait-for-jobs-required"
	StatePodDeletion     = "pod-deletion-required"
	StateDrain           = "drain-required"
	StatePodRestart      = "pod-restart-required"
	StateValidation      = "validation-required"
	StateUncordon        = "uncordon-required"
	StateDone            = plan.UpgradeDone
	StateFailed          = plan.UpgradeFailed
	maxDriverPodRestarts = 10
)

// Node labels and annotations (NVIDIA's, driver name "gpu").
const (
	LabelState                = plan.LabelUpgradeState
	LabelSkip                 = "nvidia.com/gpu-driver-upgrade.skip"
	AnnotationRequested       = "nvidia.com/gpu-driver-upgrade-requested"
	AnnotationInitialUnsched  = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
	AnnotationWaitStart       = "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
	AnnotationValidationStart = "nvidia.com/gpu-driver-upgrade-validation-start-time"
	// AnnotationDeletionStart is ours: when GPU pod eviction began, for its timeout.
	AnnotationDeletionStart = "nvidia.com/gpu-driver-upgrade-pod-deletion-start-time"
	// AnnotationMoveTo is ours: the node is moving to another NVIDIADriver (its
	// name, or MoveRelease when no driver takes it). The owner label changes only
	// once the node is cordoned and emptied of GPU pods.
	AnnotationMoveTo = "nvidia.com/gpu-driver-upgrade.move-to"
	MoveRelease      = "-"
	// AnnotationStateSince is ours: when the node entered its upgrade state
	// (Unix seconds), for status --nodes and doctor node/NAME.
	AnnotationStateSince = "nvidia.com/gpu-driver-upgrade.state-since"
	// AnnotationRestartOnly is ours: the node takes the restart-only path
	// (no cordon, no eviction), set when it starts and cleared when done.
	AnnotationRestartOnly = "nvidia.com/gpu-driver-upgrade.restart-only"
	// AnnotationFailure is ours: why the node went upgrade-failed, kept on the
	// node for doctor and status until it leaves that state.
	AnnotationFailure = "nvidia.com/gpu-driver-upgrade.failure-reason"
	// EventReason is NVIDIA's event reason for upgrade steps.
	EventReason = "GPUDriverUpgrade"
)

// NodeAnnotations are every node annotation the machine writes: the node
// cache keeps them, and a node leaving every driver has them removed.
var NodeAnnotations = []string{AnnotationRequested, AnnotationInitialUnsched, AnnotationWaitStart,
	AnnotationValidationStart, AnnotationDeletionStart, AnnotationMoveTo, AnnotationFailure, AnnotationFailedRevision, AnnotationRestartOnly, AnnotationStateSince, "nvidia.com/gpu-driver-upgrade-enabled"}

// maxFailureReason bounds the failure annotation (a reason can name many pods).
const maxFailureReason = 1024

// DefaultValidationTimeout bounds validation-required (NVIDIA hard-codes 600s).
const DefaultValidationTimeout = 600 * time.Second

// InProgress reports whether a state holds a node out of service.
func InProgress(s string) bool {
	switch s {
	case StateCordon, StateWaitForJobs, StatePodDeletion, StateDrain, StatePodRestart, StateValidation, StateUncordon:
		return true
	}
	return false
}

// DriverPod is what the machine needs of a node's driver pod.
type DriverPod struct {
	Name     string
	InSync   bool // runs the DaemonSet's current template
	Ready    bool
	Deleting bool
	Restarts int32
	// RestartOnly: the pod is not the current template but has its config
	// digest (labels, annotations, tolerations, probes ... changed): NVIDIA's
	// driver container skips the unload, so GPU jobs need not leave.
	RestartOnly bool
	// TemplatePending: the pod's DaemonSet has a template the DaemonSet
	// controller has not observed yet, so whether the pod is in sync is not
	// known (an undo may have brought back the very template it runs).
	TemplatePending bool
}

// Node is one node of the CR with everything its transition depends on.
type Node struct {
	Name  string
	State string
	Skip  bool
	// Pool is the DaemonSet of the node's driver pod ("" when none).
	Pool string
	// Labels are the node's labels (the canary selector reads them).
	Labels map[string]string
	// Held says why the rollout does not let the node start its upgrade now
	// (paused, halted, waiting for the canary); "" when it may (Track).
	Held          string
	Unschedulable bool
	NotReady      bool
	Annotations   map[string]string
	// DriverPod is nil when the node runs no driver pod (yet).
	DriverPod *DriverPod
	// GPUPods counts pods on the node requesting nvidia.com/gpu* or
	// nvidia.com/mig-* (known only for nodes in the states that need it).
	GPUPods int
	// JobPods counts running pods matching waitForCompletion.podSelector.
	JobPods int
	// Refused are the pods the current step must remove and its policy does
	// not allow to (emptyDir without deleteEmptyDir, no controller without
	// force), each as "namespace/name (why)"; read in pod-deletion-required
	// and drain-required.
	Refused []string
	// EvictionRefused is the API's last refusal of a GPU pod's eviction on the
	// node (a PodDisruptionBudget allowing no disruption), "" when none; read
	// when pod deletion or the drain times out.
	EvictionRefused string
	// ValidatorsPending is true while the validation pod selector (the
	// controller's --validation-pod-selector, e.g. NVIDIA's operator validator)
	// matches no Ready pod on the node; read only in validation-required.
	ValidatorsPending bool
}

// MoveTo is where the node is moving, "" when it is not.
func (n Node) MoveTo() string { return n.Annotations[AnnotationMoveTo] }

// RunBy names the NVIDIADriver whose upgrade machine carries a node with this
// owner label and move-to annotation: a node moving to another CR counts
// against the destination's budget (docs/design.md, "Upgrade budget"), so the destination runs it from
// the start of the move; a node being released stays with its owner.
func RunBy(owner, moveTo string) string {
	if moveTo != "" && moveTo != MoveRelease {
		return moveTo
	}
	return owner
}

// Policy is a CR's upgradePolicy with defaults applied.
type Policy struct {
	AutoUpgrade         bool
	MaxParallelUpgrades int // 0 = unlimited
	MaxUnavailable      intstr.IntOrString
	PodDeletionTimeout  time.Duration // 0 = forever
	WaitForJobsSelector string
	WaitForJobsTimeout  time.Duration // 0 = forever
	DrainEnabled        bool
	DrainTimeout        time.Duration
	ValidationTimeout   time.Duration
	// What each step may remove, as kubectl drain's --force and
	// --delete-emptydir-data; the drain step only pods matching its selector.
	PodDeletion, Drain Removal
	// The rollout (ours, docs/design.md, "Rollouts"): paused, its canary
	// wave (nil: none), how many failures halt it.
	Paused        bool
	Canary        *Canary
	FailureBudget intstr.IntOrString
	AutoRollback  bool
	// Revision is the hash of the spec being rolled out (RevisionOf); a
	// node's failure is recorded against it.
	Revision string
}

// Removal is what a pod-removing step may remove: pods without a controller
// (Force) and pods with emptyDir volumes (DeleteEmptyDir), and for the drain
// step only pods matching PodSelector ("" = all).
type Removal struct {
	Force          bool
	DeleteEmptyDir bool
	PodSelector    string
}

// PolicyFor resolves a CR's upgradePolicy with NVIDIA's defaults.
func PolicyFor(spec *v1alpha1.NVIDIADriverSpec) Policy {
	p := Policy{AutoUpgrade: true, MaxParallelUpgrades: 1, MaxUnavailable: intstr.FromString("25%"),
		PodDeletionTimeout: 300 * time.Second, DrainTimeout: 300 * time.Second, ValidationTimeout: DefaultValidationTimeout,
		FailureBudget: intstr.FromInt32(1)}
	_, p.Revision = RevisionOf(spec)
	up := spec.UpgradePolicy
	if up == nil {
		return p
	}
	p.Paused, p.AutoRollback = up.Paused, up.AutoRollback
	if up.FailureBudget != nil {
		p.FailureBudget = *up.FailureBudget
	}
	if c := up.Canary; c != nil {
		p.Canary = canaryPolicy(c)
	}
	p.AutoUpgrade = up.AutoUpgrade
	p.MaxParallelUpgrades = up.MaxParallelUpgrades
	if up.MaxUnavailable != nil {
		p.MaxUnavailable = *up.MaxUnavailable
	}
	if up.PodDeletion != nil {
		p.PodDeletionTimeout = time.Duration(up.PodDeletion.TimeoutSecond) * time.Second
		p.PodDeletion = Removal{Force: up.PodDeletion.Force, DeleteEmptyDir: up.PodDeletion.DeleteEmptyDir}
	}
	if up.WaitForCompletion != nil {
		p.WaitForJobsSelector = up.WaitForCompletion.PodSelector
		p.WaitForJobsTimeout = time.Duration(up.WaitForCompletion.TimeoutSecond) * time.Second
	}
	if up.DrainSpec != nil {
		p.DrainEnabled = up.DrainSpec.Enable
		p.DrainTimeout = time.Duration(up.DrainSpec.TimeoutSecond) * time.Second
		p.Drain = Removal{Force: up.DrainSpec.Force, DeleteEmptyDir: up.DrainSpec.DeleteEmptyDir, PodSelector: up.DrainSpec.PodSelector}
	}
	return p
}

// MaxUnavailableNodes resolves maxUnavailable against the CR's node count: a
// percentage rounds up, and the result is at least 1 (docs/design.md, "Upgrade budget").
func MaxUnavailableNodes(v intstr.IntOrString, total int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, total, true)
	if err != nil {
		// Admission refuses anything else; a stored oddity gets the default.
		n, _ = intstr.GetScaledValueFromIntOrPercent(ptr.To(intstr.FromString("25%")), total, true)
	}
	return max(n, 1)
}

// Action is something the executor does for a node.
type Action string

const (
	ActCordon          Action = "cordon"
	ActUncordon        Action = "uncordon"
	ActEvictGPUPods    Action = "evict-gpu-pods"
	ActDrain           Action = "drain"
	ActDeleteDriverPod Action = "delete-driver-pod"
	// ActMove hands the emptied, cordoned node to its new driver: the owner
	// label changes and the old DaemonSet's pod leaves.
	ActMove Action = "move"
)

// Decision is the outcome for one node.
type Decision struct {
	Node    string
	From    string
	To      string // == From when the node stays
	Actions []Action
	// Annotations to set ("" value = remove).
	Annotations map[string]string
	// Reason explains a failure (for the Event and the doctor).
	Reason string
	// RestartOnly: the node is on the restart-only path (its driver pod is
	// replaced with GPU pods still running).
	RestartOnly bool
}

// byName is nodes in name order: nodes itself, read only, when it already
// is (the controller passes them so), else a sorted copy.
func byName(nodes []Node) []Node {
	cmp := func(a, b Node) int { return strings.Compare(a.Name, b.Name) }
	if slices.IsSortedFunc(nodes, cmp) {
		return nodes
	}
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, cmp)
	return sorted
}

// Annotate records an annotation to set ("" removes it). The map is made on
// the first one: a pass decides for every node of a CR and most decide
// nothing.
func (d *Decision) Annotate(key, value string) {
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[key] = value
}

// Changed reports whether the decision writes anything.
func (d Decision) Changed() bool {
	return d.From != d.To || len(d.Actions) > 0 || len(d.Annotations) > 0
}

// Decide computes one pass of the machine over a CR's nodes. Nodes needing an
// upgrade enter it only within the budget: at most maxParallelUpgrades in
// progress, and at most maxUnavailable unavailable (in progress, cordoned or
// NotReady), except nodes already cordoned, which cost nothing more.
func Decide(nodes []Node, p Policy, now time.Time) []Decision {
	sorted := byName(nodes)

	inProgress, unavailable := 0, 0
	for _, n := range sorted {
		switch {
		case n.Skip:
		case InProgress(n.State):
			inProgress++
			unavailable++
		case n.Unschedulable || n.NotReady:
			unavailable++
		}
	}
	slots := MaxUnavailableNodes(p.MaxUnavailable, len(sorted)) - unavailable
	if p.MaxParallelUpgrades > 0 {
		slots = min(slots, p.MaxParallelUpgrades-inProgress)
	}

	var out []Decision
	for _, n := range sorted {
		d := Decision{Node: n.Name, From: n.State, To: n.State}
		if n.Skip {
			out = append(out, d)
			continue
		}
		if n.State == StateRequired && n.DriverPod != nil && n.DriverPod.InSync && n.Annotations[AnnotationRequested] != "true" && n.MoveTo() == "" {
			// The spec came back to what the node runs (an undo before it
			// started): nothing to do.
			d.To = StateDone
			if n.Annotations[AnnotationInitialUnsched] != "" {
				d.Annotate(AnnotationInitialUnsched, "")
			}
			clearFailure(&d, n)
			out = append(out, d)
			continue
		}
		if n.State == StateRequired {
			// Entering the machine costs a slot unless the node is already
			// out of service; the rollout may hold it (Track).
			free := n.Unschedulable || n.NotReady
			if n.Held == "" && (free || slots > 0) {
				if !free {
					slots--
				}
				d.To = StateCordon
				if restartOnly(n) {
					// Same config digest: replace the pod in place, within
					// the budget and validated, with no cordon or eviction.
					d.To = StatePodRestart
					d.Annotate(AnnotationRestartOnly, "true")
				}
				if n.Annotations[AnnotationRequested] != "" {
					d.Annotate(AnnotationRequested, "")
				}
			}
			clearFailure(&d, n)
			out = append(out, d)
			continue
		}
		out = append(out, Step(n, p, now))
	}
	for i := range out {
		stampSince(&out[i], now)
	}
	return out
}

// Step is Decide's decision for a node that is not entering the machine
// (any state but upgrade-required): it depends on that node alone, not on
// the budget or the other nodes. The controller decides with it each node
// whose pods it lists as soon as they are listed, so one node's step never
// waits for another node's listing (docs/design.md, "One node's step").
// A skipped node, or one waiting to enter, gets no change: those are
// Decide's.
func Step(n Node, p Policy, now time.Time) Decision {
	d := Decision{Node: n.Name, From: n.State, To: n.State}
	if n.Skip || n.State == StateRequired {
		return d
	}
	next(&d, n, p, now)
	clearFailure(&d, n)
	stampSince(&d, now)
	return d
}

// stampSince records when a node changes state, written with the state in
// the same patch: no request of its own. Stamping twice is harmless (the
// same value).
func stampSince(d *Decision, now time.Time) {
	if d.From != d.To {
		d.Annotate(AnnotationStateSince, stamp(now))
		if d.To == StateUnknown {
			d.Annotate(AnnotationStateSince, "")
		}
	}
}

// restartOnly: the node may take the restart-only path. Not for a move (the
// driver changes hands) nor a requested upgrade (an admin asked for the
// whole machine).
func restartOnly(n Node) bool {
	return n.DriverPod != nil && n.DriverPod.RestartOnly && n.MoveTo() == "" && n.Annotations[AnnotationRequested] != "true"
}

// onRestartOnlyPath: the node started on the restart-only path.
func onRestartOnlyPath(n Node) bool { return n.Annotations[AnnotationRestartOnly] == "true" }

func startedAt(n Node, key string) (time.Time, bool) {
	v := n.Annotations[key]
	if v == "" {
		return time.Time{}, false
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

func stamp(now time.Time) string { return strconv.FormatInt(now.Unix(), 10) }

// clock is how long the step timed by the annotation key has run; a step not
// started yet starts now (and has run for 0).
func clock(d *Decision, n Node, key string, now time.Time) time.Duration {
	start, ok := startedAt(n, key)
	if !ok {
		d.Annotate(key, stamp(now))
		return 0
	}
	return now.Sub(start)
}

// afterValidation is where a validated node goes: uncordon, unless it was
// cordoned before the upgrade started (then it stays as the admin left it).
func afterValidation(d *Decision, n Node) {
	if onRestartOnlyPath(n) {
		d.To = StateDone // never cordoned by us
		d.Annotate(AnnotationRestartOnly, "")
		return
	}
	if n.Annotations[AnnotationInitialUnsched] == "true" {
		d.To = StateDone
		d.Annotate(AnnotationInitialUnsched, "")
		return
	}
	d.To = StateUncordon
}

func fail(d *Decision, p Policy, reason string) {
	d.To = StateFailed
	d.Reason = reason
	if len(reason) > maxFailureReason {
		reason = reason[:maxFailureReason-3] + "..."
	}
	d.Annotate(AnnotationFailure, reason)
	if p.Revision != "" {
		d.Annotate(AnnotationFailedRevision, p.Revision)
	}
}

// clearFailure drops the failure reason of a node that left upgrade-failed.
func clearFailure(d *Decision, n Node) {
	if d.To == StateFailed {
		return
	}
	for _, k := range []string{AnnotationFailure, AnnotationFailedRevision} {
		if n.Annotations[k] != "" {
			d.Annotate(k, "")
		}
	}
}
