// Package e2e runs the product on the local simulated GPU cluster: real
// kube-apiserver, kube-controller-manager (DaemonSet controller, garbage
// collector), kube-scheduler and kwok nodes, with the controller binary
// running as a process, and kubectl driving it as a user would.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

const (
	clusterName = "nvdriver-e2e"
	driverNS    = "gpu-operator"
)

var (
	root       string
	kubeconfig string
	binDir     string
	k8s        client.Client
	scheme     = k8sruntime.NewScheme()
	controller *exec.Cmd
	ctrlLog    string
	// ctrlMetrics is the controller's metrics address.
	ctrlMetrics string
	// controllerKubeconfig impersonates the chart's ServiceAccount.
	controllerKubeconfig string
	// hookAddr is where the controller serves its webhook, the same across
	// restarts (the chart's webhook configuration names it).
	hookAddr string
	// listening TCP sockets before and after the cluster started
	listenersBefore, listenersAfter map[string]bool
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func run(name string, args ...string) (string, error) { return runEnv(nil, name, args...) }

func runEnv(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig, "NVDRIVER_CLUSTER_NAME="+clusterName), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	root = repoRoot()
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "error: "+format+"\n", a...)
		return 1
	}
	kc, err := run(filepath.Join(root, "test/cluster/cluster.sh"), "kubeconfig")
	if err != nil {
		return fail("cluster.sh kubeconfig: %v", err)
	}
	kubeconfig = strings.TrimSpace(kc)

	// Start from no cluster of this name, so every listener it opens is new.
	_, _ = run(filepath.Join(root, "test/cluster/cluster.sh"), "down")
	listenersBefore, _ = listeners()
	start := time.Now()
	if out, err := run(filepath.Join(root, "test/cluster/cluster.sh"), "up", "--gpu-nodes", "6"); err != nil {
		return fail("starting the local cluster: %v\n%s", err, out)
	}
	listenersAfter, _ = listeners()
	defer func() {
		if os.Getenv("NVDRIVER_E2E_KEEP") == "" {
			_, _ = run(filepath.Join(root, "test/cluster/cluster.sh"), "down")
		}
	}()
	fmt.Fprintf(os.Stderr, ">> local cluster up in %s\n", time.Since(start).Round(time.Second))

	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fail("%v", err)
	}
	// The tests' own client logs nothing (controller-runtime printed a
	// "log.SetLogger(...) was never called" stack trace otherwise).
	ctrllog.SetLogger(logr.Discard())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fail("%v", err)
	}
	if out, err := run("kubectl", "apply", "-f", "charts/nvdriver/crds/"); err != nil {
		return fail("installing the CRD: %v\n%s", err, out)
	}
	if out, err := run("kubectl", "create", "namespace", driverNS); err != nil {
		return fail("creating the namespace: %v\n%s", err, out)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail("%v", err)
	}
	hookAddr = l.Addr().String()
	l.Close()
	// The controller runs as the chart's ServiceAccount (impersonated), so a
	// permission the chart forgot fails the suite.
	if err := installChartRBAC(); err != nil {
		return fail("%v", err)
	}

	binDir, err = os.MkdirTemp("", "nvdriver-e2e-bin")
	if err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(binDir)
	// Without cgo, as `make build` builds them (docs/design.md, "Memory").
	if out, err := runEnv([]string{"CGO_ENABLED=0"}, "go", "build", "-o", binDir, "./cmd/controller", "./cmd/kubectl-nvdriver"); err != nil {
		return fail("building: %v\n%s", err, out)
	}
	if err := startController(); err != nil {
		return fail("%v", err)
	}
	defer stopController()

	code := m.Run()
	if code != 0 {
		if data, err := os.ReadFile(ctrlLog); err == nil {
			lines := strings.Split(string(data), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			fmt.Fprintf(os.Stderr, "---- last controller log lines (%s) ----\n%s\n", ctrlLog, strings.Join(lines, "\n"))
		}
	}
	return code
}

func startController(extra ...string) error {
	f, err := os.CreateTemp("", "nvdriver-controller-*.log")
	if err != nil {
		return err
	}
	ctrlLog = f.Name()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctrlMetrics = l.Addr().String()
	l.Close()
	args := append([]string{"--kubeconfig", controllerKubeconfig, "--namespace", driverNS, "--leader-elect=true",
		"--metrics-bind-address", ctrlMetrics, "--health-probe-bind-address", "127.0.0.1:0", "--validation-timeout", "15s",
		// The simulated cluster's CRs name nvcr.io images that no test may ask
		// for; the image tests turn the check on against a loopback registry.
		"--image-check=off",
		// The webhook as the chart configures it for a controller outside the
		// cluster (installChartRBAC applied its configuration and Secret).
		"--webhook-bind-address", hookAddr, "--webhook-url", "https://" + hookAddr, "--webhook-cert-dir", filepath.Join(binDir, "webhook-certs")}, extra...)
	controller = exec.Command(filepath.Join(binDir, "controller"), args...)
	controller.Stdout, controller.Stderr = f, f
	return controller.Start()
}

func stopController() {
	if controller != nil && controller.Process != nil {
		_ = controller.Process.Kill()
		_, _ = controller.Process.Wait()
	}
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		<-tick.C
	}
	t.Fatalf("timed out after %s waiting for %s: %v%s", timeout, what, err, deadComponents())
}

// deadComponents names the local cluster's components (kwokctl's pid
// files) that are no longer running, with where their logs are: a wait
// that times out because, say, kube-scheduler exited says so, instead of
// every later test failing on pods that are never bound.
func deadComponents() string {
	if runtime.GOOS != "linux" { // the check reads /proc
		return ""
	}
	dir := filepath.Dir(kubeconfig)
	files, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	var dead []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		if _, err := os.Stat("/proc/" + strings.TrimSpace(string(b))); err != nil {
			dead = append(dead, fmt.Sprintf("%s (log: %s)", name, filepath.Join(dir, "logs", name+".log")))
		}
	}
	if len(dead) == 0 {
		return ""
	}
	return "; cluster components not running: " + strings.Join(dead, ", ")
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run("kubectl", args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// labelNodes sets (or with value "-" removes) a label and undoes it at the end.
func labelNodes(t *testing.T, key, value string, nodes ...string) {
	t.Helper()
	arg := key + "=" + value
	if value == "-" {
		arg = key + "-"
	}
	kubectl(t, append([]string{"label", "node", "--overwrite"}, append(nodes, arg)...)...)
	t.Cleanup(func() { _, _ = run("kubectl", append([]string{"label", "node"}, append(nodes, key+"-")...)...) })
}

// applySeed applies a seed manifest verbatim and deletes its CRs at the end,
// waiting until they are gone.
func applySeed(t *testing.T, file string) {
	t.Helper()
	path := filepath.Join("test", "testdata", "seed", file)
	kubectl(t, "apply", "-f", path)
	t.Cleanup(func() {
		_, _ = run("kubectl", "delete", "-f", path, "--wait=true", "--timeout=60s")
	})
}

func driverPods(t *testing.T) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.InNamespace(driverNS), client.MatchingLabels{"app.kubernetes.io/component": "nvidia-driver"}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }

// chartServiceAccount is the controller's identity in the chart (release "nvdriver").
const chartServiceAccount = "system:serviceaccount:" + driverNS + ":nvdriver-controller"

// installChartRBAC applies the chart's ServiceAccount, RBAC and webhook
// objects (not its Deployment or default CR) as for a controller outside the
// cluster, and writes a kubeconfig that impersonates the ServiceAccount.
func installChartRBAC() error {
	helmDir, err := exec.Command(filepath.Join(root, "test", "tools", "build.sh"), "helm").Output()
	if err != nil {
		return fmt.Errorf("building helm: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(helmDir)), "\n")
	helm := filepath.Join(lines[len(lines)-1], "helm")
	rendered, err := run(helm, "template", "nvdriver", "charts/nvdriver", "-n", driverNS,
		"--set", "controller.enabled=false", "--set", "controller.webhook.url=https://"+hookAddr,
		"--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml", "--show-only", "templates/webhook.yaml")
	if err != nil {
		return fmt.Errorf("helm template: %v\n%s", err, rendered)
	}
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdin = strings.NewReader(rendered)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("applying the chart's RBAC: %v\n%s", err, out)
	}
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return err
	}
	for _, u := range cfg.AuthInfos {
		u.Impersonate = chartServiceAccount
	}
	f, err := os.CreateTemp("", "nvdriver-controller-kubeconfig-*")
	if err != nil {
		return err
	}
	f.Close()
	controllerKubeconfig = f.Name()
	return clientcmd.WriteToFile(*cfg, controllerKubeconfig)
}

// workloadNamespace creates a namespace for test workloads, deleted at the
// end, with its "default" ServiceAccount (the ServiceAccount admission plugin
// needs it, and kube-controller-manager may not have made it yet).
func workloadNamespace(t *testing.T, ns string) {
	t.Helper()
	applyStdin(t, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns))
	t.Cleanup(func() {
		// The pods first, without a grace period: kwok nodes run nothing to
		// stop, and a graceful namespace deletion waited out its 60 s for them.
		_, _ = run("kubectl", "-n", ns, "delete", "pods", "--all", "--grace-period=0", "--force", "--wait=false")
		_, _ = run("kubectl", "delete", "namespace", ns, "--wait=true", "--timeout=60s")
	})
	if out, err := run("kubectl", "create", "serviceaccount", "default", "-n", ns); err != nil && !strings.Contains(out, "already exists") {
		t.Fatalf("creating the ServiceAccount in %s: %v\n%s", ns, err, out)
	}
}

// fullFaultsOnly skips a fault test that costs more than a minute and a half
// of `make test`'s 15-minute budget (SPEC §6): `make test-faults` runs it.
func fullFaultsOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("NVDRIVER_FAULT_SUITE") != "full" {
		t.Skip("a long fault test: make test-faults runs it (NVDRIVER_FAULT_SUITE=full)")
	}
}
