package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func getDriverE2E(t *testing.T, name string) *v1alpha1.NVIDIADriver {
	t.Helper()
	d := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(context.Background(), clientKey(name), d); err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return d
}

// rolloutPhase waits for the CR's rollout to be in phase on its current revision.
func rolloutPhase(t *testing.T, name, phase string, timeout time.Duration) *v1alpha1.NVIDIADriver {
	t.Helper()
	var d *v1alpha1.NVIDIADriver
	eventually(t, timeout, name+" rollout "+phase, func() error {
		d = getDriverE2E(t, name)
		r := d.Status.Rollout
		if _, rev := upgrade.RevisionOf(&d.Spec); r == nil || r.Revision != rev || r.Phase != phase {
			return fmt.Errorf("rollout %+v", r)
		}
		return nil
	})
	return d
}

// started: the node is in the machine past upgrade-required, or cordoned.
func started(n *corev1.Node) bool {
	return upgrade.InProgress(n.Labels[upgrade.LabelState]) || n.Labels[upgrade.LabelState] == upgrade.StateFailed || n.Spec.Unschedulable
}

// history reads `rollout history -o json`.
func history(t *testing.T, name string) []cli.Revision {
	t.Helper()
	code, out, errOut := nvdriver(t, "rollout", "history", name, "-o", "json")
	if code != 0 {
		t.Fatalf("rollout history: exit %d\n%s%s", code, out, errOut)
	}
	var h struct{ Revisions []cli.Revision }
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("rollout history -o json: %v\n%s", err, out)
	}
	return h.Revisions
}

// A 20-node rollout with a 2-node canary promoted by hand: no node outside
// the canary starts before `rollout resume` (sampled every 100 ms, through a
// controller killed while the canary is in flight, which keeps its canary);
// `rollout pause` mid-wave lets the nodes in flight finish and leaves none
// cordoned; resume finishes it and history records both revisions.
func TestCanaryPauseResume(t *testing.T) {
	const total = 20
	faultNodes(t, "cw", "canary", total)
	deleteCRs(t, "canary")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: canary}
spec:
  version: "470.141.10"
  nodeSelector: {canary: "yes"}
  upgradePolicy:
    maxParallelUpgrades: 4
    maxUnavailable: "100%"
    canary: {nodes: 2}
`)
	eventually(t, 2*time.Minute, "the first driver on the cw nodes", func() error { return driversRunning(t, "canary", total) })
	// And the CR says so (driversRunning says why the version must wait
	// for it: a pod made after the change would start outside the canary).
	eventually(t, 2*time.Minute, "the CR Ready with a driver available on every cw node", func() error {
		d := getDriverE2E(t, "canary")
		if d.Status.State != v1alpha1.Ready || d.Status.ObservedGeneration != d.Generation {
			return fmt.Errorf("state %s", d.Status.State)
		}
		var desired, available int32
		for _, p := range d.Status.Pools {
			desired, available = desired+p.Desired, available+p.Available
		}
		if desired != total || available != total {
			return fmt.Errorf("driver pods desired %d, available %d, want %d", desired, available, total)
		}
		return nil
	})
	eventually(t, 30*time.Second, "revision 1 recorded", func() error {
		if h := history(t, "canary"); len(h) != 1 || h[0].Version != "470.141.10" || !h[0].Current || h[0].Nodes != total {
			return fmt.Errorf("history %+v", h)
		}
		return nil
	})

	canaryNodes := []string{"cw-0", "cw-1"} // the first two in name order
	outside := countNodes("canary", func(n *corev1.Node) bool { return !slices.Contains(canaryNodes, n.Name) && started(n) })
	rolloutStart := time.Now()
	kubectl(t, "patch", "nvidiadriver/canary", "--type=merge", `-p={"spec":{"version":"525.125.06"}}`)
	eventually(t, time.Minute, "a canary node in flight", func() error {
		d := getDriverE2E(t, "canary")
		if r := d.Status.Rollout; r == nil || !reflect.DeepEqual(r.CanaryNodes, canaryNodes) || r.InFlight == 0 {
			return fmt.Errorf("rollout %+v", r)
		}
		return nil
	})
	// Killed mid-wave, a new controller process goes on with the same canary.
	stopController()
	if err := startController(); err != nil {
		t.Fatal(err)
	}
	d := rolloutPhase(t, "canary", v1alpha1.RolloutWaiting, 2*time.Minute)
	canaryTook := time.Since(rolloutStart)
	if !reflect.DeepEqual(d.Status.Rollout.CanaryNodes, canaryNodes) || d.Status.Rollout.Done != 2 {
		t.Errorf("after the restart: canary %v, done %d; want %v, 2", d.Status.Rollout.CanaryNodes, d.Status.Rollout.Done, canaryNodes)
	}
	_, out, _ := nvdriver(t, "status", "canary")
	if !strings.Contains(out, "rollout WaitingForPromotion: 2/20 node(s) done") || !strings.Contains(out, "rollout resume` upgrades the other 18") {
		t.Errorf("status does not say the canary waits:\n%s", out)
	}
	// Still waiting a while later: nothing promotes it but a person.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for windowEnd := time.Now().Add(3 * time.Second); time.Now().Before(windowEnd); <-tick.C {
		if p := getDriverE2E(t, "canary").Status.Rollout.Phase; p != v1alpha1.RolloutWaiting {
			t.Fatalf("the canary went on by itself: %s", p)
		}
	}
	if worst, names := outside.finish(); worst != 0 {
		t.Errorf("%d node(s) outside the canary started before resume: %v", worst, names)
	}
	events := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=canary", "-o", "jsonpath={range .items[*]}{.reason} {.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, controllerEventCanaryDone) {
		t.Errorf("no %s event:\n%s", controllerEventCanaryDone, events)
	}

	code, out, errOut := nvdriver(t, "rollout", "resume", "canary")
	if code != 0 || !strings.Contains(out, "resumed: canary promoted, the other 18 node(s) go on") {
		t.Fatalf("rollout resume: exit %d\n%s%s", code, out, errOut)
	}
	// Paused mid-wave: the nodes in flight finish, no other starts, none stays cordoned.
	eventually(t, time.Minute, "a node after the canary in flight", func() error {
		if r := getDriverE2E(t, "canary").Status.Rollout; r == nil || r.Done < 2 || r.InFlight == 0 || r.Phase != v1alpha1.RolloutProgressing {
			return fmt.Errorf("rollout %+v", r)
		}
		return nil
	})
	if code, out, errOut := nvdriver(t, "rollout", "pause", "canary"); code != 0 || !strings.Contains(out, "canary paused: no further node starts") {
		t.Fatalf("rollout pause: exit %d\n%s%s", code, out, errOut)
	}
	eventually(t, time.Minute, "the nodes in flight finished, none cordoned", func() error {
		nl := &corev1.NodeList{}
		if err := k8s.List(context.Background(), nl, client.MatchingLabels{"canary": "yes"}); err != nil {
			return err
		}
		for _, n := range nl.Items {
			if started(&n) {
				return fmt.Errorf("%s still %s (cordoned %v)", n.Name, n.Labels[upgrade.LabelState], n.Spec.Unschedulable)
			}
		}
		return nil
	})
	d = rolloutPhase(t, "canary", v1alpha1.RolloutPaused, 30*time.Second)
	left := d.Status.Rollout.Total - d.Status.Rollout.Done
	if left == 0 {
		t.Fatal("the rollout finished before the pause took: the test proves nothing")
	}
	paused := countNodes("canary", started)
	// An observation window for the sampler (what it must not see is a node
	// starting), not a synchronisation.
	<-time.After(3 * time.Second)
	if worst, names := paused.finish(); worst != 0 {
		t.Errorf("%d node(s) started while paused: %v", worst, names)
	}
	if wide := kubectl(t, "get", "nvidiadriver", "canary", "-o", "wide"); !strings.Contains(wide, "Paused") || !strings.Contains(wide, "true") {
		t.Errorf("kubectl get -o wide does not show it paused:\n%s", wide)
	}
	if _, out, _ := nvdriver(t, "status", "canary"); !strings.Contains(out, "rollout PAUSED") {
		t.Errorf("status does not show PAUSED:\n%s", out)
	}
	t.Logf("paused with %d node(s) left", left)

	if code, out, errOut := nvdriver(t, "rollout", "resume", "canary"); code != 0 || !strings.Contains(out, "unpaused") {
		t.Fatalf("rollout resume: exit %d\n%s%s", code, out, errOut)
	}
	eventually(t, 3*time.Minute, "every node on 525.125.06", func() error { return rolledOnto(t, "canary", total, "cw", "525.125.06") })
	rolloutPhase(t, "canary", v1alpha1.RolloutComplete, 30*time.Second)
	t.Logf("canary of 2 done and waiting %s after the patch; all %d nodes %s after it; controller time per transition since the restart: %s",
		canaryTook.Round(100*time.Millisecond), total, time.Since(rolloutStart).Round(100*time.Millisecond), transitionQuantiles(&replica{metrics: ctrlMetrics}))
	checkTransitionParts(t, &replica{metrics: ctrlMetrics})
	h := history(t, "canary")
	if len(h) != 2 || h[0].Version != "470.141.10" || h[1].Version != "525.125.06" || !h[1].Current || h[1].Revision != 2 {
		t.Errorf("history %+v", h)
	}
}

const controllerEventCanaryDone = "CanaryDone"

// A node whose new driver never becomes Ready spends the default failure
// budget of 1: the rollout halts (condition, Event, doctor) and no further
// node starts; `rollout undo` puts the last good revision back through the
// machine: the nodes that had upgraded go back, the failed node is retried
// and recovers, and the nodes that never left the revision keep their pods.
func TestHaltThenUndo(t *testing.T) {
	before := faultNodes(t, "fa", "halt", 2) // fa-0, fa-1 upgrade before the flaky node
	after := faultNodes(t, "hz", "halt", 2)  // hz-0, hz-1 come after it in name order
	flakyNode(t)
	labelNodes(t, "halt", "yes", "gpu-node-flaky")
	deleteCRs(t, "halt")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: halt}
spec:
  version: "470.141.10"
  nodeSelector: {halt: "yes"}
  upgradePolicy: {maxParallelUpgrades: 1, maxUnavailable: "100%"}
`)
	const total = 5
	eventually(t, 2*time.Minute, "the first driver on the halt nodes", func() error { return driversRunning(t, "halt", total) })
	eventually(t, 30*time.Second, "revision 1 recorded", func() error {
		if h := history(t, "halt"); len(h) != 1 || !h[0].Current {
			return fmt.Errorf("history %+v", h)
		}
		return nil
	})
	podsBefore := driverPodNames(t, after)

	untouched := countNodes("halt", func(n *corev1.Node) bool { return strings.HasPrefix(n.Name, "hz-") && started(n) })
	kubectl(t, "patch", "nvidiadriver/halt", "--type=merge", `-p={"spec":{"version":"525.125.06","annotations":{"nvdriver.test/fail":"flaky-node"}}}`)
	d := rolloutPhase(t, "halt", v1alpha1.RolloutHalted, 2*time.Minute)
	r := d.Status.Rollout
	if len(r.FailedNodes) != 1 || r.FailedNodes[0].Node != "gpu-node-flaky" || !strings.Contains(r.FailedNodes[0].Reason, "did not become Ready") {
		t.Errorf("failed nodes %+v", r.FailedNodes)
	}
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionRolloutHalted); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "gpu-node-flaky") {
		t.Errorf("RolloutHalted condition %+v", c)
	}
	for _, n := range before {
		node := &corev1.Node{}
		_ = k8s.Get(context.Background(), clientKey(n), node)
		if node.Labels[upgrade.LabelState] != upgrade.StateDone {
			t.Errorf("%s in %q: it upgraded before the failure", n, node.Labels[upgrade.LabelState])
		}
	}
	events := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=halt", "-o", "jsonpath={range .items[*]}{.reason} {.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, "RolloutHalted") || !strings.Contains(events, "gpu-node-flaky") {
		t.Errorf("no RolloutHalted event naming the node:\n%s", events)
	}
	code, out, _ := nvdriver(t, "doctor", "halt")
	if code != cli.ExitFindings || !strings.Contains(out, "halted") || !strings.Contains(out, "rollout undo") {
		t.Errorf("doctor does not explain the halt: exit %d\n%s", code, out)
	}

	// A server dry run changes nothing.
	if code, out, errOut := nvdriver(t, "rollout", "undo", "halt", "--dry-run=server"); code != 0 || !strings.Contains(out, "rolled back to revision 1 (server dry run) (version 525.125.06 -> 470.141.10)") {
		t.Fatalf("undo --dry-run=server: exit %d\n%s%s", code, out, errOut)
	}
	if v := getDriverE2E(t, "halt").Spec.Version; v != "525.125.06" {
		t.Fatalf("a dry run changed the version to %s", v)
	}
	undoAt := time.Now()
	if code, out, errOut := nvdriver(t, "rollout", "undo", "halt"); code != 0 || !strings.Contains(out, "rolled back to revision 1") {
		t.Fatalf("undo: exit %d\n%s%s", code, out, errOut)
	}
	if d := getDriverE2E(t, "halt"); d.Spec.Annotations != nil {
		t.Errorf("undo left annotations the revision did not have: %v", d.Spec.Annotations)
	}
	all := append(append(append([]string{}, before...), after...), "gpu-node-flaky")
	eventually(t, 3*time.Minute, "every node back on 470.141.10", func() error {
		if err := allNodesIn(t, "halt", total, upgrade.StateDone); err != nil {
			return err
		}
		return podsRun(all, "470.141.10")
	})
	rolloutPhase(t, "halt", v1alpha1.RolloutComplete, 30*time.Second)
	t.Logf("undo: every node back on the last good revision %s after it", time.Since(undoAt).Round(100*time.Millisecond))
	if worst, names := untouched.finish(); worst != 0 {
		t.Errorf("a node after the failure started: %v", names)
	}
	if got := driverPodNames(t, after); !reflect.DeepEqual(got, podsBefore) {
		t.Errorf("the nodes that never left revision 1 had their driver pods restarted: %v -> %v", podsBefore, got)
	}
	if h := history(t, "halt"); len(h) != 1 || !h[0].Current || h[0].Version != "470.141.10" {
		t.Errorf("history after the undo %+v", h)
	}
	// autoRollback: the same failure again puts the last good revision back
	// by itself, and the machine rolls it out.
	kubectl(t, "patch", "nvidiadriver/halt", "--type=merge", `-p={"spec":{"version":"525.125.06","annotations":{"nvdriver.test/fail":"flaky-node"},"upgradePolicy":{"autoRollback":true}}}`)
	rolledBackAt := time.Now()
	eventually(t, 3*time.Minute, "autoRollback back on 470.141.10", func() error {
		if v := getDriverE2E(t, "halt").Spec.Version; v != "470.141.10" {
			return fmt.Errorf("version %s", v)
		}
		if err := allNodesIn(t, "halt", total, upgrade.StateDone); err != nil {
			return err
		}
		return podsRun(all, "470.141.10")
	})
	rolloutPhase(t, "halt", v1alpha1.RolloutComplete, 30*time.Second)
	events = kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=halt", "-o", "jsonpath={range .items[*]}{.reason} {.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, "RolloutRolledBack") || !strings.Contains(events, "autoRollback put revision 1 back (version 525.125.06 -> 470.141.10)") {
		t.Errorf("no RolloutRolledBack event:\n%s", events)
	}
	if d := getDriverE2E(t, "halt"); d.Spec.Annotations != nil || d.Spec.UpgradePolicy == nil || !d.Spec.UpgradePolicy.AutoRollback {
		t.Errorf("after the automatic rollback: annotations %v, upgradePolicy %+v", d.Spec.Annotations, d.Spec.UpgradePolicy)
	}
	t.Logf("autoRollback: halted and back on the last good revision %s after the bad patch", time.Since(rolledBackAt).Round(100*time.Millisecond))

	// A paused CR still lets its nodes go when it is deleted: a move is
	// never held.
	if code, out, errOut := nvdriver(t, "rollout", "pause", "halt"); code != 0 {
		t.Fatalf("rollout pause: exit %d\n%s%s", code, out, errOut)
	}
	if out, err := run("kubectl", "delete", "nvidiadriver", "halt", "--wait=true", "--timeout=60s"); err != nil {
		t.Errorf("deleting the paused CR: %v\n%s", err, out)
	}
}

// podsRun: every live driver pod on the nodes runs version.
func podsRun(nodes []string, version string) error {
	pods, err := listDriverPods()
	if err != nil {
		return err
	}
	for _, p := range pods {
		if slices.Contains(nodes, p.Spec.NodeName) && !strings.Contains(p.Spec.Containers[0].Image, version) {
			return fmt.Errorf("%s on %s runs %s", p.Name, p.Spec.NodeName, p.Spec.Containers[0].Image)
		}
	}
	return nil
}

// driverPodNames maps each node to its driver pod's name.
func driverPodNames(t *testing.T, nodes []string) map[string]string {
	t.Helper()
	pods, err := listDriverPods()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods {
		if slices.Contains(nodes, p.Spec.NodeName) && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p.Name
		}
	}
	return out
}

// A change that leaves the config digest alone (here the driver pods'
// labels) restarts every driver pod within the budget, with no node cordoned
// and every GPU job left running: NVIDIA's driver container skips the unload
// when the digest matches, so there is nothing to protect the jobs from.
func TestRestartOnlyChange(t *testing.T) {
	const total = 4
	nodes := faultNodes(t, "ro", "restartonly", total)
	deleteCRs(t, "restart-only")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: restart-only}
spec:
  version: "535.104.12"
  nodeSelector: {restartonly: "yes"}
  upgradePolicy: {maxParallelUpgrades: 2, maxUnavailable: "100%"}
`)
	eventually(t, 2*time.Minute, "the driver on the ro nodes", func() error { return driversRunning(t, "restart-only", total) })
	workloadNamespace(t, gpuNS)
	var jobs strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&jobs, `---
apiVersion: v1
kind: Pod
metadata: {name: job-%s, namespace: %s}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, n, gpuNS, n)
	}
	applyStdin(t, jobs.String())
	jobUIDs := map[string]string{}
	eventually(t, time.Minute, "the jobs running", func() error {
		for _, n := range nodes {
			p := &corev1.Pod{}
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: gpuNS, Name: "job-" + n}, p); err != nil || p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("job-%s not running (%v)", n, err)
			}
			jobUIDs[n] = string(p.UID)
		}
		return nil
	})
	// What a version change would do, before it is made: disruptive, and
	// the bare jobs (no controller, podDeletion.force false) would hold it.
	code, out, errOut := nvdriver(t, "upgrade", "restart-only", "--to", "550.90.07", "--dry-run=server")
	if code != 0 || !strings.Contains(out, "disruptive, 4 node(s)") {
		t.Fatalf("upgrade --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	for _, n := range nodes {
		want := fmt.Sprintf("%s/job-%s may not be removed: no controller would recreate it", gpuNS, n)
		if !strings.Contains(out, want) {
			t.Errorf("upgrade --dry-run does not say %q:\n%s", want, out)
		}
	}
	if v := getDriverE2E(t, "restart-only").Spec.Version; v != "535.104.12" {
		t.Fatalf("the dry run changed the version to %s", v)
	}
	before := driverPodNames(t, nodes)
	cordons := countNodes("restartonly", cordoned)
	// Paused first, so status can be read while all of it is to go: it says
	// the pool's change is restart-only.
	if code, out, errOut := nvdriver(t, "rollout", "pause", "restart-only"); code != 0 {
		t.Fatalf("rollout pause: exit %d\n%s%s", code, out, errOut)
	}
	kubectl(t, "patch", "nvidiadriver/restart-only", "--type=merge", `-p={"spec":{"labels":{"team":"ml"}}}`)
	eventually(t, time.Minute, "the pool said restart-only", func() error {
		r := getDriverE2E(t, "restart-only").Status.Rollout
		if r == nil || r.Phase != v1alpha1.RolloutPaused || len(r.Pools) != 1 || r.Pools[0].Change != upgrade.ChangeRestartOnly || r.Pools[0].Pending != total {
			return fmt.Errorf("rollout %+v", r)
		}
		return nil
	})
	if _, out, _ := nvdriver(t, "status", "restart-only"); !strings.Contains(out, "restart-only (4 to go)") {
		t.Errorf("status does not say the change is restart-only:\n%s", out)
	}
	start := time.Now()
	if code, out, errOut := nvdriver(t, "rollout", "resume", "restart-only"); code != 0 {
		t.Fatalf("rollout resume: exit %d\n%s%s", code, out, errOut)
	}
	eventually(t, 2*time.Minute, "every driver pod replaced and every node done", func() error {
		now := driverPodNames(t, nodes)
		for _, n := range nodes {
			if now[n] == "" || now[n] == before[n] {
				return fmt.Errorf("%s still runs %s", n, before[n])
			}
		}
		return allNodesIn(t, "restart-only", total, upgrade.StateDone)
	})
	rolloutPhase(t, "restart-only", v1alpha1.RolloutComplete, 30*time.Second)
	took := time.Since(start)
	if worst, names := cordons.finish(); worst != 0 {
		t.Errorf("a restart-only change cordoned %v", names)
	}
	for _, n := range nodes {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: gpuNS, Name: "job-" + n}, p); err != nil || string(p.UID) != jobUIDs[n] || p.DeletionTimestamp != nil {
			t.Errorf("the GPU job on %s was evicted or replaced (%v)", n, err)
		}
		node := &corev1.Node{}
		_ = k8s.Get(context.Background(), clientKey(n), node)
		if _, ok := node.Annotations[upgrade.AnnotationRestartOnly]; ok {
			t.Errorf("%s kept the restart-only annotation", n)
		}
	}
	t.Logf("labels-only change: %d driver pods replaced in %s, no node cordoned, %d GPU jobs kept", total, took.Round(100*time.Millisecond), total)
}

// transitionQuantiles reads the controller's per-transition latency
// histogram: its p50 and p95 as bucket upper bounds, and the count.
func transitionQuantiles(r *replica) string {
	const name = "nvdriver_upgrade_transition_seconds"
	count := r.metric(name + "_count")
	if count <= 0 {
		return "no transitions recorded"
	}
	// The bounds as the controller exports them, in its order (ascending):
	// a copy here would drift when its buckets change.
	var bounds []string
	for _, le := range r.labelValues(name+"_bucket", "le") {
		if le != "+Inf" && !slices.Contains(bounds, le) {
			bounds = append(bounds, le)
		}
	}
	bound := func(q float64) string {
		for _, le := range bounds {
			if r.metric(name+"_bucket", `le="`+le+`"`) >= q*count {
				return "<=" + le + "s"
			}
		}
		return "above the last bucket"
	}
	return fmt.Sprintf("p50 %s, p95 %s over %.0f transitions", bound(0.5), bound(0.95), count)
}

// checkTransitionParts: every transition the controller wrote is split by
// whose time it was, and each wrote its node through the client that times
// the API server's answers (cmd/controller wires TimeAnswers), so the
// answers' part is not empty and no part exceeds the whole.
func checkTransitionParts(t *testing.T, r *replica) {
	t.Helper()
	const whole, parts = "nvdriver_upgrade_transition_seconds", "nvdriver_upgrade_transition_part_seconds"
	n, sum := r.metric(whole+"_count"), r.metric(whole+"_sum")
	if n <= 0 {
		t.Errorf("no transitions recorded")
		return
	}
	total := 0.0
	for _, part := range []string{"answer", "worker", "own"} {
		if c := r.metric(parts+"_count", `part="`+part+`"`); c != n {
			t.Errorf("%.0f transitions but %.0f observations of their %s part", n, c, part)
		}
		total += r.metric(parts+"_sum", `part="`+part+`"`)
	}
	if a := r.metric(parts+"_sum", `part="answer"`); a <= 0 {
		t.Errorf("the transitions' answer part is %.3f s: the API server's answers are not timed", a)
	}
	// own is clamped at 0, so the parts may exceed the whole by rounding only.
	if total > sum*1.01+0.001 {
		t.Errorf("the parts add up to %.3f s, the transitions to %.3f s", total, sum)
	}
	t.Logf("transitions: %.0f, %.2f s in all: the API server's answers %.2f s, waiting for a worker %.2f s, the controller's own %.2f s",
		n, sum, r.metric(parts+"_sum", `part="answer"`), r.metric(parts+"_sum", `part="worker"`), r.metric(parts+"_sum", `part="own"`))
}
