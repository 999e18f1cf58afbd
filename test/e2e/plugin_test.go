package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// nvdriver runs the built plugin binary as kubectl would, returning its exit code.
func nvdriver(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	code, out, errOut := nvdriverNoT(args...)
	if code < 0 {
		t.Fatal(errOut)
	}
	return code, out, errOut
}

// nvdriverNoT runs the plugin (safe off the test goroutine); code -1 means it
// could not run.
func nvdriverNoT(args ...string) (int, string, string) {
	cmd := exec.Command(filepath.Join(binDir, "kubectl-nvdriver"), registrytest.Offline(args)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "NO_COLOR=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return -1, "", err.Error()
	}
	return code, out.String(), errOut.String()
}

func deleteCRs(t *testing.T, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			_, _ = run("kubectl", "delete", "nvidiadriver", n, "--ignore-not-found", "--wait=true", "--timeout=60s")
		}
	})
}

// The seed's walkthrough, driven only by plugin commands.
func TestPluginWalkthrough(t *testing.T) {
	deleteCRs(t, "pw-gold", "pw-silver")
	t.Cleanup(func() {
		_, _ = run("kubectl", "label", "node", "gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "driver.config-")
	})
	for _, a := range [][]string{
		{"assign", "pw-gold", "--nodes", "gpu-node-1,gpu-node-3", "--version", "535.104.12"},
		{"assign", "pw-silver", "--nodes", "gpu-node-0,gpu-node-2", "--version", "470.141.10"},
	} {
		if code, out, errOut := nvdriver(t, a...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", a, code, out, errOut)
		}
	}
	eventually(t, 90*time.Second, "both drivers ready in status", func() error {
		code, out, errOut := nvdriver(t, "status", "-o", "json")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, errOut)
		}
		var r cli.StatusReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			return err
		}
		ready := 0
		for _, d := range r.Drivers {
			if (d.Name == "pw-gold" || d.Name == "pw-silver") && d.State == "ready" && len(d.Pools) == 1 && d.Pools[0].Available == 2 {
				ready++
			}
		}
		if ready != 2 {
			return fmt.Errorf("not ready yet: %s", out)
		}
		return nil
	})
	code, out, _ := nvdriver(t, "preview", "pw-gold", "pw-silver", "-o", "json")
	var p plan.Plan
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("preview: exit %d\n%s", code, out)
	}
	if g := p.DriverByName("pw-gold"); g == nil || strings.Join(g.SelectedNodes, ",") != "gpu-node-1,gpu-node-3" {
		t.Errorf("gold plan = %+v", g)
	}
	code, out, errOut := nvdriver(t, "upgrade", "pw-silver", "--to", "525.125.06")
	if code != 0 || !strings.Contains(out, "470.141.10 -> 525.125.06") {
		t.Errorf("upgrade: exit %d\n%s%s", code, out, errOut)
	}
	// Completion of driver and node names against the live cluster.
	_, out, _ = nvdriver(t, "__complete", "status", "pw-")
	if !strings.Contains(out, "pw-gold") || !strings.Contains(out, "pw-silver") {
		t.Errorf("driver name completion:\n%s", out)
	}
	_, out, _ = nvdriver(t, "__complete", "assign", "x", "--nodes", "gpu-node-")
	if !strings.Contains(out, "gpu-node-0") {
		t.Errorf("node name completion:\n%s", out)
	}
}

// doctor finds each problem planted on the real cluster.
func TestDoctorFindsPlantedProblems(t *testing.T) {
	deleteCRs(t, "dr-a", "dr-b", "dr-pull", "dr-taint")
	t.Cleanup(func() {
		_, _ = run("kubectl", "label", "node", "gpu-node-4", "dr-a-", "dr-b-")
		_, _ = run("kubectl", "label", "node", "gpu-node-5", "dr-pull-")
		_, _ = run("kubectl", "label", "node", "gpu-node-2", "dr-taint-")
		_, _ = run("kubectl", "taint", "node", "gpu-node-2", "dedicated-")
		_, _ = run("kubectl", "uncordon", "gpu-node-0")
		_, _ = run("kubectl", "delete", "node", "dr-no-nfd", "--ignore-not-found")
	})
	// 1. Conflict: two drivers select gpu-node-4 (labelled after both CRs
	// exist: the webhook refuses the CR that would overlap, but a node label
	// is no object it judges).
	kubectl(t, "label", "node", "gpu-node-4", "dr-a=1", "--overwrite")
	// 2. ImagePullBackOff: kwok simulates it for pods annotated nvdriver.test/fail.
	kubectl(t, "label", "node", "gpu-node-5", "dr-pull=1", "--overwrite")
	// 3. An untolerated taint on a driver's node.
	kubectl(t, "label", "node", "gpu-node-2", "dr-taint=1", "--overwrite")
	kubectl(t, "taint", "node", "gpu-node-2", "dedicated=ml:NoSchedule", "--overwrite")
	// 4. A node left cordoned.
	kubectl(t, "cordon", "gpu-node-0")
	// 5. A GPU node NFD never labelled.
	nodeYAML := `apiVersion: v1
kind: Node
metadata: {name: dr-no-nfd, annotations: {kwok.x-k8s.io/node: fake}, labels: {type: kwok}}
status: {capacity: {nvidia.com/gpu: "8", cpu: "8", memory: 64Gi, pods: "110"}, allocatable: {nvidia.com/gpu: "8", cpu: "8", memory: 64Gi, pods: "110"}}
`
	applyStdin(t, nodeYAML)
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: dr-a}
spec: {version: "535.104.12", nodeSelector: {dr-a: "1"}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: dr-b}
spec: {version: "535.104.12", nodeSelector: {dr-b: "1"}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: dr-pull}
spec: {version: "999.0.0", nodeSelector: {dr-pull: "1"}, annotations: {nvdriver.test/fail: image-pull}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: dr-taint}
spec: {version: "535.104.12", nodeSelector: {dr-taint: "1"}}
`)
	kubectl(t, "label", "node", "gpu-node-4", "dr-b=1", "--overwrite")

	want := map[string]func(doctor.Finding) bool{
		"conflicting-selectors": func(f doctor.Finding) bool {
			return f.Severity == doctor.Error && strings.Contains(f.Message, "gpu-node-4") && strings.Contains(f.Message, "dr-a, dr-b")
		},
		"driver-pods": func(f doctor.Finding) bool {
			return f.Severity == doctor.Error && strings.Contains(f.Message, "ImagePullBackOff") && strings.Contains(f.Message, "nvcr.io/nvidia/driver:999.0.0-ubuntu22.04")
		},
		"untolerated-taints": func(f doctor.Finding) bool {
			return f.Severity == doctor.Error && strings.Contains(f.Message, "gpu-node-2") && strings.Contains(f.Message, "dedicated=ml:NoSchedule")
		},
		"cordoned-nodes": func(f doctor.Finding) bool {
			return f.Severity == doctor.Warning && strings.Contains(f.Message, "gpu-node-0") && strings.Contains(f.Fix, "kubectl uncordon gpu-node-0")
		},
		"nfd-labels": func(f doctor.Finding) bool {
			return f.Severity == doctor.Warning && strings.Contains(f.Message, "dr-no-nfd")
		},
		"controller-running": func(f doctor.Finding) bool {
			return f.Severity == doctor.Info && strings.Contains(f.Message, "nvdriver controller is running")
		},
	}
	var report doctor.Report
	eventually(t, 60*time.Second, "doctor to find every planted problem", func() error {
		code, out, errOut := nvdriver(t, "doctor", "-o", "json")
		if code != cli.ExitFindings {
			return fmt.Errorf("exit %d (want 3): %s", code, errOut)
		}
		report = doctor.Report{}
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			return err
		}
		for check, ok := range want {
			found := false
			for _, f := range report.Findings {
				if f.Check == check && ok(f) {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("no matching %s finding yet in %+v", check, report.Findings)
			}
		}
		return nil
	})
	runEveryFix(t, report)
	// The table names the fix too.
	_, out, _ := nvdriver(t, "doctor")
	if !strings.Contains(out, "kubectl uncordon gpu-node-0") || !strings.Contains(out, "error(s)") {
		t.Errorf("doctor table:\n%s", out)
	}
	// Scoped to one driver, only its findings.
	code, out, _ := nvdriver(t, "doctor", "dr-pull", "-o", "json")
	var scoped doctor.Report
	if code != cli.ExitFindings || json.Unmarshal([]byte(out), &scoped) != nil {
		t.Fatalf("doctor dr-pull: exit %d\n%s", code, out)
	}
	for _, f := range scoped.Findings {
		if f.Check == "conflicting-selectors" {
			t.Errorf("doctor dr-pull reports another driver's conflict: %+v", f)
		}
	}
}

// writingVerbs are the kubectl (and kubectl nvdriver) verbs that change the
// cluster: their fixes run with --dry-run=server.
var writingVerbs = map[string]bool{"label": true, "patch": true, "uncordon": true, "cordon": true, "create": true, "delete": true,
	"annotate": true, "taint": true, "apply": true, "assign": true, "upgrade": true}

// runEveryFix runs each command doctor printed, as a user pasting it would
// (through a shell, with kubectl and kubectl-nvdriver on PATH), writes as
// server dry runs: each must parse and be accepted.
func runEveryFix(t *testing.T, report doctor.Report) {
	t.Helper()
	ran := 0
	for _, f := range report.Findings {
		if f.Fix == "" {
			continue
		}
		for _, cmdline := range strings.Split(f.Fix, "; ") {
			fields := strings.Fields(cmdline)
			if len(fields) < 2 || fields[0] != "kubectl" {
				t.Errorf("[%s] fix %q is not a kubectl command", f.Check, cmdline)
				continue
			}
			verb := fields[1]
			if verb == "nvdriver" && len(fields) > 2 {
				verb = fields[2]
			}
			if strings.HasPrefix(cmdline, "kubectl apply") {
				continue // the CRD from the repository: not in the e2e cluster's findings
			}
			if writingVerbs[verb] {
				cmdline += " --dry-run=server"
			}
			cmd := exec.Command("bash", "-c", cmdline)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "NO_COLOR=1", "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			// kubectl nvdriver read commands exit 3 when they report findings.
			if err != nil && !(fields[1] == "nvdriver" && errors.As(err, &ee) && ee.ExitCode() == cli.ExitFindings) {
				t.Errorf("[%s] fix %q failed: %v\n%s", f.Check, cmdline, err, out)
			}
			ran++
		}
	}
	if ran < 5 {
		t.Errorf("only %d fix commands ran; the planted problems should give more", ran)
	}
	t.Logf("ran %d fix commands doctor printed", ran)
}

func applyStdin(t *testing.T, manifest string) {
	t.Helper()
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// The chart's controller Deployment passes the restricted pod security
// profile: a server dry run into a namespace that enforces it is admitted.
func TestChartControllerIsRestricted(t *testing.T) {
	helm := buildTool(t, "helm")
	kubectl(t, "create", "namespace", "restricted-check")
	t.Cleanup(func() { _, _ = run("kubectl", "delete", "namespace", "restricted-check", "--wait=false") })
	kubectl(t, "label", "namespace", "restricted-check", "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest")
	out, err := run(helm, "template", "nvdriver", "charts/nvdriver", "-n", "restricted-check", "--show-only", "templates/deployment.yaml")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	cmd := exec.Command("kubectl", "apply", "--dry-run=server", "-n", "restricted-check", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdin = strings.NewReader(out)
	res, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(res), "Warning") {
		t.Fatalf("the controller Deployment is not admitted under enforce=restricted: %v\n%s", err, res)
	}
	// And a privileged pod is refused there, so the check can fail.
	cmd = exec.Command("kubectl", "run", "priv", "-n", "restricted-check", "--image=x", "--dry-run=server", "--overrides", `{"spec":{"containers":[{"name":"priv","image":"x","securityContext":{"privileged":true}}]}}`)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if res, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("a privileged pod was admitted under enforce=restricted: the check proves nothing\n%s", res)
	}
}

func buildTool(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(root, "test", "tools", "build.sh"), name).Output()
	if err != nil {
		t.Fatalf("building %s: %v", name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], name)
}
