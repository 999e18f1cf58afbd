package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The rollout types are ours, not NVIDIA's: spec.upgradePolicy.canary and
// status.rollout (docs/design.md, "Rollouts").

// Canary promotions.
const (
	PromotionManual    = "Manual"
	PromotionAutomatic = "Automatic"
)

// CanarySpec is the first wave of a rollout.
// +kubebuilder:validation:XValidation:rule="!has(self.bakeSeconds) || self.promotion == 'Automatic'",message="spec.upgradePolicy.canary.bakeSeconds applies only with promotion: Automatic (Manual waits for kubectl nvdriver rollout resume)"
type CanarySpec struct {
	// Nodes is how many of the CR's nodes go first: a number or a percentage
	// (rounded up, at least 1), chosen in name order among those matching Selector.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="spec.upgradePolicy.canary.nodes must be a number of nodes (at least 1) or a percentage from 1% to 100%"
	Nodes intstr.IntOrString `json:"nodes"`
	// Selector picks the nodes that may be canaries; all of the CR's nodes when absent.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Promotion is Manual (wait for `kubectl nvdriver rollout resume`) or
	// Automatic (go on once the canary has run BakeSeconds with no failure).
	// +kubebuilder:validation:Enum=Manual;Automatic
	// +kubebuilder:default=Manual
	// +optional
	Promotion string `json:"promotion,omitempty"`
	// BakeSeconds is how long the canary runs before an Automatic promotion. Default 300.
	// +kubebuilder:validation:Minimum=0
	// +optional
	BakeSeconds *int32 `json:"bakeSeconds,omitempty"`
}

// Rollout phases.
const (
	RolloutProgressing = "Progressing"
	RolloutCanary      = "Canary"
	RolloutWaiting     = "WaitingForPromotion"
	RolloutBaking      = "Baking"
	RolloutPaused      = "Paused"
	RolloutHalted      = "Halted"
	RolloutComplete    = "Complete"
)

// RolloutStatus is one rollout: the spec revision it brings to the nodes, its
// wave and counts, and why it waits.
type RolloutStatus struct {
	// Revision is the hash of the driver fields being rolled out (the spec
	// without nodeSelector, default and upgradePolicy).
	Revision string `json:"revision"`
	// Phase is Canary, WaitingForPromotion, Baking, Progressing, Paused, Halted or Complete.
	Phase string `json:"phase"`
	// Message says what the rollout waits for, when it waits.
	// +optional
	Message string `json:"message,omitempty"`
	// StartedAt is when the controller first saw this revision.
	StartedAt metav1.Time `json:"startedAt"`
	// CompletedAt is when every node was upgrade-done on this revision.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// CanaryNodes are the nodes of the first wave, chosen when the rollout started.
	// +optional
	CanaryNodes []string `json:"canaryNodes,omitempty"`
	// CanaryDoneAt is when the last canary node finished.
	// +optional
	CanaryDoneAt *metav1.Time `json:"canaryDoneAt,omitempty"`
	// Promoted: the canary was promoted (resume, or the bake time passed).
	// +optional
	Promoted bool `json:"promoted,omitempty"`
	// ResumedAt is the last `rollout resume` the controller acted on (the
	// value of the nvdriver.io/rollout-resumed-at annotation).
	// +optional
	ResumedAt string `json:"resumedAt,omitempty"`
	// AcceptedFailures are failed nodes a resume let the rollout go on past;
	// they no longer count against the failure budget.
	// +optional
	AcceptedFailures []string `json:"acceptedFailures,omitempty"`
	// Node counts of the rollout: all, done on this revision, in the machine, failed.
	Total    int32 `json:"total"`
	Done     int32 `json:"done"`
	InFlight int32 `json:"inFlight"`
	Failed   int32 `json:"failed"`
	// FailedNodes name the failed nodes and why (at most 10).
	// +optional
	FailedNodes []FailedNode `json:"failedNodes,omitempty"`
	// Pools say, per driver DaemonSet with nodes still to go, whether the
	// change is disruptive or restart-only there.
	// +optional
	Pools []RolloutPool `json:"pools,omitempty"`
}

// RolloutPool is one pool's share of a rollout.
type RolloutPool struct {
	DaemonSet string `json:"daemonSet"`
	// Change is disruptive (cordon, evict, restart) or restart-only (the
	// driver pods restart in place: the config digest is the same).
	Change string `json:"change"`
	// Pending are the pool's nodes not yet on the revision (waiting or in flight).
	Pending int32 `json:"pending"`
}

// FailedNode is one failed node and its reason.
type FailedNode struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}
