package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// Rollout condition and event reasons (docs/design.md, "Rollouts").
const (
	ReasonHalted      = "FailureBudgetSpent"
	ReasonWithinBudge = "WithinFailureBudget"

	EventRolloutHalted   = "RolloutHalted"
	EventCanaryDone      = "CanaryDone"
	EventRolloutComplete = "RolloutComplete"
	EventRolloutResumed  = "RolloutResumed"
)

// errStatusConflict: the CR changed since the pass read it; the pass runs
// again on the fresh object rather than act on a stale rollout.
var errStatusConflict = fmt.Errorf("status changed under the pass")

// trackRollout runs upgrade.Track for the pass and holds the nodes it says
// may not start. It writes status.rollout before any node acts on it: the
// canary chosen is on the CR before a canary node moves, so a restarted
// controller never chooses another.
func (r *UpgradeReconciler) trackRollout(ctx context.Context, d *v1alpha1.NVIDIADriver, ps *pass, policy upgrade.Policy, now time.Time) (upgrade.Gate, error) {
	if d.DeletionTimestamp != nil {
		// Its nodes leave through the machine; there is no rollout to gate
		// (and deleting bumps the generation the driver reconciler no longer
		// reports).
		return upgrade.Gate{}, nil
	}
	if d.Status.ObservedGeneration != d.Generation {
		// The DaemonSets may not show the new spec yet: judging the rollout
		// now could call it complete, or choose no canary. Hold every node
		// about to start until the driver controller has applied it (moves
		// are never held: see upgrade.Track).
		g := upgrade.Gate{Held: map[string]string{}}
		for _, in := range ps.inputs {
			if in.State == upgrade.StateRequired && in.MoveTo() == "" {
				g.Held[in.Name] = "the new spec is not applied yet"
			}
		}
		holdNodes(ps, g)
		return g, nil
	}
	g := upgrade.Track(ps.inputs, policy, d.Status.Rollout, d.Annotations[upgrade.AnnotationResumedAt], now)
	holdNodes(ps, g)
	if g.Status.Phase == v1alpha1.RolloutComplete && (d.Status.Rollout == nil || d.Status.Rollout.Phase != v1alpha1.RolloutComplete || d.Status.Rollout.Revision != g.Status.Revision) {
		// Recorded before the status says complete: a crash in between
		// records it again on the next pass (recording is idempotent).
		if err := r.recordRevision(ctx, d, g.Status); err != nil {
			return g, err
		}
	}
	if err := r.writeRollout(ctx, d, g); err != nil {
		return g, err
	}
	return g, nil
}

func holdNodes(ps *pass, g upgrade.Gate) {
	for i := range ps.inputs {
		ps.inputs[i].Held = g.Held[ps.inputs[i].Name]
	}
}

// writeRollout writes status.rollout and the RolloutHalted condition when
// they changed, with the CR's resourceVersion as a precondition (the driver
// controller writes the rest of the status), and tells of the transitions.
func (r *UpgradeReconciler) writeRollout(ctx context.Context, d *v1alpha1.NVIDIADriver, g upgrade.Gate) error {
	prev := d.Status.Rollout
	next := d.DeepCopy()
	next.Status.Rollout = &g.Status
	cond := metav1.Condition{Type: v1alpha1.ConditionRolloutHalted, Status: metav1.ConditionFalse, Reason: ReasonWithinBudge,
		Message: "failed nodes are within spec.upgradePolicy.failureBudget", ObservedGeneration: d.Generation}
	if g.Halted {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonHalted, g.Status.Message
	}
	meta.SetStatusCondition(&next.Status.Conditions, cond)
	sortConditions(next.Status.Conditions)
	if equality.Semantic.DeepEqual(d.Status, next.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(d, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return errStatusConflict
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status.rollout: %w", err)
	}
	r.rolloutEvents(d, prev, &g.Status)
	d.Status = next.Status
	d.ResourceVersion = next.ResourceVersion
	return nil
}

// rolloutEvents tells of a rollout's turning points, each once.
func (r *UpgradeReconciler) rolloutEvents(d *v1alpha1.NVIDIADriver, prev, st *v1alpha1.RolloutStatus) {
	was := ""
	if prev != nil && prev.Revision == st.Revision {
		was = prev.Phase
	}
	if prev != nil && prev.Revision == st.Revision && st.ResumedAt != prev.ResumedAt {
		msg := "rollout resumed"
		if len(st.AcceptedFailures) > 0 {
			msg += "; failed nodes no longer counted: " + strings.Join(st.AcceptedFailures, ", ")
		}
		r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventRolloutResumed, "Rollout", "%s", msg)
	}
	if st.Phase == was {
		return
	}
	switch st.Phase {
	case v1alpha1.RolloutHalted:
		r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, EventRolloutHalted, "Rollout", "%s", st.Message)
	case v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking:
		if st.CanaryDoneAt != nil {
			r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventCanaryDone, "Rollout", "%s", st.Message)
		}
	case v1alpha1.RolloutComplete:
		if was != "" { // not for a CR first seen complete
			r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventRolloutComplete, "Rollout", "revision %s on all %d node(s) in %s",
				st.Revision, st.Total, st.CompletedAt.Sub(st.StartedAt.Time).Round(time.Second))
		}
	}
}
