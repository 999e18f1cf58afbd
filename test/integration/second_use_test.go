package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// The second use: assign run again, and with one flag changed, on a CR the
// plugin created with every create flag. Every field the user did not ask to
// change stays as it was; an identical run says unchanged and writes nothing;
// the client dry run predicts exactly what the server then stores.
func TestAssignSecondUse(t *testing.T) {
	nodes := cliNodes(t, "su", 4, nil)
	createNodes(t, nodes)
	t.Cleanup(func() { deleteDriver(t, "su-gold") })
	p := cliProxy(t)

	code, out, errOut := plugin(t, "", "assign", "su-gold", "--nodes", "su-0,su-1", "--version", "550.90.07",
		"--repository", "registry.example.com/mirror", "--image", "gpu-driver", "--type", "gpu")
	if code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, out, errOut)
	}
	created := getDriver(t, "su-gold")
	if created.Spec.Repository != "registry.example.com/mirror" || created.Spec.Image != "gpu-driver" || created.Spec.Version != "550.90.07" {
		t.Fatalf("created spec = %+v", created.Spec)
	}

	// The same command again: unchanged, no write.
	p.reset()
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-0,su-1", "--version", "550.90.07")
	if code != 0 || !strings.Contains(out, "nvidiadriver.nvidia.com/su-gold unchanged") {
		t.Errorf("identical re-run: exit %d, want 'unchanged'\n%s%s", code, out, errOut)
	}
	if w := p.writes(); len(w) != 0 {
		t.Errorf("an identical re-run wrote: %v", w)
	}
	if d := getDriver(t, "su-gold"); d.Generation != created.Generation {
		t.Errorf("generation moved %d -> %d on a no-op", created.Generation, d.Generation)
	}

	// The help's own "move one more node" example, without --version.
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-2")
	if code != 0 {
		t.Fatalf("assign one more node: exit %d\n%s%s", code, out, errOut)
	}
	if d := getDriver(t, "su-gold"); !apiequality.Semantic.DeepEqual(d.Spec, created.Spec) {
		t.Errorf("adding a node changed the spec:\n got %+v\nwant %+v", d.Spec, created.Spec)
	}
	if v, _ := nodeLabel(t, "su-2", "driver.config"); v != "su-gold" {
		t.Errorf("su-2 label %q", v)
	}

	// One flag changed: --version. Only the version moves.
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-2", "--version", "550.127.05", "--dry-run=client", "-o", "json")
	if code != 0 {
		t.Fatalf("client dry run: exit %d\n%s%s", code, out, errOut)
	}
	predicted := &v1alpha1.NVIDIADriver{}
	if err := json.Unmarshal([]byte(out), predicted); err != nil {
		t.Fatalf("assign -o json stdout is not the object alone: %v\n%s", err, out)
	}
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-2", "--version", "550.127.05", "-o", "yaml")
	if code != 0 || !strings.Contains(errOut, "nvidiadriver.nvidia.com/su-gold configured") {
		t.Fatalf("version change: exit %d\n%s%s", code, out, errOut)
	}
	stored := &v1alpha1.NVIDIADriver{}
	if err := yaml.Unmarshal([]byte(out), stored); err != nil {
		t.Fatalf("assign -o yaml stdout is not the object alone: %v\n%s", err, out)
	}
	if strings.Contains(out, "managedFields") || strings.Contains(out, "labelled") {
		t.Errorf("assign -o yaml prints more than the object:\n%s", out)
	}
	// kubectl's other formats, from the same print flags: a script can ask
	// for the name or one field.
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-2", "-o", "name")
	if code != 0 || strings.TrimSpace(out) != "nvidiadriver.nvidia.com/su-gold" {
		t.Errorf("assign -o name: exit %d, stdout %q\n%s", code, out, errOut)
	}
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-2", "-o", "jsonpath={.spec.version}")
	if code != 0 || out != "550.127.05" {
		t.Errorf("assign -o jsonpath: exit %d, stdout %q\n%s", code, out, errOut)
	}
	want := created.Spec.DeepCopy()
	want.Version = "550.127.05"
	got := getDriver(t, "su-gold")
	if !apiequality.Semantic.DeepEqual(got.Spec, *want) {
		t.Errorf("--version changed more than the version:\n got %+v\nwant %+v", got.Spec, *want)
	}
	if !apiequality.Semantic.DeepEqual(predicted.Spec, got.Spec) {
		t.Errorf("--dry-run=client predicted\n %+v\nthe server stored\n %+v", predicted.Spec, got.Spec)
	}
	if !apiequality.Semantic.DeepEqual(stored.Spec, got.Spec) {
		t.Errorf("-o yaml printed\n %+v\nthe server stored\n %+v", stored.Spec, got.Spec)
	}

	// A second --label-key adds a key; the first stays.
	code, out, errOut = plugin(t, "", "assign", "su-gold", "--nodes", "su-3", "--label-key", "team.example.com/driver")
	if code != 0 {
		t.Fatalf("second label key: exit %d\n%s%s", code, out, errOut)
	}
	got = getDriver(t, "su-gold")
	if got.Spec.NodeSelector["driver.config"] != "su-gold" || got.Spec.NodeSelector["team.example.com/driver"] != "su-gold" {
		t.Errorf("nodeSelector after a second --label-key = %v, want both keys", got.Spec.NodeSelector)
	}
	if got.Spec.Version != "550.127.05" || got.Spec.Repository != "registry.example.com/mirror" {
		t.Errorf("a second --label-key changed the spec: %+v", got.Spec)
	}
}

// A new CR spells out repository and image, which NVIDIA's operator needs
// ("repository, image and version must all be set"); a full-path --image is
// split so both backends build the same image.
func TestAssignWritesWhatBothBackendsNeed(t *testing.T) {
	nodes := cliNodes(t, "bb", 2, nil)
	createNodes(t, nodes)
	t.Cleanup(func() { deleteDriver(t, "bb-a"); deleteDriver(t, "bb-b") })
	if code, out, errOut := plugin(t, "", "assign", "bb-a", "--nodes", "bb-0", "--version", "550.90.07"); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if d := getDriver(t, "bb-a"); d.Spec.Repository != "nvcr.io/nvidia" || d.Spec.Image != "driver" {
		t.Errorf("bb-a repository/image = %q/%q, want nvcr.io/nvidia/driver", d.Spec.Repository, d.Spec.Image)
	}
	if code, out, errOut := plugin(t, "", "assign", "bb-b", "--nodes", "bb-1", "--version", "550.90.07", "--image", "registry.example.com/team/driver"); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if d := getDriver(t, "bb-b"); d.Spec.Repository != "registry.example.com/team" || d.Spec.Image != "driver" {
		t.Errorf("bb-b repository/image = %q/%q, want registry.example.com/team + driver", d.Spec.Repository, d.Spec.Image)
	}
}

// Ctrl-C during upgrade --wait: the command says it was interrupted (not
// "timed out"), exits 1, and changes nothing beyond the version it patched.
func TestUpgradeWaitInterrupted(t *testing.T) {
	startController(t)
	nodes := cliNodes(t, "uw", 1, map[string]string{"uw": "x"})
	createNodes(t, nodes)
	if err := k8s.Create(context.Background(), nvd("uw-a", `{"version": "535.104.12", "nodeSelector": {"uw": "x"}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDriver(t, "uw-a") })
	p := cliProxy(t)
	t.Cleanup(func() { p.mu.Lock(); p.before = nil; p.mu.Unlock() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	polls := 0
	p.mu.Lock()
	p.before = func(r *http.Request) {
		// The user presses Ctrl-C while the command follows the rollout (envtest
		// runs no DaemonSet controller, so it would never end by itself).
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/nvidiadrivers/uw-a") {
			polls++
			if polls == 3 {
				cancel()
			}
		}
	}
	p.mu.Unlock()
	var out, errOut bytes.Buffer
	code := cli.MainContext(ctx, []string{"--kubeconfig", p.kubecfg, "upgrade", "uw-a", "--to", "550.90.07", "--wait", "--timeout", "1h", "--check-images=false"},
		strings.NewReader(""), &out, &errOut)
	if code != cli.ExitError || !strings.Contains(errOut.String(), "interrupted") || strings.Contains(errOut.String(), "timed out") {
		t.Fatalf("exit %d, want 1 saying interrupted\n%s%s", code, out.String(), errOut.String())
	}
	if d := getDriver(t, "uw-a"); d.Spec.Version != "550.90.07" {
		t.Errorf("version %q: the patch the command made before waiting is lost", d.Spec.Version)
	}
}

// doctor run by a user with only the built-in view role: what it may not
// read is "cannot check", never "not found" at error.
func TestDoctorAsViewer(t *testing.T) {
	ctx := context.Background()
	// What the built-in view role grants here (envtest runs no aggregation
	// controller, so view itself is empty): read access to namespaced
	// workloads, and to NVIDIADrivers through the chart's aggregate (rbac.yaml);
	// no nodes, no Leases, no CRDs.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "doctor-viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/log", "events"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets", "deployments"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"nvidia.com"}, Resources: []string{"nvidiadrivers"}, Verbs: []string{"get", "list", "watch"}}}}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "doctor-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "doctor-viewer"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "doctor-viewer"}}}
	for _, o := range []client.Object{role, crb} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		o := o
		t.Cleanup(func() { _ = k8s.Delete(ctx, o) })
	}
	p := cliProxy(t)
	// The proxy's credentials may impersonate: the plugin acts as the viewer.
	kc := filepath.Join(t.TempDir(), "viewer")
	data, _ := os.ReadFile(p.kubecfg)
	if err := os.WriteFile(kc, []byte(strings.Replace(string(data), "user: {}", "user: {as: doctor-viewer}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	var code int
	eventually(t, "the viewer's bindings to take effect", func() error {
		out.Reset()
		errOut.Reset()
		code = cli.MainContext(ctx, []string{"--kubeconfig", kc, "doctor", "-o", "json", "--check-images=false"}, strings.NewReader(""), &out, &errOut)
		if code == cli.ExitError {
			return fmt.Errorf("doctor as a viewer failed: %s%s", out.String(), errOut.String())
		}
		return nil
	})
	var r doctor.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	seen := false
	for _, f := range r.Findings {
		if f.Check == "controller-running" || f.Check == "access" {
			if f.Severity == doctor.Error {
				t.Errorf("a Forbidden answer reported as an error: %+v", f)
			}
			if strings.Contains(f.Message, "cannot check") {
				seen = true
			}
		}
	}
	if !seen {
		t.Errorf("doctor as a viewer does not say what it could not check:\n%s", out.String())
	}
}

// upgrade, run again and with one flag changed: the same version is
// "unchanged" with no write, a node already requested is not written again,
// --version is --to, a downgrade is warned about, and nothing but the
// version ever changes.
func TestUpgradeSecondUse(t *testing.T) {
	ctx := context.Background()
	nodes := cliNodes(t, "us", 1, map[string]string{"us": "x", plan.LabelOwner: "us-a"})
	createNodes(t, nodes)
	if err := k8s.Create(ctx, nvd("us-a", `{"version": "535.104.12", "repository": "registry.example.com/m", "nodeSelector": {"us": "x"}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDriver(t, "us-a") })
	before := getDriver(t, "us-a")
	p := cliProxy(t)
	if code, out, errOut := plugin(t, "", "upgrade", "us-a", "--to", "550.90.07"); code != 0 {
		t.Fatalf("upgrade: exit %d\n%s%s", code, out, errOut)
	}
	p.reset()
	code, out, errOut := plugin(t, "", "upgrade", "us-a", "--version", "550.90.07")
	if code != 0 || !strings.Contains(out, "unchanged (already at version 550.90.07)") {
		t.Errorf("same version again: exit %d\n%s%s", code, out, errOut)
	}
	if w := p.writes(); len(w) != 0 {
		t.Errorf("an identical upgrade wrote: %v", w)
	}
	code, out, errOut = plugin(t, "", "upgrade", "us-a", "--to", "535.104.12")
	if code != 0 || !strings.Contains(errOut, "warning: 550.90.07 -> 535.104.12 is a downgrade") {
		t.Errorf("downgrade: exit %d\n%s%s", code, out, errOut)
	}
	after := getDriver(t, "us-a")
	want := before.Spec.DeepCopy()
	if !apiequality.Semantic.DeepEqual(after.Spec, *want) {
		t.Errorf("upgrade there and back changed more than the version:\n got %+v\nwant %+v", after.Spec, *want)
	}
	// --nodes twice: the second run finds the request in place.
	if code, out, errOut := plugin(t, "", "upgrade", "us-a", "--nodes", "us-0"); code != 0 || !strings.Contains(out, "node/us-0 upgrade requested") {
		t.Fatalf("request: exit %d\n%s%s", code, out, errOut)
	}
	p.reset()
	code, out, errOut = plugin(t, "", "upgrade", "us-a", "--nodes", "us-0")
	if code != 0 || !strings.Contains(out, "node/us-0 unchanged (upgrade already requested)") {
		t.Errorf("second request: exit %d\n%s%s", code, out, errOut)
	}
	if w := p.writes(); len(w) != 0 {
		t.Errorf("a repeated request wrote: %v", w)
	}
}

// -n selects the namespace driver DaemonSets are read from; it is never
// silently ignored.
func TestNamespaceFlagSelectsDriverNamespace(t *testing.T) {
	ctx := context.Background()
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-driver-ubuntu22.04-ns", Namespace: "default",
		Labels: map[string]string{"app.kubernetes.io/component": "nvidia-driver"}},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nvcr.io/nvidia/driver:1.0-ubuntu22.04"}}}}}}
	if err := k8s.Create(ctx, nvd("ns-a", `{"version": "535.104.12", "nodeSelector": {"ns": "none"}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDriver(t, "ns-a") })
	owner := getDriver(t, "ns-a")
	ds.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, v1alpha1.GroupVersion.WithKind("NVIDIADriver"))}
	if err := k8s.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, ds) })
	pools := func(args ...string) int {
		code, out, errOut := plugin(t, "", append([]string{"status", "ns-a", "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("status %v: exit %d\n%s%s", args, code, out, errOut)
		}
		var r cli.StatusReport
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Drivers) != 1 {
			t.Fatalf("status %v: %v\n%s", args, err, out)
		}
		return len(r.Drivers[0].Pools)
	}
	if n := pools(); n != 1 {
		t.Errorf("status without -n shows %d pools, want the DaemonSet in default", n)
	}
	if n := pools("-n", "default"); n != 1 {
		t.Errorf("status -n default shows %d pools, want 1", n)
	}
	if n := pools("-n", "kube-system"); n != 0 {
		t.Errorf("status -n kube-system shows %d pools, want 0 (the DaemonSet is in default)", n)
	}
}

// Node completion offers GPU nodes only.
func TestNodeCompletionOffersGPUNodes(t *testing.T) {
	createNodes(t, []*corev1.Node{gpuNode("cpl-gpu", "ubuntu", "22.04", "5.15.0-84-generic", nil),
		{ObjectMeta: metav1.ObjectMeta{Name: "cpl-cpu"}}})
	code, out, errOut := plugin(t, "", "__complete", "assign", "x", "--nodes", "cpl-")
	if code != 0 || !strings.Contains(out, "cpl-gpu") || strings.Contains(out, "cpl-cpu") {
		t.Errorf("completion: exit %d\n%s%s", code, out, errOut)
	}
}
