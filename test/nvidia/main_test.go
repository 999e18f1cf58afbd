// Package nvidia runs the plugin's verbs against NVIDIA's GPU Operator, built
// from its Go module (test/tools/nvidia), on a local simulated cluster: the
// README promises the plugin works with either backend. Opt-in, since it
// builds and runs a second operator: make test-nvidia.
package nvidia

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
)

var (
	kubeconfig string
	binDir     string
	toolBin    string
	moduleDir  string
)

const clusterName = "nvidia-compat"

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = repoRoot()
	cmd.Env = append(os.Environ(), "NVDRIVER_CLUSTER_NAME="+clusterName)
	if kubeconfig != "" {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+kubeconfig)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func TestMain(m *testing.M) {
	if os.Getenv("NVDRIVER_NVIDIA_COMPAT") == "" {
		fmt.Println("skipping the NVIDIA GPU Operator compatibility suite: run make test-nvidia (NVDRIVER_NVIDIA_COMPAT=1)")
		os.Exit(0)
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "error: "+format+"\n", a...)
		return 1
	}
	out, err := run("test/tools/build.sh", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwokctl", "gpu-operator")
	if err != nil {
		return fail("building the cluster and NVIDIA's operator: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	toolBin = lines[len(lines)-1]
	dir, err := run("go", "-C", "test/tools/nvidia", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/gpu-operator")
	if err != nil {
		return fail("locating NVIDIA's operator module: %v\n%s", err, dir)
	}
	moduleDir = strings.TrimSpace(dir)
	if out, err := run("test/cluster/cluster.sh", "up", "--gpu-nodes", "4"); err != nil {
		return fail("starting the local cluster: %v\n%s", err, out)
	}
	defer func() { _, _ = run("test/cluster/cluster.sh", "down") }()
	kc, err := run("test/cluster/cluster.sh", "kubeconfig")
	if err != nil {
		return fail("kubeconfig: %v", err)
	}
	kubeconfig = strings.TrimSpace(kc)
	binDir, err = os.MkdirTemp("", "nvdriver-nvidia-bin")
	if err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(binDir)
	if out, err := run("go", "build", "-o", binDir, "./cmd/kubectl-nvdriver"); err != nil {
		return fail("building the plugin: %v\n%s", err, out)
	}
	stop, err := startNVIDIA()
	if err != nil {
		return fail("starting NVIDIA's operator: %v", err)
	}
	defer stop()
	return m.Run()
}

// startNVIDIA installs NVIDIA's CRDs and a ClusterPolicy that hands drivers
// to NVIDIADrivers (every other component off), then runs the operator with
// its manifests where it expects them (/opt/gpu-operator) in a private mount
// namespace, so nothing is written outside the test's own files.
func startNVIDIA() (func(), error) {
	for _, crd := range []string{"nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml"} {
		if out, err := run("kubectl", "apply", "--server-side", "-f", filepath.Join(moduleDir, "config", "crd", "bases", crd)); err != nil {
			return nil, fmt.Errorf("installing %s: %v\n%s", crd, err, out)
		}
	}
	if out, err := run("kubectl", "wait", "--for=condition=Established", "crd/clusterpolicies.nvidia.com", "crd/nvidiadrivers.nvidia.com", "--timeout=60s"); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"create", "namespace", "gpu-operator"},
		{"label", "namespace", "gpu-operator", "pod-security.kubernetes.io/enforce=privileged", "--overwrite"},
		{"apply", "-f", filepath.Join(moduleDir, "config", "samples", "v1_clusterpolicy.yaml")},
		{"patch", "clusterpolicy", "gpu-cluster-policy", "--type=merge", "-p", `{"spec":{"driver":{"enabled":true,"useNvidiaDriverCRD":true},` +
			`"devicePlugin":{"enabled":false},"gfd":{"enabled":false},"toolkit":{"enabled":false},"dcgm":{"enabled":false},"dcgmExporter":{"enabled":false},` +
			`"migManager":{"enabled":false},"nodeStatusExporter":{"enabled":false},"vgpuManager":{"enabled":false},"vgpuDeviceManager":{"enabled":false},` +
			`"vfioManager":{"enabled":false},"sandboxDevicePlugin":{"enabled":false}}}`},
	} {
		if out, err := run("kubectl", args...); err != nil && !strings.Contains(out, "AlreadyExists") {
			return nil, fmt.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	logf, err := os.Create(filepath.Join(binDir, "gpu-operator.log"))
	if err != nil {
		return nil, err
	}
	script := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs /opt
mkdir -p /opt/gpu-operator
cp -r %[1]q/assets/. /opt/gpu-operator/
cp -r %[1]q/manifests /opt/gpu-operator/
chmod -R u+w /opt/gpu-operator
exec %[2]q --kubeconfig %[3]q --leader-elect=false --metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0`,
		moduleDir, filepath.Join(toolBin, "gpu-operator"), kubeconfig)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "bash", "-c", script)
	// The operand images NVIDIA's Helm chart (or OLM) hands its operator as
	// environment; the operator refuses to render without them.
	cmd.Env = append(os.Environ(), "OPERATOR_NAMESPACE=gpu-operator", "KUBECONFIG="+kubeconfig,
		"DRIVER_MANAGER_IMAGE=nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1",
		"VALIDATOR_IMAGE=nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		data, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("the operator exited at once: %v\n%s", err, tail(string(data), 40))
	case <-time.After(5 * time.Second):
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		if os.Getenv("NVDRIVER_TEST_LOGS") != "" {
			data, _ := os.ReadFile(logf.Name())
			fmt.Fprintln(os.Stderr, tail(string(data), 200))
		}
	}, nil
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func operatorLog() string {
	data, _ := os.ReadFile(filepath.Join(binDir, "gpu-operator.log"))
	return tail(string(data), 60)
}

// nvdriver runs the plugin as kubectl would.
func nvdriver(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubectl-nvdriver"), registrytest.Offline(args)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "NO_COLOR=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String(), errOut.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run("kubectl", args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		<-tick.C
	}
	t.Fatalf("timed out after %s waiting for %s: %v\noperator log:\n%s", timeout, what, err, operatorLog())
}
