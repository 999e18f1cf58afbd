package doctor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func gpuNode(name string, labels ...string) corev1.Node {
	l := map[string]string{plan.LabelGPUPresent: "true", plan.LabelOSID: "ubuntu", plan.LabelOSVersion: "22.04", plan.LabelOSVersionMajor: "22"}
	for i := 0; i+1 < len(labels); i += 2 {
		l[labels[i]] = labels[i+1]
	}
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func findings(r Report, check string) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func TestDoctorJudgements(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	nvidiaCR := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "nv", UID: "u-nv", Generation: 3},
		Spec:   v1alpha1.NVIDIADriverSpec{Version: "550.90.07", NodeSelector: map[string]string{"driver.config": "nv"}},
		Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.Ready}}
	nvidiaDS := appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-driver-ubuntu22.04-1", Namespace: "gpu-operator", Generation: 2,
		OwnerReferences: []metav1.OwnerReference{{Kind: "NVIDIADriver", Name: "nv", UID: "u-nv", Controller: ptr.To(true)}}},
		Spec:   appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04"}}}}},
		Status: appsv1.DaemonSetStatus{ObservedGeneration: 2}}
	cpu := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-0"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("0")}}}

	for _, tc := range []struct {
		name  string
		snap  Snapshot
		check string
		want  []string // substrings, one finding each, in order; empty: no finding
		sev   string
	}{
		{name: "NVIDIA reconciling without a visible Deployment is a controller",
			snap:  Snapshot{Drivers: []v1alpha1.NVIDIADriver{nvidiaCR}, DaemonSets: []appsv1.DaemonSet{nvidiaDS}},
			check: "controller-running", want: []string{"NVIDIA's GPU Operator reconciles NVIDIADrivers"}, sev: Info},
		{name: "NVIDIA-style status with stale DaemonSets is not evidence",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{func() v1alpha1.NVIDIADriver { d := nvidiaCR; d.Spec.Version = "570.1.2"; return d }()},
				DaemonSets: []appsv1.DaemonSet{nvidiaDS}},
			check: "controller-running", want: []string{"no controller reconciles"}, sev: Error},
		{name: "no access to Leases or Deployments is not 'not found'",
			snap:  Snapshot{LeasesForbidden: "leases: forbidden: User \"v\" cannot list", DeploymentsForbidden: "deployments: forbidden"},
			check: "controller-running", want: []string{"cannot check whether a controller runs (leases: forbidden"}, sev: Info},
		{name: "a CPU node advertising 0 GPUs is not a GPU node",
			snap:  Snapshot{Nodes: []corev1.Node{cpu}},
			check: "nfd-labels"},
		{name: "pre-installed and disabled GPU nodes are listed though no CR selects them",
			snap:  Snapshot{Nodes: []corev1.Node{gpuNode("pre-0", plan.LabelDeployDriver, plan.DeployPreInstalled), gpuNode("off-0", plan.LabelDeployDriver, plan.DeployFalse)}},
			check: "skipped-nodes", want: []string{"pre-0", "off-0"}, sev: Info},
		{name: "a missing secretEnv Secret is one finding, not two",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "1.0", SecretEnv: "env"},
				Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, Conditions: []metav1.Condition{{Type: "Error", Status: metav1.ConditionTrue, Reason: "ReconcileFailed", Message: "Secret env not found"}}}}},
				MissingSecrets: map[string]string{"s": "env"}},
			check: "driver-conditions"},
		{name: "autoUpgrade false holding nodes says so, with the command",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{{ObjectMeta: metav1.ObjectMeta{Name: "held"},
				Spec:   v1alpha1.NVIDIADriverSpec{Version: "1.0", NodeSelector: map[string]string{"d": "held"}, UpgradePolicy: &v1alpha1.DriverUpgradePolicySpec{AutoUpgrade: false}},
				Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Upgrading"}}}}},
				Nodes: []corev1.Node{gpuNode("h-0", "d", "held", plan.LabelOwner, "held", plan.LabelUpgradeState, "upgrade-required")}},
			check: "driver-conditions", want: []string{"autoUpgrade is false: 1 node(s) wait"}, sev: Warning},
		{name: "a halted rollout is an error naming the node, and not also 'not ready'",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("h", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutHalted, Message: "halted: 1 node(s) failed, failure budget 1 (n-1: pod not Ready)",
				FailedNodes: []v1alpha1.FailedNode{{Node: "n-1", Reason: "pod not Ready"}}})}},
			check: "rollouts", want: []string{"h: rollout halted: 1 node(s) failed"}, sev: Error},
		{name: "the halted CR's not-ready condition is left to the rollouts check",
			snap:  Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("h", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutHalted})}},
			check: "driver-conditions"},
		{name: "a canary waiting for a person says what resumes it",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("c", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutWaiting, CanaryNodes: []string{"n-0"},
				Message: "canary done on 1 node(s); `kubectl nvdriver rollout resume` upgrades the other 3"})}},
			check: "rollouts", want: []string{"c: canary done on 1 node(s)"}, sev: Info},
		{name: "a paused rollout",
			snap:  Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("p", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutPaused, Done: 2, Total: 5})}},
			check: "rollouts", want: []string{"p: rollout paused with 2 of 5 node(s) done"}, sev: Info},
		{name: "nodes a halted rollout holds are not 'being upgraded' (the rollouts check says why)",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("h", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutHalted})},
				Nodes: []corev1.Node{gpuNode("h-1", plan.LabelOwner, "h", plan.LabelUpgradeState, "upgrade-required")}},
			check: "upgrades"},
		{name: "nodes waiting for a slot are being upgraded",
			snap: Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("p", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutProgressing})},
				Nodes: []corev1.Node{gpuNode("p-1", plan.LabelOwner, "p", plan.LabelUpgradeState, "upgrade-required")}},
			check: "upgrades", want: []string{"1 node(s) are being upgraded: p-1(upgrade-required)"}, sev: Info},
		{name: "a complete rollout is no finding",
			snap:  Snapshot{Drivers: []v1alpha1.NVIDIADriver{rolloutDriver("ok", v1alpha1.RolloutStatus{Phase: v1alpha1.RolloutComplete})}},
			check: "rollouts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.snap.Now, tc.snap.CRDInstalled, tc.snap.Namespace = now, true, "gpu-operator"
			if tc.snap.MissingSecrets == nil {
				tc.snap.MissingSecrets = map[string]string{}
			}
			got := findings(Run(&tc.snap), tc.check)
			if len(got) != len(tc.want) && !(tc.check == "skipped-nodes" && len(got) == 2) {
				t.Fatalf("%d %s finding(s), want %d: %+v", len(got), tc.check, len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i].Message, w) {
					t.Errorf("finding %d %q lacks %q", i, got[i].Message, w)
				}
				if got[i].Severity != tc.sev {
					t.Errorf("finding %d severity %s, want %s", i, got[i].Severity, tc.sev)
				}
			}
			if tc.check == "driver-conditions" && len(got) == 1 && got[0].Fix != "kubectl nvdriver upgrade held --nodes h-0" {
				t.Errorf("fix = %q", got[0].Fix)
			}
		})
	}
}

// A fix is a command to paste: a list cut for a message ("and N more")
// must never end up in one.
func TestFixesAreCommands(t *testing.T) {
	var nodes []corev1.Node
	for i := 0; i < 15; i++ {
		n := gpuNode(fmt.Sprintf("n-%02d", i), "team", "x")
		n.Spec.Unschedulable = true
		nodes = append(nodes, n)
	}
	s := &Snapshot{Now: time.Now(), CRDInstalled: true, Namespace: "gpu-operator", Nodes: nodes, MissingSecrets: map[string]string{},
		Drivers: []v1alpha1.NVIDIADriver{
			{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "1.0", NodeSelector: map[string]string{"team": "x"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "1.0", NodeSelector: map[string]string{"team": "x"}}},
		}}
	r := Run(s)
	if len(r.Findings) == 0 {
		t.Fatal("no findings")
	}
	for _, f := range r.Findings {
		if f.Fix == "" {
			continue
		}
		for _, cmd := range strings.Split(f.Fix, "; ") {
			if !strings.HasPrefix(cmd, "kubectl ") || strings.Contains(cmd, " more") || strings.Contains(cmd, "(") || strings.Contains(cmd, ":") && !strings.Contains(cmd, "'") {
				t.Errorf("[%s] fix %q is not a command to paste", f.Check, cmd)
			}
		}
	}
}

func rolloutDriver(name string, r v1alpha1.RolloutStatus) v1alpha1.NVIDIADriver {
	return v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NVIDIADriverSpec{Version: "1.0"},
		Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, Rollout: &r,
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Upgrading", Message: "nodes upgrading"}}}}
}
