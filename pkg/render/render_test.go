package render

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const testUID = "3fa85f64-5717-4562-b3fc-2c963f66afa6"

// node makes a GPU node for the planner.
func node(name, id, ver, kernel string, extra map[string]string) plan.Node {
	l := map[string]string{plan.LabelGPUPresent: "true", plan.LabelDeployDriver: "true",
		plan.LabelOSID: id, plan.LabelOSVersion: ver, plan.LabelOSVersionMajor: ver[:1]}
	if kernel != "" {
		l[plan.LabelKernel] = kernel
	}
	for k, v := range extra {
		l[k] = v
	}
	return plan.Node{Name: name, Labels: l}
}

// renderVia plans a single-node cluster and renders the one pool, as the
// controller does.
func renderVia(t *testing.T, d *v1alpha1.NVIDIADriver, n plan.Node) []byte {
	t.Helper()
	if d.UID == "" {
		d.UID = testUID
	}
	p := plan.Compute([]plan.Node{n}, []v1alpha1.NVIDIADriver{*d})
	pd := p.DriverByName(d.Name)
	if pd == nil || len(pd.Pools) != 1 {
		t.Fatalf("want one pool, got %+v", pd)
	}
	ds := DaemonSet(d, pd.Pools[0], Options{Namespace: "gpu-operator"})
	out, err := yaml.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func cr(name string, spec v1alpha1.NVIDIADriverSpec) *v1alpha1.NVIDIADriver {
	return &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}

func TestGolden(t *testing.T) {
	base := func() v1alpha1.NVIDIADriverSpec {
		return v1alpha1.NVIDIADriverSpec{DriverType: v1alpha1.GPU, Repository: "nvcr.io/nvidia", Image: "driver", Version: "535.104.12",
			ImagePullPolicy: "IfNotPresent", KernelModuleType: "auto"}
	}
	gold := base()
	gold.NodeSelector = map[string]string{"driver.config": "gold"}
	gold.GDRCopy = &v1alpha1.GDRCopySpec{Enabled: ptr.To(false), Repository: "nvcr.io/nvidia/cloud-native", Image: "gdrdrv", Version: "v2.4.1"}
	gold.GPUDirectRDMA = &v1alpha1.GPUDirectRDMASpec{Enabled: ptr.To(false), UseHostMOFED: ptr.To(false)}
	gold.StartupProbe = &v1alpha1.ContainerProbeSpec{FailureThreshold: ptr.To[int32](120), InitialDelaySeconds: ptr.To[int32](60), PeriodSeconds: ptr.To[int32](10), TimeoutSeconds: ptr.To[int32](60)}

	pre := base()
	pre.UsePrecompiled = ptr.To(true)
	pre.Version = "535"

	vgpu := base()
	vgpu.DriverType = v1alpha1.VGPUHostManager
	vgpu.Image = "vgpu-manager"
	vgpu.Version = "550.54.16"

	sidecars := base()
	sidecars.GPUDirectRDMA = &v1alpha1.GPUDirectRDMASpec{Enabled: ptr.To(true), UseHostMOFED: ptr.To(true)}
	sidecars.GPUDirectStorage = &v1alpha1.GPUDirectStorageSpec{Enabled: ptr.To(true), Repository: "nvcr.io/nvidia/cloud-native", Image: "nvidia-fs", Version: "2.20.5", ImagePullSecrets: []string{"ngc"}}
	sidecars.GDRCopy = &v1alpha1.GDRCopySpec{Enabled: ptr.To(true), Repository: "nvcr.io/nvidia/cloud-native", Image: "gdrdrv", Version: "v2.4.1", ImagePullSecrets: []string{"ngc"}}
	sidecars.KernelModuleType = "open"

	custom := base()
	custom.Labels = map[string]string{"team": "ml", "app": "ignored-if-it-slipped-through"}
	custom.Annotations = map[string]string{"example.com/owner": "ml-platform"}
	custom.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoExecute}}
	custom.PriorityClassName = "gpu-critical"
	custom.Env = []v1alpha1.EnvVar{{Name: "NVIDIA_DRIVER_DEBUG", Value: "1"}}
	custom.Args = []string{"--no-nouveau-check"}
	custom.SecretEnv = "driver-secrets"
	custom.ImagePullSecrets = []string{"regcred"}
	custom.Resources = &v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")}}
	custom.StartupProbe = &v1alpha1.ContainerProbeSpec{FailureThreshold: ptr.To[int32](200)} // partial: the rest are driver defaults
	custom.RepoConfig = &v1alpha1.DriverRepoConfigSpec{Name: "repo"}
	custom.CertConfig = &v1alpha1.DriverCertConfigSpec{Name: "certs"}
	custom.UpgradePolicy = &v1alpha1.DriverUpgradePolicySpec{DrainSpec: &v1alpha1.DrainSpec{Enable: true, TimeoutSecond: 300}}

	cases := []struct {
		name string
		d    *v1alpha1.NVIDIADriver
		n    plan.Node
	}{
		{"seed-gold", cr("demo-gold", gold), node("g1", "ubuntu", "22.04", "", map[string]string{"driver.config": "gold"})},
		{"precompiled", cr("demo-precomp", pre), node("p1", "ubuntu", "22.04", "5.15.0-84-generic", nil)},
		{"vgpu-host-manager", cr("vgpu-host", vgpu), node("v1", "rhel", "9.4", "", nil)},
		{"rdma-gds-gdrcopy", cr("gpudirect", sidecars), node("d1", "ubuntu", "22.04", "", nil)},
		{"custom-labels-annotations-tolerations", cr("custom", custom), node("c1", "ubuntu", "20.04", "", nil)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := renderVia(t, tc.d, tc.n)
			path := filepath.Join("testdata", tc.name+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/render -update to create it)", err)
			}
			if string(got) != string(want) {
				t.Errorf("%s differs from the golden file (go test ./pkg/render -update rewrites it):\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
}

func TestStartupProbeMergesWithDefaults(t *testing.T) {
	cases := []struct {
		name string
		spec v1alpha1.NVIDIADriverSpec
		want [5]int32 // initialDelay, timeout, period, success, failure
	}{
		{"nil probe", v1alpha1.NVIDIADriverSpec{}, [5]int32{60, 60, 10, 1, 120}},
		{"nil probe, precompiled", v1alpha1.NVIDIADriverSpec{UsePrecompiled: ptr.To(true)}, [5]int32{5, 60, 10, 1, 120}},
		{"only failureThreshold", v1alpha1.NVIDIADriverSpec{StartupProbe: &v1alpha1.ContainerProbeSpec{FailureThreshold: ptr.To[int32](7)}}, [5]int32{60, 60, 10, 1, 7}},
		{"only initialDelay, precompiled", v1alpha1.NVIDIADriverSpec{UsePrecompiled: ptr.To(true), StartupProbe: &v1alpha1.ContainerProbeSpec{InitialDelaySeconds: ptr.To[int32](30)}}, [5]int32{30, 60, 10, 1, 120}},
		{"all set", v1alpha1.NVIDIADriverSpec{StartupProbe: &v1alpha1.ContainerProbeSpec{InitialDelaySeconds: ptr.To[int32](1), TimeoutSeconds: ptr.To[int32](2), PeriodSeconds: ptr.To[int32](3), SuccessThreshold: ptr.To[int32](4), FailureThreshold: ptr.To[int32](5)}}, [5]int32{1, 2, 3, 4, 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := StartupProbe(&tc.spec)
			got := [5]int32{p.InitialDelaySeconds, p.TimeoutSeconds, p.PeriodSeconds, p.SuccessThreshold, p.FailureThreshold}
			if got != tc.want {
				t.Errorf("probe = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLayoutRules(t *testing.T) {
	d := cr("x", v1alpha1.NVIDIADriverSpec{Version: "535.104.12", Labels: map[string]string{"app.kubernetes.io/name": "evil", "team": "a"},
		NodeSelector: map[string]string{"pool": "a"}})
	d.UID = types.UID(testUID)
	p := plan.Compute([]plan.Node{node("n", "ubuntu", "22.04", "", map[string]string{"pool": "a"})}, []v1alpha1.NVIDIADriver{*d})
	pool := p.Drivers[0].Pools[0]
	ds := DaemonSet(d, pool, Options{Namespace: "ns"})
	tpl := ds.Spec.Template
	if tpl.Labels[LabelApp] != pool.DaemonSet || ds.Spec.Selector.MatchLabels[LabelApp] != pool.DaemonSet {
		t.Errorf("app label/selector = %v / %v", tpl.Labels, ds.Spec.Selector)
	}
	if _, ok := tpl.Labels["app.kubernetes.io/name"]; ok {
		t.Error("a user app.kubernetes.io/* label reached the pod")
	}
	if tpl.Labels["team"] != "a" || ds.Labels[LabelState] != StateDriver {
		t.Errorf("labels = %v / %v", tpl.Labels, ds.Labels)
	}
	// The user's "pool" selector reaches the pod only through the owner label.
	wantSel := map[string]string{plan.LabelDeployDriver: "true", plan.LabelGPUPresent: "true", plan.LabelOwner: "x",
		plan.LabelOSID: "ubuntu", plan.LabelOSVersion: "22.04"}
	if len(tpl.Spec.NodeSelector) != len(wantSel) {
		t.Errorf("nodeSelector = %v, want %v", tpl.Spec.NodeSelector, wantSel)
	}
	for k, v := range wantSel {
		if tpl.Spec.NodeSelector[k] != v {
			t.Errorf("nodeSelector[%s] = %q, want %q", k, tpl.Spec.NodeSelector[k], v)
		}
	}
	if ds.Spec.UpdateStrategy.Type != "OnDelete" {
		t.Errorf("updateStrategy = %v", ds.Spec.UpdateStrategy)
	}
	if or := ds.OwnerReferences; len(or) != 1 || or[0].UID != types.UID(testUID) || or[0].Kind != "NVIDIADriver" || !*or[0].Controller {
		t.Errorf("ownerReferences = %+v", or)
	}
	if tpl.Spec.PriorityClassName != DefaultPriorityClassName || tpl.Spec.ServiceAccountName != ServiceAccount {
		t.Errorf("priorityClass %q, serviceAccount %q", tpl.Spec.PriorityClassName, tpl.Spec.ServiceAccountName)
	}
	if ds.Namespace != "ns" {
		t.Errorf("namespace = %q", ds.Namespace)
	}
}

func TestConfigDigestTracksInstallRelevantFieldsOnly(t *testing.T) {
	d := cr("x", v1alpha1.NVIDIADriverSpec{Version: "535.104.12"})
	pool := plan.Pool{Image: "a:1-ubuntu22.04", OSTag: "ubuntu22.04"}
	before := ConfigDigest(d, pool, Options{})
	d.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
	d.Spec.Labels = map[string]string{"a": "b"}
	if got := ConfigDigest(d, pool, Options{}); got != before {
		t.Errorf("cosmetic change moved the digest %s -> %s", before, got)
	}
	pool.Image = "a:2-ubuntu22.04"
	if got := ConfigDigest(d, pool, Options{}); got == before {
		t.Error("an image change kept the digest")
	}
}
