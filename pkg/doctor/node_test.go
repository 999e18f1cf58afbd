package doctor

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func gpuJob(name string, controlled bool, labels map[string]string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", Labels: labels},
		Spec: corev1.PodSpec{NodeName: "n-1", Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if controlled {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "j", Controller: ptr.To(true)}}
	}
	return p
}

// TestExplainNode: doctor node/NAME names what holds the node and the command.
func TestExplainNode(t *testing.T) {
	gold := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "550.90.07", NodeSelector: map[string]string{"d": "gold"}}}
	node := func(state string, ann map[string]string, cordoned bool) corev1.Node {
		n := gpuNode("n-1", "d", "gold", plan.LabelOwner, "gold")
		if state != "" {
			n.Labels[plan.LabelUpgradeState] = state
		}
		n.Annotations = ann
		n.Spec.Unschedulable = cordoned
		return n
	}
	blockingPDB := policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "train-pdb", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1}}
	waitingGold := gold.DeepCopy()
	waitingGold.Status.Rollout = &v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutWaiting, CanaryNodes: []string{"n-0"}, Message: "canary done on 1 node(s)"}
	jobsGold := gold.DeepCopy()
	jobsGold.Spec.UpgradePolicy = &v1alpha1.DriverUpgradePolicySpec{WaitForCompletion: &v1alpha1.WaitForCompletionSpec{PodSelector: "app=train"}}

	for _, tc := range []struct {
		name    string
		drivers []v1alpha1.NVIDIADriver
		node    corev1.Node
		in      NodeInputs
		want    []string // substrings of the findings' messages, in order after the first
		sev     string   // the worst severity
		fix     string   // in the last finding's fix
	}{
		{name: "a GPU pod a PodDisruptionBudget protects", drivers: []v1alpha1.NVIDIADriver{gold},
			node: node(upgrade.StatePodDeletion, map[string]string{upgrade.AnnotationStateSince: "0"}, true),
			in:   NodeInputs{Pods: []corev1.Pod{gpuJob("train-0", true, map[string]string{"app": "train"})}, PDBs: []policyv1.PodDisruptionBudget{blockingPDB}},
			want: []string{"n-1 waits: evicting GPU pods", "GPU pod ml/train-0 cannot be evicted: PodDisruptionBudget ml/train-pdb allows no disruption (1 healthy, 1 desired)"},
			sev:  Error, fix: "kubectl -n ml get pdb train-pdb -o wide"},
		{name: "a GPU pod without a controller under force: false", drivers: []v1alpha1.NVIDIADriver{gold},
			node: node(upgrade.StateFailed, map[string]string{upgrade.AnnotationFailure: "spec.upgradePolicy.podDeletion does not allow removing ml/bare"}, true),
			in:   NodeInputs{Pods: []corev1.Pod{gpuJob("bare", false, nil)}},
			want: []string{"n-1 waits: upgrade failed: spec.upgradePolicy.podDeletion does not allow removing ml/bare", "GPU pod ml/bare may not be removed: no controller would recreate it"},
			sev:  Error, fix: "kubectl -n ml delete pod bare"},
		{name: "a job still running under waitForCompletion", drivers: []v1alpha1.NVIDIADriver{*jobsGold},
			node: node(upgrade.StateWaitForJobs, nil, true), in: NodeInputs{Pods: []corev1.Pod{gpuJob("train-0", true, map[string]string{"app": "train"})}},
			want: []string{`waiting for the pods matching waitForCompletion.podSelector "app=train"`, "job ml/train-0 is still running"},
			sev:  Warning, fix: "kubectl -n ml get pod train-0"},
		{name: "a node waiting for the canary", drivers: []v1alpha1.NVIDIADriver{*waitingGold},
			node: node(upgrade.StateRequired, nil, false),
			want: []string{"n-1 waits: waiting for the canary: canary done on 1 node(s)"}, sev: Warning, fix: "kubectl nvdriver rollout resume gold"},
		{name: "a node no driver selects", drivers: []v1alpha1.NVIDIADriver{gold}, node: gpuNode("n-1"),
			want: nil, sev: Info, fix: "kubectl nvdriver assign NAME --nodes n-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Snapshot{Now: time.Unix(3600, 0), CRDInstalled: true, Namespace: "gpu-operator", Drivers: tc.drivers, Nodes: []corev1.Node{tc.node}}
			r := ExplainNode(s, "n-1", tc.in)
			var msgs []string
			worst := Info
			for _, f := range r.Findings {
				msgs = append(msgs, f.Message)
				if f.Severity == Error || (f.Severity == Warning && worst == Info) {
					worst = f.Severity
				}
			}
			all := strings.Join(msgs, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("findings lack %q:\n%s", w, all)
				}
			}
			if worst != tc.sev {
				t.Errorf("worst severity %s, want %s:\n%s", worst, tc.sev, all)
			}
			if last := r.Findings[len(r.Findings)-1]; !strings.Contains(last.Fix, tc.fix) {
				t.Errorf("last fix %q lacks %q", last.Fix, tc.fix)
			}
		})
	}
	// The node line says who cordoned it and for how long it has been in its state.
	s := &Snapshot{Now: time.Unix(3600, 0), CRDInstalled: true, Drivers: []v1alpha1.NVIDIADriver{gold},
		Nodes: []corev1.Node{node(upgrade.StatePodRestart, map[string]string{upgrade.AnnotationStateSince: "3000"}, true)}}
	if m := ExplainNode(s, "n-1", NodeInputs{}).Findings[0].Message; !strings.Contains(m, "upgrade state pod-restart-required for 10m; cordoned by nvdriver") {
		t.Errorf("node line %q", m)
	}
	if r := ExplainNode(s, "nope", NodeInputs{}); r.Summary[Error] != 1 {
		t.Errorf("a missing node is not an error: %+v", r)
	}
}

func TestCordonedBy(t *testing.T) {
	mk := func(state string, initial bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}, Annotations: map[string]string{}}, Spec: corev1.NodeSpec{Unschedulable: true}}
		if state != "" {
			n.Labels[plan.LabelUpgradeState] = state
		}
		if initial {
			n.Annotations[upgrade.AnnotationInitialUnsched] = "true"
		}
		return n
	}
	for _, tc := range []struct {
		n    *corev1.Node
		want string
	}{
		{mk(upgrade.StateWaitForJobs, false), CordonedByNVDriver},
		{mk(upgrade.StateFailed, false), CordonedByNVDriver},
		{mk(upgrade.StateWaitForJobs, true), CordonedByAdmin},
		{mk(upgrade.StateDone, false), CordonedByAdmin},
		{&corev1.Node{}, ""},
	} {
		if got := CordonedBy(tc.n); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.n.Labels, got, tc.want)
		}
	}
}
