// Package packaging tests what ships: the Helm chart and the krew package.
// helm, krew and validate-krew-manifest are built from Go modules by
// test/tools/build.sh (make test-packaging builds them first).
package packaging

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/memlimit"
	"github.com/nvdriver/nvdriver/pkg/webhook"
)

func root() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

// tool returns the path of a binary built by test/tools/build.sh.
func tool(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root(), "test", "tools", "build.sh"), name)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("building %s: %v", name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], name)
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root()
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// docs splits rendered manifests into kind -> raw documents.
func docs(t *testing.T, rendered string) map[string][][]byte {
	t.Helper()
	out := map[string][][]byte{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(rendered)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		out[meta.Kind] = append(out[meta.Kind], doc)
	}
	return out
}

func TestHelmChart(t *testing.T) {
	helm := tool(t, "helm")
	lint := run(t, nil, helm, "lint", "charts/nvdriver")
	if !strings.Contains(lint, "0 chart(s) failed") || strings.Contains(lint, "[WARNING]") || strings.Contains(lint, "[ERROR]") {
		t.Errorf("helm lint is not clean:\n%s", lint)
	}

	def := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator"))
	for _, kind := range []string{"Deployment", "ServiceAccount", "ClusterRoleBinding", "Role", "RoleBinding", "NVIDIADriver"} {
		if len(def[kind]) != 1 {
			t.Errorf("default render has %d %s, want 1", len(def[kind]), kind)
		}
	}
	// The controller's ClusterRole, and read access to NVIDIADrivers
	// aggregated into the built-in view/edit/admin roles.
	if len(def["ClusterRole"]) != 2 || !strings.Contains(string(def["ClusterRole"][1]), "aggregate-to-view") {
		t.Errorf("default render has %d ClusterRoles, want the controller's and the view aggregate", len(def["ClusterRole"]))
	}
	var cr struct {
		Metadata struct{ Name string }
		Spec     map[string]any
	}
	if err := yaml.Unmarshal(def["NVIDIADriver"][0], &cr); err != nil {
		t.Fatal(err)
	}
	if cr.Metadata.Name != "default" || cr.Spec["default"] != true || cr.Spec["repository"] != "nvcr.io/nvidia" || cr.Spec["image"] != "driver" || cr.Spec["version"] == "" {
		t.Errorf("default NVIDIADriver = %+v", cr)
	}
	if _, ok := cr.Spec["nodeSelector"]; ok {
		t.Error("the default NVIDIADriver has a nodeSelector (admission rejects that)")
	}

	// NVIDIA's install flags work verbatim.
	noCR := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator",
		"--set", "driver.nvidiaDriverCRD.enabled=true", "--set", "driver.nvidiaDriverCRD.deployDefaultCR=false"))
	if len(noCR["NVIDIADriver"]) != 0 {
		t.Error("deployDefaultCR=false still renders an NVIDIADriver")
	}
	noCtrl := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator", "--set", "controller.enabled=false"))
	if len(noCtrl["Deployment"]) != 0 || len(noCtrl["ClusterRole"]) != 2 {
		t.Error("controller.enabled=false must drop the Deployment and keep RBAC")
	}
	custom := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator",
		"--set", "driver.version=550.90.07", "--set", "driver.repository=registry.example.com/nvidia"))
	if s := string(custom["NVIDIADriver"][0]); !strings.Contains(s, `version: "550.90.07"`) || !strings.Contains(s, "repository: registry.example.com/nvidia") {
		t.Errorf("driver.* values not copied:\n%s", s)
	}

	// Least privilege: no wildcard, no cluster-wide read of Secrets.
	for _, kind := range []string{"ClusterRole", "Role"} {
		role := &rbacv1.ClusterRole{}
		if err := yaml.Unmarshal(def[kind][0], role); err != nil {
			t.Fatal(err)
		}
		for _, r := range role.Rules {
			for _, list := range [][]string{r.Verbs, r.Resources, r.APIGroups} {
				for _, v := range list {
					if v == "*" {
						t.Errorf("%s has a wildcard rule: %+v", kind, r)
					}
				}
			}
			for _, res := range r.Resources {
				if res == "secrets" && kind == "ClusterRole" {
					t.Errorf("ClusterRole grants %v on secrets", r.Verbs)
				}
				// In its namespace: get by name only (does spec.secretEnv
				// exist?), and update of the webhook's certificate by name.
				if res == "secrets" && kind == "Role" && strings.Join(r.Verbs, ",") != "get" &&
					(strings.Join(r.Verbs, ",") != "update" || strings.Join(r.ResourceNames, ",") != webhook.SecretName) {
					t.Errorf("Role grants %v on secrets %v; only get, and update of %s, are needed", r.Verbs, r.ResourceNames, webhook.SecretName)
				}
				if res == "validatingwebhookconfigurations" && strings.Join(r.ResourceNames, ",") != webhook.ConfigurationName {
					t.Errorf("%s grants %v on webhook configurations %v; only %s is needed", kind, r.Verbs, r.ResourceNames, webhook.ConfigurationName)
				}
			}
		}
	}

	helmWebhook(t, helm, def)

	// The controller passes the restricted pod security profile.
	dep := &appsv1.Deployment{}
	if err := yaml.Unmarshal(def["Deployment"][0], dep); err != nil {
		t.Fatal(err)
	}
	ps := dep.Spec.Template.Spec.SecurityContext
	c := dep.Spec.Template.Spec.Containers[0]
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("pod securityContext = %+v", ps)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container securityContext = %+v", sc)
	}
	if c.Image != "ghcr.io/nvdriver/controller:0.1.0" {
		t.Errorf("controller image = %s", c.Image)
	}
	// The controller's soft memory limit follows the container's limit.
	memLimit := false
	for _, e := range c.Env {
		if e.Name == memlimit.EnvContainerLimit && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" && e.ValueFrom.ResourceFieldRef.ContainerName == c.Name {
			memLimit = true
		}
	}
	if !memLimit || c.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("the controller gets %s from its own limits.memory: %v; limit %s, want 256Mi (SPEC §6)", memlimit.EnvContainerLimit, memLimit, c.Resources.Limits.Memory())
	}
	// Its Go threads follow the container's CPU limit, in whole cores
	// rounded up (the kubelet rounds a resourceFieldRef up to its divisor).
	maxProcs := false
	for _, e := range c.Env {
		if r := e.ValueFrom; e.Name == "GOMAXPROCS" && r != nil && r.ResourceFieldRef != nil && r.ResourceFieldRef.Resource == "limits.cpu" &&
			r.ResourceFieldRef.ContainerName == c.Name && r.ResourceFieldRef.Divisor.String() == "1" {
			maxProcs = true
		}
	}
	if !maxProcs || c.Resources.Limits.Cpu().String() != "500m" {
		t.Errorf("the controller gets GOMAXPROCS from its own limits.cpu in whole cores: %v; limit %s, want 500m (SPEC §6)", maxProcs, c.Resources.Limits.Cpu())
	}
}

// make krew's pieces for linux/amd64: the archive validates as a krew
// manifest and a real krew installs it, LICENSE and completion included.
func TestKrewInstall(t *testing.T) {
	validate := tool(t, "validate-krew-manifest")
	krew := tool(t, "kubectl-krew")
	dist := t.TempDir()
	bin := filepath.Join(dist, "bin", "linux_amd64", "kubectl-nvdriver")
	run(t, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, "go", "build", "-trimpath", "-ldflags", "-X github.com/nvdriver/nvdriver/pkg/version.Version=v0.0.0-test", "-o", bin, "./cmd/kubectl-nvdriver")
	manifest := filepath.Join(t.TempDir(), "nvdriver.yaml") // krew's validator wants <plugin name>.yaml
	run(t, nil, "go", "run", "./hack/krew", "-tag", "v0.0.0-test", "-dist", dist, "-platforms", "linux/amd64", "-missing-ok", "-out", manifest)
	run(t, nil, validate, "-manifest", manifest, "-skip-install")

	krewRoot := t.TempDir()
	env := []string{"KREW_ROOT=" + krewRoot, "KREW_NO_UPGRADE_CHECK=1"}
	run(t, env, krew, "install", "--manifest="+manifest, "--archive="+filepath.Join(dist, "kubectl-nvdriver_v0.0.0-test_linux_amd64.tar.gz"))
	store := filepath.Join(krewRoot, "store", "nvdriver", "v0.0.0-test")
	for _, f := range []string{"kubectl-nvdriver", "LICENSE", "kubectl_complete-nvdriver"} {
		st, err := os.Stat(filepath.Join(store, f))
		if err != nil {
			t.Errorf("%s not installed: %v", f, err)
			continue
		}
		if f != "LICENSE" && st.Mode()&0o111 == 0 {
			t.Errorf("%s is not executable", f)
		}
	}
	lic, _ := os.ReadFile(filepath.Join(store, "LICENSE"))
	if !strings.Contains(string(lic), "Apache License") {
		t.Error("LICENSE is not the Apache licence")
	}
	// kubectl finds the installed plugin.
	path := filepath.Join(krewRoot, "bin") + string(os.PathListSeparator) + os.Getenv("PATH")
	out := run(t, []string{"PATH=" + path}, "kubectl", "nvdriver", "version")
	if strings.TrimSpace(out) != "kubectl-nvdriver v0.0.0-test" {
		t.Errorf("kubectl nvdriver version = %q", out)
	}
	// The completion script answers kubectl's completion protocol.
	comp := run(t, []string{"PATH=" + store + string(os.PathListSeparator) + path}, filepath.Join(store, "kubectl_complete-nvdriver"), "")
	for _, cmd := range []string{"assign", "preview", "upgrade", "status", "doctor", "version", "completion"} {
		if !strings.Contains(comp, cmd) {
			t.Errorf("completion lacks %q:\n%s", cmd, comp)
		}
	}
}

// helmWebhook: the chart's webhook configuration is the controller's own
// (pkg/webhook.Configuration) for both endpoints; the Deployment serves it
// with a writable certificate directory; cert-manager replaces the Secret and
// the controller's permissions on it.
func helmWebhook(t *testing.T, helm string, def map[string][][]byte) {
	t.Helper()
	check := func(what string, raw []byte, want *admissionregistrationv1.ValidatingWebhookConfiguration) {
		got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := yaml.Unmarshal(raw, got); err != nil {
			t.Fatal(err)
		}
		if got.Name != want.Name || !equality.Semantic.DeepEqual(got.Webhooks, want.Webhooks) {
			t.Errorf("%s: the chart's webhook configuration differs from the controller's:\n%s\nwant webhooks %+v", what, raw, want.Webhooks)
		}
	}
	if len(def["ValidatingWebhookConfiguration"]) != 1 || len(def["Service"]) != 1 || len(def["Secret"]) != 1 {
		t.Fatalf("default render: %d webhook configurations, %d Services, %d Secrets; want 1 each",
			len(def["ValidatingWebhookConfiguration"]), len(def["Service"]), len(def["Secret"]))
	}
	check("in cluster", def["ValidatingWebhookConfiguration"][0],
		webhook.Configuration(webhook.ConfigurationName, webhook.Endpoint{Service: webhook.ServiceName, Namespace: "gpu-operator"}, nil))
	sec := &corev1.Secret{}
	if err := yaml.Unmarshal(def["Secret"][0], sec); err != nil || sec.Name != webhook.SecretName || len(sec.Data) != 0 {
		t.Errorf("the certificate Secret must be %s and empty (helm upgrade must not overwrite it): %s", webhook.SecretName, def["Secret"][0])
	}
	dep := &appsv1.Deployment{}
	if err := yaml.Unmarshal(def["Deployment"][0], dep); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
	for _, a := range []string{"--webhook-bind-address=:9443", "--webhook-service=" + webhook.ServiceName, "--webhook-cert-dir=/var/run/nvdriver/webhook-certs"} {
		if !strings.Contains(args, a) {
			t.Errorf("the controller's args %q lack %s", args, a)
		}
	}
	if v := dep.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].EmptyDir == nil {
		t.Errorf("the certificate directory must be an emptyDir (read-only root): %+v", v)
	}

	local := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator",
		"--set", "controller.enabled=false", "--set", "controller.webhook.url=https://127.0.0.1:9443"))
	if len(local["ValidatingWebhookConfiguration"]) != 1 || len(local["Service"]) != 0 {
		t.Fatalf("controller outside the cluster: want a URL webhook configuration and no Service")
	}
	check("outside the cluster", local["ValidatingWebhookConfiguration"][0],
		webhook.Configuration(webhook.ConfigurationName, webhook.Endpoint{URL: "https://127.0.0.1:9443"}, nil))
	none := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator", "--set", "controller.enabled=false"))
	if len(none["ValidatingWebhookConfiguration"]) != 0 {
		t.Error("controller.enabled=false without a webhook URL must not register a webhook nobody serves")
	}

	cm := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator", "--set", "controller.webhook.certManager.enabled=true"))
	if len(cm["Certificate"]) != 1 || len(cm["Issuer"]) != 1 || len(cm["Secret"]) != 0 ||
		!strings.Contains(string(cm["ValidatingWebhookConfiguration"][0]), "cert-manager.io/inject-ca-from: gpu-operator/nvdriver-webhook") {
		t.Errorf("cert-manager: want a Certificate, a self-signed Issuer, the CA injected and no chart Secret")
	}
	if err := yaml.Unmarshal(cm["Deployment"][0], dep); err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--webhook-certs=external") ||
		dep.Spec.Template.Spec.Volumes[0].Secret == nil || dep.Spec.Template.Spec.Volumes[0].Secret.SecretName != webhook.SecretName {
		t.Errorf("cert-manager: the controller must read the mounted Secret: %s %+v", args, dep.Spec.Template.Spec.Volumes)
	}
	for _, raw := range cm["ClusterRole"] {
		if strings.Contains(string(raw), "validatingwebhookconfigurations") {
			t.Error("cert-manager injects the CA: the controller needs no permission on the webhook configuration")
		}
	}
	off := docs(t, run(t, nil, helm, "template", "nvdriver", "charts/nvdriver", "-n", "gpu-operator", "--set", "controller.webhook.enabled=false"))
	if len(off["ValidatingWebhookConfiguration"]) != 0 || len(off["Secret"]) != 0 || len(off["Service"]) != 0 {
		t.Error("controller.webhook.enabled=false still renders webhook objects")
	}
}
