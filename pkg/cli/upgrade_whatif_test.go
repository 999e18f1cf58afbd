package cli

import (
	"reflect"
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

func TestPoolImpacts(t *testing.T) {
	nodes := []plan.Node{{Name: "n1", Labels: map[string]string{plan.LabelGPUPresent: "true", plan.LabelOSID: "ubuntu", plan.LabelOSVersion: "22.04", "d": "x"}}}
	from := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "535.104.12", NodeSelector: map[string]string{"d": "x"}}}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.NVIDIADriverSpec)
		want   string
	}{
		{"a new version is disruptive", func(s *v1alpha1.NVIDIADriverSpec) { s.Version = "550.90.07" }, ChangeDisruptive},
		{"driver env is disruptive", func(s *v1alpha1.NVIDIADriverSpec) { s.Env = []v1alpha1.EnvVar{{Name: "A", Value: "1"}} }, ChangeDisruptive},
		{"pod labels are restart-only", func(s *v1alpha1.NVIDIADriverSpec) { s.Labels = map[string]string{"team": "ml"} }, ChangeRestartOnly},
		{"tolerations are restart-only", func(s *v1alpha1.NVIDIADriverSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
		}, ChangeRestartOnly},
		{"the upgrade policy changes no pod", func(s *v1alpha1.NVIDIADriverSpec) {
			s.UpgradePolicy = &v1alpha1.DriverUpgradePolicySpec{Paused: true}
		}, ChangeNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := from.DeepCopy()
			tc.change(&to.Spec)
			got := poolImpacts(nodes, []v1alpha1.NVIDIADriver{from}, &from, to)
			if len(got) != 1 || got[0].kind != tc.want || !reflect.DeepEqual(got[0].pool.Nodes, []string{"n1"}) {
				t.Errorf("%+v, want one pool %s", got, tc.want)
			}
		})
	}
}

func TestBlockers(t *testing.T) {
	gpu := func(name string, controlled bool, labels map[string]string, emptyDir bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", Labels: labels},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if controlled {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Controller: ptr.To(true)}}
		}
		if emptyDir {
			p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}
		return p
	}
	cpu := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ml"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	pdb := policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 1, DesiredHealthy: 1}}
	p := upgrade.PolicyFor(&v1alpha1.NVIDIADriverSpec{})
	p.WaitForJobsSelector, p.WaitForJobsTimeout = "app=train", time.Hour
	evict, blocked := blockers([]corev1.Pod{gpu("train-0", true, map[string]string{"app": "train"}, false), gpu("bare", false, nil, false),
		gpu("scratch", true, nil, true), cpu}, p, []policyv1.PodDisruptionBudget{pdb})
	if !reflect.DeepEqual(evict, []string{"ml/train-0"}) {
		t.Errorf("evict %v", evict)
	}
	all := strings.Join(blocked, "\n")
	for _, want := range []string{"job ml/train-0 (waitForCompletion, up to 1h0m0s)", "ml/bare may not be removed: no controller would recreate it",
		"ml/scratch may not be removed: it has an emptyDir volume", "PodDisruptionBudget ml/train allows no disruption now (1 healthy, 1 desired) for ml/train-0"} {
		if !strings.Contains(all, want) {
			t.Errorf("blocked lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "web") {
		t.Errorf("a pod without GPUs is named:\n%s", all)
	}
}

// preview -f of a changed CR marks each pool's change as the controller
// will carry it out.
func TestMarkChanges(t *testing.T) {
	nodes := []plan.Node{{Name: "n1", Labels: map[string]string{plan.LabelGPUPresent: "true", plan.LabelOSID: "ubuntu", plan.LabelOSVersion: "22.04", "d": "x"}}}
	stored := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "x", UID: "u"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "535.104.12", NodeSelector: map[string]string{"d": "x"}}}
	defaultSpec(&stored.Spec)
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.NVIDIADriverSpec)
		want   string
	}{
		{"the same manifest", func(*v1alpha1.NVIDIADriverSpec) {}, ChangeNone},
		{"labels", func(s *v1alpha1.NVIDIADriverSpec) { s.Labels = map[string]string{"team": "ml"} }, ChangeRestartOnly},
		{"a version", func(s *v1alpha1.NVIDIADriverSpec) { s.Version = "550.90.07" }, ChangeDisruptive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.NVIDIADriverSpec{Version: "535.104.12", NodeSelector: map[string]string{"d": "x"}}}
			tc.change(&file.Spec)
			defaultSpec(&file.Spec) // as readDriverFiles does
			in := &inputs{nodes: nodes, drivers: []v1alpha1.NVIDIADriver{stored}}
			drivers, added := mergeDrivers(in.drivers, []v1alpha1.NVIDIADriver{file})
			p := plan.Compute(nodes, drivers)
			markChanges(&p, in, []v1alpha1.NVIDIADriver{file}, added)
			if d := p.DriverByName("x"); d == nil || len(d.Pools) != 1 || d.Pools[0].Change != tc.want {
				t.Errorf("pools %+v, want change %s", d, tc.want)
			}
		})
	}
}
