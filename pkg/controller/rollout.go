package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	EventRolledBack      = "RolloutRolledBack"
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
	prev := d.Status.Rollout
	paced, err := r.writeRollout(ctx, d, g)
	if err != nil {
		return g, err
	}
	if paced > 0 && (g.WakeAt.IsZero() || now.Add(paced).Before(g.WakeAt)) {
		g.WakeAt = now.Add(paced) // the counts held back are written then
	}
	if g.Halted && policy.AutoRollback {
		first := prev == nil || prev.Phase != v1alpha1.RolloutHalted || prev.Revision != g.Status.Revision
		if err := r.rollBack(ctx, d, g.Status, first); err != nil {
			return g, err
		}
	}
	return g, nil
}

// rollBack is spec.upgradePolicy.autoRollback: a halted rollout puts the
// newest fully rolled-out revision unlike the one halted back on the CR, as
// `rollout undo` does, and the machine rolls it out. With none recorded it
// says so once and the rollout stays halted.
func (r *UpgradeReconciler) rollBack(ctx context.Context, d *v1alpha1.NVIDIADriver, st v1alpha1.RolloutStatus, first bool) error {
	list := &appsv1.ControllerRevisionList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(r.Options.Namespace), client.MatchingLabels{v1alpha1.RevisionLabel: d.Name}); err != nil {
		return fmt.Errorf("listing revisions: %w", err)
	}
	var good *appsv1.ControllerRevision
	for i := range list.Items {
		cr := &list.Items[i]
		if ref := metav1.GetControllerOfNoCopy(cr); ref == nil || ref.UID != d.UID || cr.Name == RevisionName(d.Name, st.Revision) {
			continue
		}
		if good == nil || cr.Revision > good.Revision {
			good = cr
		}
	}
	if good == nil {
		if first {
			r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, EventRolloutHalted, "Rollback", "autoRollback: no earlier fully rolled-out revision to go back to; the rollout stays halted")
		}
		return nil
	}
	var rev map[string]any
	if err := json.Unmarshal(good.Data.Raw, &rev); err != nil {
		return fmt.Errorf("revision %s is not a spec: %w", good.Name, err)
	}
	body, err := upgrade.UndoPatch(&d.Spec, rev, d.ResourceVersion)
	if err != nil {
		return err
	}
	from := d.Spec.Version
	if err := r.Client.Patch(ctx, d, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager)); err != nil {
		if apierrors.IsConflict(err) {
			return errStatusConflict
		}
		return fmt.Errorf("rolling back to revision %d: %w", good.Revision, err)
	}
	to, _ := rev["version"].(string)
	r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, EventRolledBack, "Rollback", "rollout of revision %s halted (%d node(s) failed: %s); autoRollback put revision %d back (version %s -> %s)",
		st.Revision, st.Failed, failedList(st.FailedNodes), good.Revision, from, to)
	return nil
}

func holdNodes(ps *pass, g upgrade.Gate) {
	for i := range ps.inputs {
		ps.inputs[i].Held = g.Held[ps.inputs[i].Name]
	}
}

// writeRollout writes status.rollout and the RolloutHalted condition when
// they changed, with the CR's resourceVersion as a precondition (the driver
// controller writes the rest of the status), and tells of the transitions.
//
// Counts alone with no node in flight (nodes joining a rollout that is not
// moving) wait their turn (statusPacer), and paced says how long.
func (r *UpgradeReconciler) writeRollout(ctx context.Context, d *v1alpha1.NVIDIADriver, g upgrade.Gate) (paced time.Duration, err error) {
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
		return 0, nil
	}
	now := time.Now()
	if wait := r.pacer.holdBack(d.UID, writerRollout, d.Status, next.Status, now); wait > 0 {
		return wait, nil
	}
	waited := excludeFromCost(ctx)
	err = r.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(d, client.MergeFromWithOptimisticLock{}))
	waited()
	if err != nil {
		if apierrors.IsConflict(err) {
			statusWrites.WithLabelValues(writerRollout, "conflict").Inc()
			return 0, errStatusConflict
		}
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("writing status.rollout: %w", err)
	}
	r.pacer.written(d.UID, writerRollout, now)
	r.rolloutEvents(d, prev, &g.Status)
	d.Status = next.Status
	d.ResourceVersion = next.ResourceVersion
	return 0, nil
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

func failedList(fs []v1alpha1.FailedNode) string {
	names := make([]string, 0, len(fs))
	for _, f := range fs {
		names = append(names, f.Node)
	}
	return strings.Join(names, ", ")
}
