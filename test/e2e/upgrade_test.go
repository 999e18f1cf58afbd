package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

const gpuNS = "e2e-gpu"

// gpuWorkloads puts one pod requesting a GPU on each node, behind a
// PodDisruptionBudget that lets one go at a time.
func gpuWorkloads(t *testing.T, nodes []string) {
	t.Helper()
	workloadNamespace(t, gpuNS)
	// A Deployment (so evicted pods come back elsewhere) spread over the GPU
	// nodes, behind a PodDisruptionBudget that lets one go at a time.
	applyStdin(t, fmt.Sprintf(`apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: train, namespace: %[1]s}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: train}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: %[1]s}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: train}}
  template:
    metadata: {labels: {app: train}}
    spec:
      automountServiceAccountToken: false
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: train}}, nodeAffinityPolicy: Honor}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{matchExpressions: [{key: up, operator: In, values: [roll]}]}]
      containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, gpuNS, len(nodes)))
}

func ownedNodes(t *testing.T, driver string) []corev1.Node {
	t.Helper()
	list := &corev1.NodeList{}
	if err := k8s.List(context.Background(), list, client.MatchingLabels{plan.LabelOwner: driver}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func allNodesIn(t *testing.T, driver string, want int, states ...string) error {
	nodes := ownedNodes(t, driver)
	if len(nodes) != want {
		return fmt.Errorf("%d nodes owned by %s, want %d", len(nodes), driver, want)
	}
	for _, n := range nodes {
		s := n.Labels[upgrade.LabelState]
		ok := false
		for _, w := range states {
			ok = ok || s == w
		}
		if !ok {
			return fmt.Errorf("node %s in %q", n.Name, s)
		}
	}
	return nil
}

// driversRunning: every node of the driver is upgrade-done and runs a Ready
// pod of one of the driver's DaemonSets. A new node is upgrade-done from its
// first patch, before its DaemonSet or driver pod exists (docs/design.md,
// "One patch per new node"), so a test that changes the CR after the first
// install waits for this, not for the state alone: a pod made after the
// change starts on the new template outside the upgrade machine.
func driversRunning(t *testing.T, driver string, want int) error {
	if err := allNodesIn(t, driver, want, upgrade.StateDone); err != nil {
		return err
	}
	mine := map[types.UID]bool{}
	for _, uid := range driverDSUIDs(t, driver) {
		mine[uid] = true
	}
	pods, err := listDriverPods()
	if err != nil {
		return err
	}
	running := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if ref := metav1.GetControllerOf(p); ref != nil && mine[ref.UID] && p.DeletionTimestamp == nil && podReady(p) {
			running[p.Spec.NodeName] = true
		}
	}
	for _, n := range ownedNodes(t, driver) {
		if !running[n.Name] {
			return fmt.Errorf("no Ready driver pod of %s on %s yet", driver, n.Name)
		}
	}
	return nil
}

func driverDSUIDs(t *testing.T, driver string) map[string]types.UID {
	t.Helper()
	list := &appsv1.DaemonSetList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(driverNS)); err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, ds := range list.Items {
		for _, ref := range ds.OwnerReferences {
			if ref.Name == driver {
				out[ds.Name] = ds.UID
			}
		}
	}
	return out
}

// The seed's upgrade: patch spec.version and the nodes roll, at most
// maxParallelUpgrades at a time, each emptied of GPU pods before its driver
// pod is deleted.
func TestUpgradeRollout(t *testing.T) {
	nodes := []string{"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4", "gpu-node-5"}
	labelNodes(t, "up", "roll", nodes...)
	deleteCRs(t, "up-roll")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: up-roll}
spec:
  version: "470.141.10"
  nodeSelector: {up: roll}
  upgradePolicy: {maxParallelUpgrades: 2, maxUnavailable: "100%"}
`)
	eventually(t, 90*time.Second, "up-roll ready on 6 nodes", func() error {
		return driversRunning(t, "up-roll", 6)
	})
	gpuWorkloads(t, nodes)
	eventually(t, 60*time.Second, "GPU pods running", func() error {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(gpuNS))
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running != len(nodes) {
			return fmt.Errorf("%d running", running)
		}
		return nil
	})
	before := driverDSUIDs(t, "up-roll")
	originals := &corev1.PodList{}
	_ = k8s.List(context.Background(), originals, client.InNamespace(gpuNS))
	oldPods := map[string]string{} // node -> old driver pod
	for _, p := range driverPods(t) {
		oldPods[p.Spec.NodeName] = p.Name
	}

	// Sample continuously while the rollout runs.
	var mu sync.Mutex
	maxCordoned := 0
	var violations []string
	checked := map[string]bool{} // nodes whose old driver pod was seen going
	observed := 0                // ... while the node was still out of service
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			cordoned := 0
			for _, n := range ownedNodes(t, "up-roll") {
				if n.Spec.Unschedulable {
					cordoned++
				}
			}
			// Driver pods first, GPU pods second: a GPU pod seen after its node's
			// driver pod was seen going was there when the driver went (the node
			// stays cordoned until the new driver is validated).
			current := map[string]*corev1.Pod{}
			pods := driverPods(t)
			for i := range pods {
				current[pods[i].Name] = &pods[i]
			}
			gpu := &corev1.PodList{}
			_ = k8s.List(ctx, gpu, client.InNamespace(gpuNS))
			gpuOn := map[string]string{}
			for _, p := range gpu.Items {
				if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
					gpuOn[p.Spec.NodeName] = fmt.Sprintf("%s (created %s, phase %s)", p.Name, p.CreationTimestamp.Format(time.RFC3339), p.Status.Phase)
				}
			}
			mu.Lock()
			maxCordoned = max(maxCordoned, cordoned)
			// At the first sample where a node's old driver pod is going, no GPU
			// pod may run there (later, upgraded nodes take GPU pods again).
			for node, name := range oldPods {
				p, alive := current[name]
				if checked[node] || (alive && p.DeletionTimestamp == nil) {
					continue
				}
				checked[node] = true
				var n corev1.Node
				_ = k8s.Get(ctx, client.ObjectKey{Name: node}, &n)
				if !upgrade.InProgress(n.Labels[upgrade.LabelState]) || !n.Spec.Unschedulable {
					// The whole restart happened between two samples (kwok is fast):
					// the node is back in service and may run new GPU pods already.
					continue
				}
				observed++
				if g := gpuOn[node]; g != "" {
					violations = append(violations, fmt.Sprintf("driver pod %s on %s deleted while GPU pod %s runs there (node state %s)",
						name, node, g, n.Labels[upgrade.LabelState]))
				}
			}
			mu.Unlock()
		}
	}()

	start := time.Now()
	kubectl(t, "patch", "nvidiadriver/up-roll", "--type=json", `-p=[{"op": "replace", "path": "/spec/version", "value": "525.125.06"}]`)
	eventually(t, 3*time.Minute, "every node upgrade-done and the driver ready", func() error {
		if err := allNodesIn(t, "up-roll", 6, upgrade.StateDone); err != nil {
			return err
		}
		d := &v1alpha1.NVIDIADriver{}
		_ = k8s.Get(context.Background(), clientKey("up-roll"), d)
		if d.Status.State != v1alpha1.Ready || d.Status.ObservedGeneration != d.Generation {
			return fmt.Errorf("driver %s", d.Status.State)
		}
		for _, p := range driverPods(t) {
			if p.Spec.Containers[0].Image != "nvcr.io/nvidia/driver:525.125.06-"+strings.Split(p.Labels["nvidia.com/node.os-version"], " ")[0] {
				return fmt.Errorf("pod %s still runs %s", p.Name, p.Spec.Containers[0].Image)
			}
		}
		return nil
	})
	close(stop)
	<-done
	t.Logf("6-node rollout at parallelism 2 took %s", time.Since(start).Round(time.Millisecond))

	mu.Lock()
	defer mu.Unlock()
	if len(checked) != len(oldPods) {
		t.Errorf("saw %d of %d old driver pods go", len(checked), len(oldPods))
	}
	if observed == 0 {
		t.Error("no driver restart was observed while its node was out of service: the check proved nothing")
	}
	t.Logf("%d of %d driver restarts observed in flight", observed, len(oldPods))
	if maxCordoned > 2 {
		t.Errorf("%d nodes cordoned at once; maxParallelUpgrades is 2", maxCordoned)
	}
	if maxCordoned == 0 {
		t.Error("no node was ever seen cordoned: the sampler proves nothing")
	}
	for _, v := range violations {
		t.Error(v)
	}
	for _, n := range ownedNodes(t, "up-roll") {
		if n.Spec.Unschedulable {
			t.Errorf("%s left cordoned", n.Name)
		}
	}
	if after := driverDSUIDs(t, "up-roll"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("DaemonSets were recreated: %v -> %v", before, after)
	}
	pods := &corev1.PodList{}
	_ = k8s.List(context.Background(), pods, client.InNamespace(gpuNS))
	now := map[types.UID]string{}
	for _, p := range pods.Items {
		now[p.UID] = p.Spec.NodeName
	}
	for _, p := range originals.Items {
		if node, ok := now[p.UID]; ok {
			t.Errorf("GPU pod %s on %s was never evicted", p.Name, node)
		}
	}
}

// A node whose new driver never becomes Ready ends upgrade-failed and stays
// cordoned; the other nodes finish; upgrade --wait and doctor report it.
func TestUpgradeFlakyNode(t *testing.T) {
	flakyNode(t)
	labelNodes(t, "up", "flaky", "gpu-node-1", "gpu-node-3", "gpu-node-flaky")
	deleteCRs(t, "up-flaky")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: up-flaky}
spec:
  version: "535.104.12"
  nodeSelector: {up: flaky}
  upgradePolicy: {maxParallelUpgrades: 1, maxUnavailable: "100%"}
`)
	eventually(t, 90*time.Second, "up-flaky ready", func() error {
		return driversRunning(t, "up-flaky", 3)
	})
	// The new version's pods never become Ready on gpu-node-flaky (kwok stage).
	kubectl(t, "patch", "nvidiadriver/up-flaky", "--type=merge", `-p={"spec":{"version":"550.90.07","annotations":{"nvdriver.test/fail":"flaky-node"}}}`)
	code, out, errOut := nvdriver(t, "upgrade", "up-flaky", "--to", "550.90.07", "--wait", "--timeout", "3m")
	if code != cli.ExitFindings {
		t.Fatalf("upgrade --wait: exit %d, want 3\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "1 node(s) ended upgrade-failed") {
		t.Errorf("stderr: %s", errOut)
	}
	n := &corev1.Node{}
	_ = k8s.Get(context.Background(), clientKey("gpu-node-flaky"), n)
	if n.Labels[upgrade.LabelState] != upgrade.StateFailed || !n.Spec.Unschedulable {
		t.Errorf("gpu-node-flaky: state %q, unschedulable %v; want upgrade-failed and cordoned", n.Labels[upgrade.LabelState], n.Spec.Unschedulable)
	}
	for _, name := range []string{"gpu-node-1", "gpu-node-3"} {
		_ = k8s.Get(context.Background(), clientKey(name), n)
		if n.Labels[upgrade.LabelState] != upgrade.StateDone || n.Spec.Unschedulable {
			t.Errorf("%s: state %q, unschedulable %v; want upgrade-done and schedulable", name, n.Labels[upgrade.LabelState], n.Spec.Unschedulable)
		}
	}
	d := &v1alpha1.NVIDIADriver{}
	_ = k8s.Get(context.Background(), clientKey("up-flaky"), d)
	if d.Status.State != v1alpha1.NotReady {
		t.Errorf("driver state %q with a failed node", d.Status.State)
	}
	code, out, _ = nvdriver(t, "doctor", "up-flaky")
	if code != cli.ExitFindings || !strings.Contains(out, "ended upgrade-failed: gpu-node-flaky") {
		t.Errorf("doctor: exit %d\n%s", code, out)
	}
	events := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=up-flaky", "-o", "jsonpath={range .items[*]}{.reason} {.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, "upgrade failed") {
		t.Errorf("no upgrade-failed event on the CR:\n%s", events)
	}
	// Fix the driver, then retry the node as with NVIDIA's operator: relabel it.
	kubectl(t, "patch", "nvidiadriver/up-flaky", "--type=json", `-p=[{"op":"remove","path":"/spec/annotations"}]`)
	kubectl(t, "label", "node", "gpu-node-flaky", upgrade.LabelState+"="+upgrade.StateRequired, "--overwrite")
	eventually(t, 2*time.Minute, "every node done after the retry", func() error {
		return allNodesIn(t, "up-flaky", 3, upgrade.StateDone)
	})
}

// stateRank orders the states a node passes through once per upgrade.
var stateRank = map[string]int{
	upgrade.StateRequired: 1, upgrade.StateCordon: 2, upgrade.StateWaitForJobs: 3, upgrade.StatePodDeletion: 4,
	upgrade.StateDrain: 5, upgrade.StatePodRestart: 6, upgrade.StateValidation: 7, upgrade.StateUncordon: 8,
}

// Killing the controller in the middle of a 20-node rollout: the restarted
// controller resumes from the node labels, repeating and skipping nothing.
func TestUpgradeResumesAfterControllerRestart(t *testing.T) {
	if out, err := run("go", "run", "./test/cluster/nodes", "--kubeconfig", kubeconfig, "--prefix", "rs", "--gpu-nodes", "14", "--os", "ubuntu22.04", "--extras=false"); err != nil {
		t.Fatalf("creating nodes: %v\n%s", err, out)
	}
	var extra []string
	for i := 0; i < 14; i++ {
		extra = append(extra, fmt.Sprintf("rs-%d", i))
	}
	t.Cleanup(func() { _, _ = run("kubectl", append([]string{"delete", "node", "--ignore-not-found"}, extra...)...) })
	all := append([]string{"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4", "gpu-node-5"}, extra...)
	labelNodes(t, "rs", "yes", all...)
	deleteCRs(t, "rs")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: rs}
spec:
  version: "470.141.10"
  nodeSelector: {rs: "yes"}
  upgradePolicy: {maxParallelUpgrades: 3, maxUnavailable: "100%"}
`)
	eventually(t, 2*time.Minute, "rs on 20 nodes", func() error { return driversRunning(t, "rs", 20) })

	var mu sync.Mutex
	maxRank := map[string]int{}
	podsSeen := map[string]map[string]bool{} // node -> driver pod names
	var problems []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			nodes := ownedNodes(t, "rs")
			pods := driverPods(t)
			mu.Lock()
			for _, n := range nodes {
				s := n.Labels[upgrade.LabelState]
				r, ok := stateRank[s]
				if !ok {
					continue
				}
				if r < maxRank[n.Name] {
					problems = append(problems, fmt.Sprintf("%s went back to %s", n.Name, s))
				}
				maxRank[n.Name] = max(maxRank[n.Name], r)
			}
			for _, p := range pods {
				if podsSeen[p.Spec.NodeName] == nil {
					podsSeen[p.Spec.NodeName] = map[string]bool{}
				}
				podsSeen[p.Spec.NodeName][p.Name] = true
			}
			mu.Unlock()
		}
	}()

	kubectl(t, "patch", "nvidiadriver/rs", "--type=json", `-p=[{"op":"replace","path":"/spec/version","value":"525.125.06"}]`)
	eventually(t, 2*time.Minute, "a third of the nodes done", func() error {
		doneNodes := 0
		mu.Lock()
		defer mu.Unlock()
		for _, n := range ownedNodes(t, "rs") {
			if n.Labels[upgrade.LabelState] == upgrade.StateDone && len(podsSeen[n.Name]) == 2 {
				doneNodes++
			}
		}
		if doneNodes < 6 {
			return fmt.Errorf("%d done", doneNodes)
		}
		return nil
	})
	stopController() // SIGKILL: no lease release, no cleanup
	if err := startController(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the rollout to finish after the restart", func() error {
		if err := allNodesIn(t, "rs", 20, upgrade.StateDone); err != nil {
			return err
		}
		for _, p := range driverPods(t) {
			if p.Labels["nvidia.com/node.os-version"] != "" && !strings.Contains(p.Spec.Containers[0].Image, "525.125.06") {
				return fmt.Errorf("%s still on %s", p.Name, p.Spec.Containers[0].Image)
			}
		}
		return nil
	})
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	// Exactly two driver pods per node: the old one and one new one. More means
	// a repeated restart; fewer, a skipped node.
	for _, n := range all {
		if len(podsSeen[n]) != 2 {
			t.Errorf("%s had %d driver pods over the rollout, want 2 (old and new)", n, len(podsSeen[n]))
		}
	}
	for _, n := range ownedNodes(t, "rs") {
		if n.Spec.Unschedulable {
			t.Errorf("%s left cordoned", n.Name)
		}
	}
}

// autoUpgrade: false. `upgrade --to` warns that nothing rolls until asked;
// `upgrade --nodes X --wait` returns once X runs the new driver, while the
// other node stays on the old one (it used to wait for the whole CR, forever).
func TestUpgradeRequestedNodesOnly(t *testing.T) {
	labelNodes(t, "up", "manual", "gpu-node-1", "gpu-node-3")
	deleteCRs(t, "up-manual")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: up-manual}
spec:
  version: "535.104.12"
  nodeSelector: {up: manual}
  upgradePolicy: {autoUpgrade: false}
`)
	eventually(t, 90*time.Second, "up-manual ready", func() error {
		return driversRunning(t, "up-manual", 2)
	})
	code, out, errOut := nvdriver(t, "upgrade", "up-manual", "--to", "550.90.07", "--wait", "--timeout", "2m")
	if code != 0 || !strings.Contains(errOut, "nodes will not roll until requested: kubectl nvdriver upgrade up-manual --nodes") ||
		!strings.Contains(out, "nodes will not roll until requested") {
		t.Fatalf("upgrade --to with autoUpgrade off: exit %d\n%s%s", code, out, errOut)
	}
	start := time.Now()
	code, out, errOut = nvdriver(t, "upgrade", "up-manual", "--nodes", "gpu-node-1", "--wait", "--timeout", "3m")
	if code != 0 || !strings.Contains(out, "upgraded: gpu-node-1 run(s) the current driver") {
		t.Fatalf("upgrade --nodes --wait: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("upgrade --nodes gpu-node-1 --wait returned after %s", time.Since(start).Round(time.Second))
	for _, p := range driverPods(t) {
		img := p.Spec.Containers[0].Image
		switch p.Spec.NodeName {
		case "gpu-node-1":
			if !strings.Contains(img, "550.90.07") || !podReady(&p) {
				t.Errorf("gpu-node-1 runs %s (ready %v) after its upgrade returned", img, podReady(&p))
			}
		case "gpu-node-3":
			if !strings.Contains(img, "535.104.12") {
				t.Errorf("gpu-node-3 was not requested but runs %s", img)
			}
		}
	}
	// The same request again restarts the node's driver (NVIDIA's semantics
	// for a requested node) and the wait follows that restart, not a stale view.
	code, out, errOut = nvdriver(t, "upgrade", "up-manual", "--nodes", "gpu-node-1", "--wait", "--timeout", "3m")
	if code != 0 || !strings.Contains(out, "upgraded: gpu-node-1") {
		t.Fatalf("second upgrade --nodes --wait: exit %d\n%s%s", code, out, errOut)
	}
}

// flakyNode creates gpu-node-flaky, where the kwok stage flaky-node keeps
// new driver pods from becoming Ready; deleted at the end.
func flakyNode(t *testing.T) {
	t.Helper()
	applyStdin(t, `apiVersion: v1
kind: Node
metadata:
  name: gpu-node-flaky
  annotations: {kwok.x-k8s.io/node: fake}
  labels:
    type: kwok
    kubernetes.io/hostname: gpu-node-flaky
    feature.node.kubernetes.io/pci-10de.present: "true"
    feature.node.kubernetes.io/system-os_release.ID: ubuntu
    feature.node.kubernetes.io/system-os_release.VERSION_ID: "22.04"
    feature.node.kubernetes.io/system-os_release.VERSION_ID.major: "22"
    feature.node.kubernetes.io/kernel-version.full: 5.15.0-84-generic
status:
  capacity: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "8"}
`)
	t.Cleanup(func() { _, _ = run("kubectl", "delete", "node", "gpu-node-flaky", "--ignore-not-found") })
}
