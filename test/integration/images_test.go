package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func imageChecks(t *testing.T, out, driver string) []plan.ImageCheck {
	t.Helper()
	var p plan.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("not a plan: %v\n%s", err, out)
	}
	d := p.DriverByName(driver)
	if d == nil || len(d.Pools) != 1 {
		t.Fatalf("driver %s: %+v", driver, d)
	}
	return d.Pools[0].ImageCheck
}

// preview, upgrade --dry-run and doctor ask a real registry, with the CR's
// pull Secret when the registry needs one, and say ok / missing / unknown.
func TestPluginChecksImages(t *testing.T) {
	startController(t) // creates the driver namespace, and gives the CRs a status
	open := registrytest.StartTest(t, "", "")
	private := registrytest.StartTest(t, "robot", "t0ken")
	for _, r := range []*registrytest.Registry{open, private} {
		if err := r.Push("nvidia/driver:550.90.07-ubuntu22.04"); err != nil {
			t.Fatal(err)
		}
	}
	createNodes(t, []*corev1.Node{
		gpuNode("ic-open", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"ic": "open"}),
		gpuNode("ic-priv", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"ic": "priv"}),
	})
	ctx := context.Background()
	for _, d := range []*v1alpha1.NVIDIADriver{
		{ObjectMeta: metav1.ObjectMeta{Name: "ic-open"}, Spec: v1alpha1.NVIDIADriverSpec{Repository: open.Host + "/nvidia", Version: "550.90.07", NodeSelector: map[string]string{"ic": "open"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ic-priv"}, Spec: v1alpha1.NVIDIADriverSpec{Repository: private.Host + "/nvidia", Version: "550.90.07", NodeSelector: map[string]string{"ic": "priv"},
			ImagePullSecrets: []string{"ic-regcred"}, UpgradePolicy: &v1alpha1.DriverUpgradePolicySpec{AutoUpgrade: false}}},
	} {
		if err := k8s.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, d) })
	}

	code, out, errOut := plugin(t, "", "preview", "ic-open", "-o", "json", "--check-images")
	if c := imageChecks(t, out, "ic-open"); code != 0 || len(c) != 1 || c[0].Status != plan.ImageStatusOK || c[0].Image != open.Host+"/nvidia/driver:550.90.07-ubuntu22.04" {
		t.Fatalf("existing image: exit %d %+v\n%s", code, c, errOut)
	}

	// A private registry without the Secret: unknown (credentials refused),
	// which is not a finding; with it, ok.
	code, out, _ = plugin(t, "", "preview", "ic-priv", "-o", "json", "--check-images")
	if c := imageChecks(t, out, "ic-priv"); code != 0 || c[0].Status != plan.ImageStatusUnknown || c[0].Reason != v1alpha1.ReasonRegistryAuthFailed {
		t.Fatalf("no Secret: exit %d %+v", code, c)
	}
	auth := base64.StdEncoding.EncodeToString([]byte("robot:t0ken"))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ic-regcred", Namespace: driverNS}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, private.Host, auth))}}
	if err := k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, secret) })
	code, out, _ = plugin(t, "", "preview", "ic-priv", "-o", "json", "--check-images")
	if c := imageChecks(t, out, "ic-priv"); code != 0 || c[0].Status != plan.ImageStatusOK {
		t.Fatalf("with the pull Secret: exit %d %+v", code, c)
	}

	// A missing tag: preview exits 3 and says so; the table shows it.
	manifest := fmt.Sprintf("apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: ic-open}\nspec: {repository: %s/nvidia, version: \"560.35.03\", nodeSelector: {ic: open}}\n", open.Host)
	code, out, errOut = plugin(t, manifest, "preview", "-f", "-", "ic-open", "--check-images")
	if code != cli.ExitFindings || !strings.Contains(out, "REGISTRY") || !strings.Contains(out, "Images the registry did not confirm (1)") ||
		!strings.Contains(out, open.Host+"/nvidia/driver:560.35.03-ubuntu22.04  missing   not found in the registry") {
		t.Fatalf("missing tag: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = plugin(t, manifest, "preview", "-f", "-", "ic-open", "--check-images=false")
	if code != 0 || strings.Contains(out, "REGISTRY") {
		t.Fatalf("--check-images=false: exit %d\n%s", code, out)
	}

	// upgrade --dry-run: exit 3 for the missing tag, nothing written.
	code, out, errOut = plugin(t, "", "upgrade", "ic-open", "--to", "560.35.03", "--dry-run=server", "--check-images")
	if code != cli.ExitFindings || !strings.Contains(errOut, "image "+open.Host+"/nvidia/driver:560.35.03-ubuntu22.04 for ") || !strings.Contains(errOut, ": missing: under imageCheck=enforce (the default) the controller rolls no node of this pool onto it") {
		t.Fatalf("upgrade --dry-run to a missing tag: exit %d\n%s\n%s", code, out, errOut)
	}
	got := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "ic-open"}, got); err != nil || got.Spec.Version != "550.90.07" {
		t.Fatalf("a dry run changed the version: %v %s", err, got.Spec.Version)
	}
	// Run again on a CR already at the missing version: it says so again
	// (exit 3 under --dry-run), not just "unchanged".
	// A patch, not an update: the controller may be adding its finalizer.
	before := got.DeepCopy()
	got.Spec.Version = "560.35.03"
	if err := k8s.Patch(ctx, got, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = plugin(t, "", "upgrade", "ic-open", "--to", "560.35.03", "--dry-run=server", "--check-images")
	if code != cli.ExitFindings || !strings.Contains(out, "unchanged (already at version 560.35.03)") || !strings.Contains(errOut, "-ubuntu22.04 for ") {
		t.Fatalf("upgrade --dry-run again at the missing version: exit %d\n%s\n%s", code, out, errOut)
	}
	if err := open.Push("nvidia/driver:560.35.03-ubuntu22.04"); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = plugin(t, "", "upgrade", "ic-open", "--to", "560.35.03", "--dry-run=server", "--check-images")
	if code != 0 || !strings.Contains(errOut, "-ubuntu22.04 for ") || !strings.Contains(errOut, "(1 node(s)): ok") {
		t.Fatalf("upgrade --dry-run once the tag exists: exit %d\n%s", code, errOut)
	}

	// doctor: the missing image is an error finding with its fix.
	if err := private.Delete("nvidia/driver:550.90.07-ubuntu22.04"); err != nil {
		t.Fatal(err)
	}
	code, out, _ = plugin(t, "", "doctor", "ic-priv", "-o", "json", "--check-images")
	var report doctor.Report
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range report.Findings {
		if f.Check == "image-available" && f.Severity == doctor.Error && strings.Contains(f.Message, "ic-priv: image "+private.Host+"/nvidia/driver:550.90.07-ubuntu22.04 is not in the registry") {
			found = true
		}
	}
	if code != cli.ExitFindings || !found {
		t.Fatalf("doctor: exit %d, findings %+v", code, report.Findings)
	}
}

// A precompiled driver's images for every kernel the GPU nodes run,
// selected or not.
func TestPreviewPrecompiledKernels(t *testing.T) {
	reg := registrytest.StartTest(t, "", "")
	if err := reg.Push("nvidia/driver:535-5.15.0-84-generic-ubuntu22.04"); err != nil {
		t.Fatal(err)
	}
	createNodes(t, []*corev1.Node{
		gpuNode("pk-a", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"pk": "yes"}),
		gpuNode("pk-b", "ubuntu", "22.04", "6.8.0-49-generic", nil),
	})
	manifest := fmt.Sprintf("apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: pk}\nspec: {repository: %s/nvidia, version: \"535\", usePrecompiled: true, nodeSelector: {pk: \"yes\"}}\n", reg.Host)
	code, out, errOut := plugin(t, manifest, "preview", "-f", "-", "pk", "-o", "json", "--check-images")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var p plan.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatal(err)
	}
	d := p.DriverByName("pk")
	byKernel := map[string]plan.KernelImage{}
	for _, k := range d.KernelImages {
		byKernel[k.Kernel] = k
	}
	if k := byKernel["5.15.0-84-generic"]; k.Check.Status != plan.ImageStatusOK || k.Selected != 1 {
		t.Errorf("selected kernel: %+v", k)
	}
	if k := byKernel["6.8.0-49-generic"]; k.Check.Status != plan.ImageStatusMissing || k.Selected != 0 || k.Nodes < 1 ||
		k.Check.Image != reg.Host+"/nvidia/driver:535-6.8.0-49-generic-ubuntu22.04" {
		t.Errorf("unselected kernel without an image: %+v", k)
	}
	_, table, _ := plugin(t, manifest, "preview", "-f", "-", "pk", "--check-images")
	if !strings.Contains(table, "Precompiled images of pk by kernel seen on GPU nodes: ") || !strings.Contains(table, "kernel(s) lack an image") {
		t.Errorf("table:\n%s", table)
	}
}
