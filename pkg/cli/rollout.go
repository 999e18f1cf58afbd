package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// waitTarget is what `upgrade --wait` was asked to follow. Completion is
// judged only from what both backends expose (the DaemonSets' generation and
// counts, the driver pods' images, the nodes' upgrade states); our
// controller's status.observedGeneration is used when present, never required:
// NVIDIA's operator does not set it.
type waitTarget struct {
	name        string
	version     string
	nodes       []string // --nodes: follow these only
	autoUpgrade bool
	// alreadyThere: the command changed nothing (same version, no nodes).
	alreadyThere bool
}

// observation is one read of the cluster for a waitTarget.
type observation struct {
	driver     *v1alpha1.NVIDIADriver
	daemonSets []appsv1.DaemonSet // owned by the driver
	nodes      []metav1.PartialObjectMetadata
	// pods are the driver pods of the --nodes nodes, by node name.
	pods map[string]*corev1.Pod
}

const (
	endDone    = "done"
	endFailed  = "failed"
	endNothing = "nothing"
	endHeld    = "held"
)

// progress is the outcome of judging an observation.
type progress struct {
	end     string // "" while it goes on
	total   int
	done    int
	failed  []string
	line    string
	note    string
	version string
	// reasons are the failed nodes' reasons (the node annotation), for the
	// failures said as they happen.
	reasons map[string]string
}

func readObservation(ctx context.Context, c client.Client, name, namespace string, only []string) (observation, error) {
	o := observation{driver: &v1alpha1.NVIDIADriver{}, pods: map[string]*corev1.Pod{}}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, o.driver); err != nil {
		return o, err
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := c.List(ctx, list, client.MatchingLabels{plan.LabelOwner: name}); err != nil {
		return o, err
	}
	o.nodes = list.Items
	sel, _ := metav1.LabelSelectorAsSelector(&doctor.DriverPodSelector)
	dss := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dss, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(namespace)); err != nil {
		return o, err
	}
	for _, ds := range dss.Items {
		if ref := metav1.GetControllerOf(&ds); ref != nil && ref.Kind == "NVIDIADriver" && ref.UID == o.driver.UID {
			o.daemonSets = append(o.daemonSets, ds)
		}
	}
	for _, n := range only {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(namespace),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", n)}); err != nil {
			return o, err
		}
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp == nil {
				o.pods[n] = &pods.Items[i]
			}
		}
	}
	return o, nil
}

// judge decides whether what was asked is done, failed or still going on.
func (t waitTarget) judge(o observation) progress {
	p := progress{version: t.version, reasons: map[string]string{}}
	states := map[string]int{}
	inFlight := 0
	var moving []string // in the machine past upgrade-required, with their state
	considered := map[string]bool{}
	for _, n := range t.nodes {
		considered[n] = true
	}
	for _, n := range o.nodes {
		if len(t.nodes) > 0 && !considered[n.Name] {
			continue
		}
		st := n.Labels[plan.LabelUpgradeState]
		if st != "" {
			states[st]++
		}
		switch {
		case st == plan.UpgradeFailed:
			p.failed = append(p.failed, n.Name)
			p.reasons[n.Name] = n.Annotations[upgrade.AnnotationFailure]
		case st != "" && st != plan.UpgradeDone:
			inFlight++
			if upgrade.InProgress(st) {
				moving = append(moving, n.Name+"("+st+")")
			}
		}
	}
	sort.Strings(p.failed)

	dsCurrent, dsRolled := true, true
	var desired, updated int32
	for _, ds := range o.daemonSets {
		img := ""
		if cs := ds.Spec.Template.Spec.Containers; len(cs) > 0 {
			img = cs[0].Image
		}
		if !imageHasVersion(img, t.version) || ds.Status.ObservedGeneration < ds.Generation {
			dsCurrent = false
		}
		s := ds.Status
		if s.DesiredNumberScheduled != s.UpdatedNumberScheduled || s.DesiredNumberScheduled != s.NumberAvailable {
			dsRolled = false
		}
		desired += s.DesiredNumberScheduled
		updated += min(s.UpdatedNumberScheduled, s.NumberAvailable)
	}
	if len(o.daemonSets) == 0 && len(o.nodes) > 0 {
		dsCurrent, dsRolled = false, false // the pools are not created yet
	}
	dsRolled = dsRolled && dsCurrent
	d := o.driver
	// Our controller says which generation its status describes; NVIDIA's
	// does not (its CRD prunes the field), and then the DaemonSets decide.
	controllerCurrent := d.Status.ObservedGeneration == 0 || d.Status.ObservedGeneration == d.Generation
	// Both backends write status.state; a CR no controller ever reconciled
	// is never "done".
	ready := controllerCurrent && d.Status.State == v1alpha1.Ready

	// Our controller's rollout: halted means no other node will start (the
	// failures are final for this wait); a wait for a person is said.
	halted, waits := false, ""
	if r := d.Status.Rollout; r != nil && controllerCurrent {
		if _, rev := upgrade.RevisionOf(&d.Spec); r.Revision == rev {
			switch r.Phase {
			case v1alpha1.RolloutHalted:
				halted = true
			case v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking, v1alpha1.RolloutPaused:
				waits = "; rollout " + r.Phase + ": " + r.Message
			}
		}
	}
	if len(t.nodes) > 0 {
		return t.judgeNodes(o, p, states, inFlight, dsCurrent)
	}
	p.total, p.done = int(desired), int(updated)
	p.line = fmt.Sprintf("%s%d/%d driver pods updated%s; %s%s%s", wave(d), updated, desired, stateSummary(states), readyWord(ready && dsRolled), inFlightNames(moving), waits)
	switch {
	case len(p.failed) > 0 && (inFlight == 0 || halted):
		p.end = endFailed
	case t.alreadyThere && dsRolled && inFlight == 0 && ready:
		p.end, p.note = endNothing, fmt.Sprintf("already at version %s, and every driver pod runs it", t.version)
	case !t.autoUpgrade && !t.alreadyThere && dsCurrent && controllerCurrent:
		p.end = endHeld
	case t.autoUpgrade && dsRolled && inFlight == 0 && ready:
		p.end, p.note = endDone, fmt.Sprintf("%d driver pod(s) on version %s, driver ready", desired, t.version)
	}
	return p
}

// judgeNodes follows --nodes: each node is finished once the controller took
// the request (the annotation is gone), left the machine, and its driver pod
// runs its DaemonSet's current template and is Ready.
func (t waitTarget) judgeNodes(o observation, p progress, states map[string]int, inFlight int, dsCurrent bool) progress {
	byName := map[string]metav1.PartialObjectMetadata{}
	for _, n := range o.nodes {
		byName[n.Name] = n
	}
	dsImage := map[string]string{}
	for _, ds := range o.daemonSets {
		if cs := ds.Spec.Template.Spec.Containers; len(cs) > 0 {
			dsImage[ds.Name] = cs[0].Image
		}
	}
	p.total = len(t.nodes)
	var waiting []string
	for _, name := range t.nodes {
		n := byName[name]
		st := n.Labels[plan.LabelUpgradeState]
		pod := o.pods[name]
		fresh := pod != nil && podReady(pod) && len(pod.Spec.Containers) > 0 && dsCurrent
		if fresh {
			ref := metav1.GetControllerOf(pod)
			fresh = ref != nil && dsImage[ref.Name] != "" && dsImage[ref.Name] == pod.Spec.Containers[0].Image
		}
		if n.Annotations[upgrade.AnnotationRequested] == "" && (st == "" || st == plan.UpgradeDone) && fresh {
			p.done++
		} else if st != plan.UpgradeFailed {
			waiting = append(waiting, name)
		}
	}
	p.line = fmt.Sprintf("%d/%d requested node(s) done%s", p.done, p.total, stateSummary(states))
	switch {
	case len(p.failed) > 0 && len(waiting) == 0:
		p.end = endFailed
	case p.done == p.total:
		p.end, p.note = endDone, fmt.Sprintf("%s run(s) the current driver", strings.Join(t.nodes, ", "))
	}
	return p
}

// wave names the canary wave while it runs ("" otherwise).
func wave(d *v1alpha1.NVIDIADriver) string {
	r := d.Status.Rollout
	if r == nil || len(r.CanaryNodes) == 0 || r.Promoted || r.Phase == v1alpha1.RolloutComplete {
		return ""
	}
	return fmt.Sprintf("canary wave (%s): ", strings.Join(r.CanaryNodes, ", "))
}

// inFlightNames lists the nodes in the machine with their states (at most 5).
func inFlightNames(moving []string) string {
	if len(moving) == 0 {
		return ""
	}
	sort.Strings(moving)
	more := ""
	if len(moving) > 5 {
		more = fmt.Sprintf(" and %d more", len(moving)-5)
		moving = moving[:5]
	}
	return "; in flight: " + strings.Join(moving, ", ") + more
}

func imageHasVersion(image, version string) bool {
	return strings.Contains(image, ":"+version+"-") || strings.HasSuffix(image, ":"+version) || strings.HasSuffix(image, "@"+version)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func stateSummary(states map[string]int) string {
	if len(states) == 0 {
		return ""
	}
	keys := make([]string, 0, len(states))
	for k := range states {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, states[k])
	}
	return "; nodes " + strings.Join(parts, " ")
}

func readyWord(ready bool) string {
	if ready {
		return "driver ready"
	}
	return "driver notReady"
}
