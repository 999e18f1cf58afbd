package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./pkg/cli -update creates it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test ./pkg/cli -update rewrites it)\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

func fixtureNode(name, os, kernel string, extra ...string) plan.Node {
	id := strings.TrimRight(os, "0123456789.")
	ver := strings.TrimPrefix(os, id)
	l := map[string]string{plan.LabelGPUPresent: "true", plan.LabelDeployDriver: "true", plan.LabelOSID: id, plan.LabelOSVersion: ver,
		plan.LabelOSVersionMajor: strings.Split(ver, ".")[0], plan.LabelKernel: kernel}
	for i := 0; i+1 < len(extra); i += 2 {
		l[extra[i]] = extra[i+1]
	}
	return plan.Node{Name: name, Labels: l}
}

func fixtureDriver(name, version string, sel map[string]string, mut ...func(*v1alpha1.NVIDIADriver)) v1alpha1.NVIDIADriver {
	d := v1alpha1.NVIDIADriver{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 2,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))},
		Spec: v1alpha1.NVIDIADriverSpec{DriverType: v1alpha1.GPU, Repository: "nvcr.io/nvidia", Image: "driver", Version: version, NodeSelector: sel},
	}
	for _, m := range mut {
		m(&d)
	}
	return d
}

// fixture is a small cluster with every kind of outcome: two OS releases, a
// precompiled pool, a default, a conflict, skipped and uncovered nodes.
func fixture() *inputs {
	nodes := []plan.Node{
		fixtureNode("gold-1", "ubuntu22.04", "5.15.0-84-generic", "driver.config", "gold", plan.LabelOwner, "gold"),
		fixtureNode("gold-2", "ubuntu20.04", "5.15.0-84-generic", "driver.config", "gold", plan.LabelOwner, "gold", plan.LabelUpgradeState, "cordon-required"),
		// gold-3 lost its driver.config label: it is leaving gold for the default.
		fixtureNode("gold-3", "ubuntu22.04", "5.15.0-84-generic", plan.LabelOwner, "gold"),
		fixtureNode("pc-1", "ubuntu22.04", "5.15.0-78-generic", "pool", "pc", plan.LabelOwner, "precomp"),
		fixtureNode("both-1", "ubuntu22.04", "5.15.0-84-generic", "driver.config", "silver", "team", "a", plan.LabelOwner, "silver"),
		fixtureNode("silver-1", "ubuntu22.04", "5.15.0-84-generic", "driver.config", "silver", plan.LabelOwner, "silver"),
		fixtureNode("pre-1", "ubuntu22.04", "5.15.0-84-generic", plan.LabelDeployDriver, "pre-installed"),
		fixtureNode("noos-1", "ubuntu22.04", "5.15.0-84-generic", plan.LabelOSID, ""),
		fixtureNode("rest-1", "rhel9.4", "5.14.0-427.el9.x86_64"),
		{Name: "cpu-1", Labels: map[string]string{"kubernetes.io/os": "linux"}},
	}
	drivers := []v1alpha1.NVIDIADriver{
		fixtureDriver("gold", "550.90.07", map[string]string{"driver.config": "gold"}),
		fixtureDriver("silver", "535.104.12", map[string]string{"driver.config": "silver"}),
		fixtureDriver("team-a", "535", map[string]string{"team": "a"}),
		fixtureDriver("precomp", "535", map[string]string{"pool": "pc"}, func(d *v1alpha1.NVIDIADriver) { d.Spec.UsePrecompiled = ptr.To(true) }),
		fixtureDriver("default", "550.90.07", nil, func(d *v1alpha1.NVIDIADriver) { d.Spec.Default = true }),
	}
	in := &inputs{nodes: nodes, drivers: drivers}
	p := plan.Compute(nodes, drivers)
	// DaemonSets as the controller left them: gold's 22.04 pool on an older
	// image (a rollout is due), silver's in place.
	for _, name := range []string{"gold", "silver"} {
		pd := p.DriverByName(name)
		for i, pool := range pd.Pools {
			img := pool.Image
			if name == "gold" && i == 1 {
				img = "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04"
			}
			d := drivers[0]
			if name == "silver" {
				d = drivers[1]
			}
			ds := render.DaemonSet(&d, pool, render.Options{Namespace: "gpu-operator"})
			ds.Spec.Template.Spec.Containers[0].Image = img
			ds.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: int32(len(pool.Nodes)), NumberReady: int32(len(pool.Nodes)),
				UpdatedNumberScheduled: 0, NumberAvailable: int32(len(pool.Nodes))}
			in.daemonSets = append(in.daemonSets, *ds)
		}
	}
	in.drivers[0].Status = v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, ObservedGeneration: 2, Conditions: []metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Upgrading", Message: "1 node(s) upgrading"},
		{Type: "Error", Status: metav1.ConditionFalse, Reason: "Ready"}}}
	in.drivers[1].Status = v1alpha1.NVIDIADriverStatus{State: v1alpha1.NotReady, ObservedGeneration: 2, Conditions: []metav1.Condition{
		{Type: "Error", Status: metav1.ConditionTrue, Reason: plan.ReasonConflictingNodeSelector, Message: `nodeSelector overlaps with NVIDIADriver "team-a" on 1 node(s): both-1`}}}
	return in
}

func TestPreviewGolden(t *testing.T) {
	in := fixture()
	p := plan.Compute(in.nodes, in.drivers)
	st := output.NewStyles(&bytes.Buffer{}, true)
	for _, tc := range []struct {
		file string
		wide bool
	}{{"preview.txt", false}, {"preview-wide.txt", true}} {
		var buf bytes.Buffer
		if err := PrintPlanTable(&buf, p, in.daemonSets, tc.wide, st); err != nil {
			t.Fatal(err)
		}
		golden(t, tc.file, buf.Bytes())
	}
	var js, ym bytes.Buffer
	if err := output.JSON(&js, p); err != nil {
		t.Fatal(err)
	}
	golden(t, "preview.json", js.Bytes())
	if err := output.YAML(&ym, p); err != nil {
		t.Fatal(err)
	}
	golden(t, "preview.yaml", ym.Bytes())
}

// The registry's answers as preview prints them (the answers are set here;
// test/integration asks a real registry).
func TestPreviewImagesGolden(t *testing.T) {
	in := fixture()
	p := plan.Compute(in.nodes, in.drivers)
	ok := func(img string) plan.ImageCheck {
		return plan.ImageCheck{Image: img, Status: "ok", Reason: "ImagesFound"}
	}
	for di := range p.Drivers {
		d := &p.Drivers[di]
		for i := range d.Pools {
			pool := &d.Pools[i]
			pool.ImageCheck = []plan.ImageCheck{ok(pool.Image)}
			switch {
			case d.Name == "default" && pool.OSTag == "rhel9":
				pool.ImageCheck[0] = plan.ImageCheck{Image: pool.Image, Status: "missing", Reason: "ImageMissing", Message: "not found in the registry"}
			case d.Name == "precomp":
				pool.ImageCheck[0] = plan.ImageCheck{Image: pool.Image, Status: "unknown", Reason: "RegistryAuthFailed", Message: "HEAD https://nvcr.io/v2/nvidia/driver/manifests/535-5.15.0-78-generic-ubuntu22.04: unexpected status code 401 Unauthorized"}
			}
		}
		if d.Name == "precomp" {
			d.KernelImages = []plan.KernelImage{
				{OSTag: "rhel9", Kernel: "5.14.0-427.el9.x86_64", Nodes: 1, Check: plan.ImageCheck{Image: "nvcr.io/nvidia/driver:535-5.14.0-427.el9.x86_64-rhel9", Status: "missing"}},
				{OSTag: "ubuntu22.04", Kernel: "5.15.0-78-generic", Nodes: 1, Selected: 1, Check: ok("nvcr.io/nvidia/driver:535-5.15.0-78-generic-ubuntu22.04")},
				{OSTag: "ubuntu22.04", Kernel: "5.15.0-84-generic", Nodes: 5, Check: ok("nvcr.io/nvidia/driver:535-5.15.0-84-generic-ubuntu22.04")},
			}
		}
	}
	var buf bytes.Buffer
	if err := PrintPlanTable(&buf, p, in.daemonSets, false, output.NewStyles(&bytes.Buffer{}, true)); err != nil {
		t.Fatal(err)
	}
	golden(t, "preview-images.txt", buf.Bytes())
}

func TestStatusGolden(t *testing.T) {
	in := fixture()
	r, err := buildStatus(in, "")
	if err != nil {
		t.Fatal(err)
	}
	st := output.NewStyles(&bytes.Buffer{}, true)
	var tbl, wide, js bytes.Buffer
	if err := PrintStatusTable(&tbl, r, false, st); err != nil {
		t.Fatal(err)
	}
	golden(t, "status.txt", tbl.Bytes())
	if err := PrintStatusTable(&wide, r, true, st); err != nil {
		t.Fatal(err)
	}
	golden(t, "status-wide.txt", wide.Bytes())
	if err := output.JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	golden(t, "status.json", js.Bytes())
	if _, err := buildStatus(in, "nope"); err == nil || !strings.Contains(err.Error(), `"nope" not found`) {
		t.Errorf("unknown name: err = %v", err)
	}
}

func TestDoctorGolden(t *testing.T) {
	in := fixture()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var nodes []corev1.Node
	for _, n := range in.nodes {
		node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
		switch n.Name {
		case "rest-1":
			node.Spec.Unschedulable = true
		case "silver-1":
			node.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}}
		case "cpu-1":
			node.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": resourceQty("8")}
		}
		nodes = append(nodes, node)
	}
	nodes[1].Labels[plan.LabelUpgradeState] = plan.UpgradeFailed
	renew := metav1.NewMicroTime(now.Add(-3 * time.Second))
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-driver-ubuntu22.04-abc-x1", Namespace: "gpu-operator"},
		Spec: corev1.PodSpec{NodeName: "gold-1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "nvidia-driver-ctr",
			Image: "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}}}
	snap := &doctor.Snapshot{
		Now: now, CRDInstalled: true, Namespace: "gpu-operator", Drivers: in.drivers, Nodes: nodes, DaemonSets: in.daemonSets,
		DriverPods: []corev1.Pod{pod},
		Leases: []coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: doctor.LeaseName, Namespace: "gpu-operator"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("nvdriver-controller-7d9f_1234"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &renew}}},
		MissingSecrets: map[string]string{"gold": "driver-env"},
	}
	r := doctor.Run(snap)
	var tbl, js bytes.Buffer
	if err := printFindings(&tbl, r, output.NewStyles(&bytes.Buffer{}, true)); err != nil {
		t.Fatal(err)
	}
	golden(t, "doctor.txt", tbl.Bytes())
	if err := output.JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	golden(t, "doctor.json", js.Bytes())

	// Each planted problem is found by its own check.
	want := map[string]string{
		"conflicting-selectors": doctor.Error, "driver-pods": doctor.Error, "untolerated-taints": doctor.Error,
		"upgrades": doctor.Error, "cordoned-nodes": doctor.Warning, "nfd-labels": doctor.Warning, "uncovered-gpu-nodes": "",
		"skipped-nodes": doctor.Info, "secret-env": doctor.Error, "version-tag": doctor.Warning, "controller-running": doctor.Info,
		"driver-conditions": doctor.Warning,
	}
	got := map[string]string{}
	for _, f := range r.Findings {
		if _, ok := got[f.Check]; !ok || f.Severity == doctor.Error {
			got[f.Check] = f.Severity
		}
	}
	for check, sev := range want {
		if sev == "" {
			continue
		}
		if got[check] != sev {
			t.Errorf("check %s: severity %q, want %q", check, got[check], sev)
		}
	}
	if len(doctor.Checks) < 12 {
		t.Errorf("only %d checks", len(doctor.Checks))
	}
}

func TestDoctorWithoutCRD(t *testing.T) {
	r := doctor.Run(&doctor.Snapshot{})
	if len(r.Findings) != 1 || r.Findings[0].Check != "crd-installed" || r.Summary[doctor.Error] != 1 {
		t.Errorf("findings = %+v", r.Findings)
	}
}

func resourceQty(s string) resource.Quantity { return resource.MustParse(s) }

func TestPreviewShowsPendingMoves(t *testing.T) {
	nodes := []plan.Node{fixtureNode("n1", "ubuntu22.04", "k", "driver.config", "silver", plan.LabelOwner, "gold")}
	drivers := []v1alpha1.NVIDIADriver{
		fixtureDriver("gold", "550.90.07", map[string]string{"driver.config": "gold"}),
		fixtureDriver("silver", "535.104.12", map[string]string{"driver.config": "silver"}),
	}
	var buf bytes.Buffer
	if err := PrintPlanTable(&buf, plan.Compute(nodes, drivers), nil, false, output.NewStyles(&buf, true)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "Pending moves (1 node(s))") || !regexpMatch(`n1\s+gold\s+silver`, out) {
		t.Errorf("no pending move shown:\n%s", out)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// A new GDS image rolls the pool's pods as a new driver image does; preview
// must say so instead of "unchanged" (it compared the driver image alone).
func TestPreviewCountsSidecarImages(t *testing.T) {
	nodes := []plan.Node{fixtureNode("n1", "ubuntu22.04", "k", "driver.config", "gold", plan.LabelOwner, "gold")}
	d := fixtureDriver("gold", "550.90.07", map[string]string{"driver.config": "gold"})
	d.Spec.KernelModuleType = "open"
	d.Spec.GPUDirectStorage = &v1alpha1.GPUDirectStorageSpec{Enabled: ptr.To(true), Version: "2.20.5"}
	p := plan.Compute(nodes, []v1alpha1.NVIDIADriver{d})
	pool := p.DriverByName("gold").Pools[0]
	if got := pool.Sidecars[plan.SidecarGDS]; got != "nvcr.io/nvidia/cloud-native/nvidia-fs:2.20.5-ubuntu22.04" {
		t.Fatalf("GDS image = %q", got)
	}
	live := func(gds string) []appsv1.DaemonSet {
		ds := render.DaemonSet(&d, pool, render.Options{Namespace: "gpu-operator"})
		for i := range ds.Spec.Template.Spec.Containers {
			if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == render.ContainerFS {
				c.Image = gds
			}
		}
		return []appsv1.DaemonSet{*ds}
	}
	for gds, want := range map[string]string{
		pool.Sidecars[plan.SidecarGDS]:                             "unchanged",
		"nvcr.io/nvidia/cloud-native/nvidia-fs:2.17.5-ubuntu22.04": "update (rolls nodes)",
	} {
		var buf bytes.Buffer
		if err := PrintPlanTable(&buf, p, live(gds), false, output.NewStyles(&buf, true)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), want) {
			t.Errorf("live GDS image %s: want %q in\n%s", gds, want, buf.String())
		}
	}
}
