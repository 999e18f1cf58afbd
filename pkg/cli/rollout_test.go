package cli

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func waitDS(image string, desired, updated, available int32, observed int64) appsv1.DaemonSet {
	return appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ds-a", Generation: 2, OwnerReferences: []metav1.OwnerReference{{Kind: "NVIDIADriver", Name: "d", UID: "u", Controller: ptr.To(true)}}},
		Spec:       appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: image}}}}},
		Status:     appsv1.DaemonSetStatus{ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: available},
	}
}

func waitNode(name, state string, requested bool) metav1.PartialObjectMetadata {
	n := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{plan.LabelOwner: "d"}, Annotations: map[string]string{}}}
	if state != "" {
		n.Labels[plan.LabelUpgradeState] = state
	}
	if requested {
		n.Annotations[upgrade.AnnotationRequested] = "true"
	}
	return n
}

func waitPod(image string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds-a", Controller: ptr.To(true)}}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Image: image}}},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// What `upgrade --wait` decides from one observation, for our controller's
// status and for NVIDIA's (no observedGeneration).
func TestWaitJudge(t *testing.T) {
	const newImg, oldImg = "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04", "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04"
	ours := func(state v1alpha1.State, observed int64) *v1alpha1.NVIDIADriver {
		return &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "u", Generation: 5},
			Status: v1alpha1.NVIDIADriverStatus{State: state, ObservedGeneration: observed}}
	}
	nvidia := func(state v1alpha1.State) *v1alpha1.NVIDIADriver { return ours(state, 0) }
	whole := waitTarget{name: "d", version: "550.90.07", autoUpgrade: true}
	nodesOnly := waitTarget{name: "d", version: "550.90.07", autoUpgrade: false, nodes: []string{"n1"}}
	for _, tc := range []struct {
		name string
		t    waitTarget
		o    observation
		want string
	}{
		{"rolled, our controller caught up", whole, observation{driver: ours(v1alpha1.Ready, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 2, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeDone, false), waitNode("n2", plan.UpgradeDone, false)}}, endDone},
		{"our status is of an older generation", whole, observation{driver: ours(v1alpha1.Ready, 4), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 2, 2, 2)}}, ""},
		{"NVIDIA: no observedGeneration, DaemonSets rolled", whole, observation{driver: nvidia(v1alpha1.Ready), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 2, 2, 2)}}, endDone},
		{"NVIDIA: DaemonSet not yet on the new version", whole, observation{driver: nvidia(v1alpha1.Ready), daemonSets: []appsv1.DaemonSet{waitDS(oldImg, 2, 2, 2, 2)}}, ""},
		{"nodes without an upgrade state are not in flight", whole, observation{driver: nvidia(v1alpha1.Ready), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 1, 1, 1, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", "", false)}}, endDone},
		{"pods still rolling", whole, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 1, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", "pod-restart-required", false)}}, ""},
		{"a failed node ends it once nothing is in flight", whole, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 1, 1, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeFailed, false), waitNode("n2", plan.UpgradeDone, false)}}, endFailed},
		{"a halted rollout ends it: no other node will start", whole, observation{driver: inRollout(ours(v1alpha1.NotReady, 5), v1alpha1.RolloutHalted), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 3, 1, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeFailed, false), waitNode("n2", upgrade.StateRequired, false), waitNode("n3", plan.UpgradeDone, false)}}, endFailed},
		{"a failure within the budget does not end it while nodes wait", whole, observation{driver: inRollout(ours(v1alpha1.NotReady, 5), v1alpha1.RolloutProgressing), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 3, 1, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeFailed, false), waitNode("n2", upgrade.StateRequired, false)}}, ""},
		{"never reconciled is never done", whole, observation{driver: nvidia("")}, ""},
		{"autoUpgrade off: the DaemonSets carry the version, nodes wait", waitTarget{name: "d", version: "550.90.07"},
			observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 0, 2, 2)}}, endHeld},
		{"same version, everything in place: nothing to do", waitTarget{name: "d", version: "550.90.07", autoUpgrade: true, alreadyThere: true},
			observation{driver: ours(v1alpha1.Ready, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 2, 2, 2)}}, endNothing},
		{"--nodes: the request not taken yet", nodesOnly, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 0, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeDone, true)}, pods: map[string]*corev1.Pod{"n1": waitPod(newImg, true)}}, ""},
		{"--nodes: done on the new template, the rest of the CR does not matter", nodesOnly, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 1, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeDone, false), waitNode("n2", upgrade.StateRequired, false)}, pods: map[string]*corev1.Pod{"n1": waitPod(newImg, true)}}, endDone},
		{"--nodes: done but its pod runs the old image", nodesOnly, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 2, 1, 2, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeDone, false)}, pods: map[string]*corev1.Pod{"n1": waitPod(oldImg, true)}}, ""},
		{"--nodes: no upgrade-state label (NVIDIA with upgrades off) and a fresh pod", nodesOnly, observation{driver: nvidia(v1alpha1.Ready), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 1, 1, 1, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", "", false)}, pods: map[string]*corev1.Pod{"n1": waitPod(newImg, true)}}, endDone},
		{"--nodes: the requested node failed", nodesOnly, observation{driver: ours(v1alpha1.NotReady, 5), daemonSets: []appsv1.DaemonSet{waitDS(newImg, 1, 0, 0, 2)},
			nodes: []metav1.PartialObjectMetadata{waitNode("n1", plan.UpgradeFailed, false)}}, endFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.o.pods == nil {
				tc.o.pods = map[string]*corev1.Pod{}
			}
			p := tc.t.judge(tc.o)
			if p.end != tc.want {
				t.Errorf("end = %q, want %q (line %q)", p.end, tc.want, p.line)
			}
		})
	}
}

func TestIsDowngrade(t *testing.T) {
	for _, tc := range []struct {
		from, to string
		want     bool
	}{
		{"550.90.07", "535.104.12", true}, {"535.104.12", "550.90.07", false}, {"550.90.07", "550.90.07", false},
		{"550.90.07", "550.90", true}, {"550.90", "550.90.07", false}, {"550.90.07", "sha256:ab", false}, {"535", "470", true},
	} {
		if got := isDowngrade(tc.from, tc.to); got != tc.want {
			t.Errorf("isDowngrade(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// inRollout gives the driver a rollout of its current spec in phase.
func inRollout(d *v1alpha1.NVIDIADriver, phase string) *v1alpha1.NVIDIADriver {
	_, rev := upgrade.RevisionOf(&d.Spec)
	d.Status.Rollout = &v1alpha1.RolloutStatus{Revision: rev, Phase: phase}
	return d
}

// The progress line names the canary wave and the nodes in flight, and a
// failed node's reason is at hand for the line said when it fails.
func TestWaitProgressLine(t *testing.T) {
	d := inRollout(&v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "u", Generation: 5},
		Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, ObservedGeneration: 5}}, v1alpha1.RolloutCanary)
	d.Status.Rollout.CanaryNodes = []string{"n1"}
	failed := waitNode("n2", plan.UpgradeFailed, false)
	failed.Annotations[upgrade.AnnotationFailure] = "the new driver pod did not become Ready"
	p := waitTarget{name: "d", version: "550.90.07", autoUpgrade: true}.judge(observation{driver: d,
		daemonSets: []appsv1.DaemonSet{waitDS("nvcr.io/nvidia/driver:550.90.07-ubuntu22.04", 3, 0, 2, 2)},
		nodes:      []metav1.PartialObjectMetadata{waitNode("n1", upgrade.StatePodRestart, false), failed, waitNode("n3", upgrade.StateRequired, false)}})
	for _, want := range []string{"canary wave (n1): ", "in flight: n1(pod-restart-required)"} {
		if !strings.Contains(p.line, want) {
			t.Errorf("line %q lacks %q", p.line, want)
		}
	}
	if p.reasons["n2"] != "the new driver pod did not become Ready" {
		t.Errorf("reasons %v", p.reasons)
	}
}
