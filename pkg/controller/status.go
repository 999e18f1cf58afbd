package controller

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Condition types and reasons (NVIDIA's, plus ours where docs/design.md, "Readiness", adds them).
const (
	CondReady = v1alpha1.ConditionReady
	CondError = v1alpha1.ConditionError

	ReasonReconciled      = "Reconciled"
	ReasonNoMatchingNodes = "NoMatchingNodes"
	ReasonDriverNotReady  = "DriverNotReady"
	ReasonUpgrading       = "Upgrading"
	ReasonReady           = "Ready"
	ReasonReconcileFailed = "ReconcileFailed"
)

// statusInput is what the status of one CR is computed from.
type statusInput struct {
	Driver     *v1alpha1.NVIDIADriver
	Plan       *plan.Driver
	DaemonSets map[string]*appsv1.DaemonSet // by name; nil entry = not created yet
	// Nodes are what the status reads of each pool's nodes, in the
	// order of Plan.Pools (snapshot.poolNodesOf; nil: no states, and no
	// node on its way in).
	Nodes     []poolNodes
	Namespace string
	Failure   error // an error reconciling (API failure)
	// Images is the registry check of the pools being rolled out (nil: off).
	Images *imageVerdict
}

// computeStatus is the CR's status as docs/design.md, "Readiness", defines it. It is
// pure, so it is unit-tested and the same inputs always give the same status.
func computeStatus(in statusInput) v1alpha1.NVIDIADriverStatus {
	old := in.Driver.Status
	st := v1alpha1.NVIDIADriverStatus{
		ObservedGeneration: in.Driver.Generation,
		Namespace:          in.Namespace,
		Conditions:         append([]metav1.Condition(nil), old.Conditions...),
		Rollout:            old.Rollout, // the upgrade reconciler's
	}
	pd := in.Plan
	var prog progressCounts
	for i, pool := range pd.Pools {
		var nodes poolNodes
		if i < len(in.Nodes) {
			nodes = in.Nodes[i]
		}
		st.Pools = append(st.Pools, poolStatus(in, pool, nodes, &prog))
	}
	setConditions(&st, pd, in.Failure, prog)
	setImageCondition(&st, in.Images, &prog)
	sortConditions(st.Conditions)
	return st
}

// sortConditions puts conditions in the one order both status writers use
// (the driver and the upgrade reconcilers): a different order would be a
// change, and each would rewrite the other's.
func sortConditions(cs []metav1.Condition) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].Type > cs[j].Type })
}

// progressCounts add up the pools: nodes upgrading, done, failed and in all,
// and what keeps the driver from Ready.
type progressCounts struct {
	upgrading, done, failed, total int
	notReady                       []string
	held                           []string // pools waiting for a missing image
}

// poolStatus is one pool's status from its DaemonSet and its nodes' states.
func poolStatus(in statusInput, pool plan.Pool, nodes poolNodes, prog *progressCounts) v1alpha1.PoolStatus {
	ps := v1alpha1.PoolStatus{OSTag: pool.OSTag, Kernel: pool.Kernel, DaemonSet: pool.DaemonSet, Image: pool.Image,
		Nodes: int32(len(pool.Nodes))}
	ds := in.DaemonSets[pool.DaemonSet]
	if ds != nil {
		s := ds.Status
		ps.Desired, ps.Ready, ps.Updated, ps.Available = s.DesiredNumberScheduled, s.NumberReady, s.UpdatedNumberScheduled, s.NumberAvailable
	}
	if nodes.pending > 0 {
		prog.notReady = append(prog.notReady, fmt.Sprintf("%s: %d node(s) not yet handed to this driver", pool.DaemonSet, nodes.pending))
	}
	prog.total += len(pool.Nodes)
	if counts := nodes.states; len(counts) > 0 {
		ps.Upgrade = counts
		for state, n := range counts {
			if state != plan.UpgradeDone {
				prog.upgrading += int(n)
			}
		}
		prog.done += int(counts[plan.UpgradeDone])
		prog.failed += int(counts[plan.UpgradeFailed])
	}
	if in.Images.isHeld(pool.DaemonSet) {
		prog.held = append(prog.held, pool.DaemonSet)
	}
	switch {
	case ds == nil:
		prog.notReady = append(prog.notReady, pool.DaemonSet+" not created yet")
	case ds.Status.ObservedGeneration != ds.Generation:
		prog.notReady = append(prog.notReady, pool.DaemonSet+" not yet observed by the DaemonSet controller")
	case !rolledOut(ds):
		prog.notReady = append(prog.notReady, fmt.Sprintf("%s %d/%d available, %d/%d updated", pool.DaemonSet, ps.Available, ps.Desired, ps.Updated, ps.Desired))
	}
	return ps
}

// setConditions sets Error and Ready and the state (docs/design.md, "Readiness").
func setConditions(st *v1alpha1.NVIDIADriverStatus, pd *plan.Driver, failure error, prog progressCounts) {
	setError := func(reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondError, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: st.ObservedGeneration})
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondReady, Status: metav1.ConditionFalse, Reason: "Error", Message: msg, ObservedGeneration: st.ObservedGeneration})
		st.State = v1alpha1.NotReady
	}
	switch {
	case pd.Error != nil:
		setError(pd.Error.Reason, pd.Error.Message)
	case failure != nil:
		setError(ReasonReconcileFailed, failure.Error())
	default:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondError, Status: metav1.ConditionFalse, Reason: ReasonReady, ObservedGeneration: st.ObservedGeneration})
		reason, msg, status := ReasonReconciled, "All resources have been successfully reconciled", metav1.ConditionTrue
		switch {
		case len(pd.Pools) == 0:
			reason, msg = ReasonNoMatchingNodes, noNodesMessage(pd)
		case prog.upgrading > 0:
			msg = fmt.Sprintf("upgrading: %d/%d nodes done", prog.done, prog.total)
			if prog.failed > 0 {
				msg += fmt.Sprintf(", %d failed", prog.failed)
			}
			reason, status = ReasonUpgrading, metav1.ConditionFalse
		case len(prog.notReady) > 0:
			reason, msg, status = ReasonDriverNotReady, "Waiting for driver pod to be ready: "+strings.Join(prog.notReady, "; "), metav1.ConditionFalse
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: st.ObservedGeneration})
		st.State = v1alpha1.Ready
		if status != metav1.ConditionTrue {
			st.State = v1alpha1.NotReady
		}
	}
}

func noNodesMessage(pd *plan.Driver) string {
	if len(pd.Skipped) == 0 {
		return "No GPU node is selected by this NVIDIADriver"
	}
	reasons := map[string]int{}
	for _, s := range pd.Skipped {
		reasons[s.Reason]++
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", reasons[k], k)
	}
	return "No GPU node needs a driver from this NVIDIADriver; skipped: " + strings.Join(parts, ", ")
}

// setImageCondition sets ImageAvailable (removed when the check is off), and
// makes a held pool the reason the driver is not Ready: its nodes run the
// old driver, not the one the CR asks for.
func setImageCondition(st *v1alpha1.NVIDIADriverStatus, v *imageVerdict, prog *progressCounts) {
	if v != nil && v.keep {
		return
	}
	c := v.condition(st.ObservedGeneration)
	if c == nil {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionImageAvailable)
		return
	}
	meta.SetStatusCondition(&st.Conditions, *c)
	if len(prog.held) == 0 {
		return
	}
	if ready := meta.FindStatusCondition(st.Conditions, CondReady); ready != nil && ready.Reason == "Error" {
		return // an error says more
	}
	msg := fmt.Sprintf("Holding %s: %s", strings.Join(prog.held, ", "), c.Message)
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondReady, Status: metav1.ConditionFalse, Reason: imagecheck.ReasonMissing, Message: msg, ObservedGeneration: st.ObservedGeneration})
	st.State = v1alpha1.NotReady
}

// rolledOut is a pool's DaemonSet's share of the CR's readiness
// (docs/design.md, "Readiness"): its generation observed, and desired ==
// updated == available.
func rolledOut(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration == ds.Generation && s.DesiredNumberScheduled == s.UpdatedNumberScheduled && s.DesiredNumberScheduled == s.NumberAvailable
}
