package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// A PodDisruptionBudget that never allows the eviction of a GPU job: that
// node times out in pod deletion and ends upgrade-failed with the budget
// named (on the node, for doctor), stays cordoned with its job running; the
// other nodes finish, never more than maxParallelUpgrades of them cordoned;
// doctor names the budget and gives the command that shows it.
func TestPDBThatNeverAllowsEviction(t *testing.T) {
	fullFaultsOnly(t)
	const total, parallel = 3, 2
	nodes := faultNodes(t, "pd", "pdb", total)
	workloadNamespace(t, gpuNS)
	deleteCRs(t, "pdb")
	applyStdin(t, fmt.Sprintf(`apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: pdb}
spec:
  version: "470.141.10"
  nodeSelector: {pdb: "yes"}
  # failureBudget: the blocked node must not halt the others (the default halts at 1).
  upgradePolicy: {maxParallelUpgrades: %d, maxUnavailable: "100%%", failureBudget: "100%%", podDeletion: {force: true, timeoutSeconds: 20}}
`, parallel))
	eventually(t, 2*time.Minute, "the drivers on the pd nodes", func() error { return driversRunning(t, "pdb", total) })

	var jobs strings.Builder
	for i, n := range nodes {
		app := "free"
		if i == 0 {
			app = "protected"
		}
		fmt.Fprintf(&jobs, `---
apiVersion: v1
kind: Pod
metadata: {name: job-%[1]s, namespace: %[2]s, labels: {app: %[3]s}}
spec:
  nodeName: %[1]s
  automountServiceAccountToken: false
  containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, n, gpuNS, app)
	}
	fmt.Fprintf(&jobs, `---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: job-pdb, namespace: %s}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: protected}}
`, gpuNS)
	applyStdin(t, jobs.String())
	// Run before the CR's deletion: the budget would hold its last node.
	t.Cleanup(func() { _, _ = run("kubectl", "-n", gpuNS, "delete", "pdb", "job-pdb", "--ignore-not-found") })
	eventually(t, time.Minute, "the budget to protect its job", func() error {
		out, err := run("kubectl", "-n", gpuNS, "get", "pdb", "job-pdb", "-o", "jsonpath={.status.currentHealthy}/{.status.disruptionsAllowed}")
		if err != nil || out != "1/0" {
			return fmt.Errorf("healthy/allowed %q (%v)", out, err)
		}
		return nil
	})

	cordons := countNodes("pdb", cordoned)
	kubectl(t, "patch", "nvidiadriver/pdb", "--type=merge", `-p={"spec":{"version":"525.125.06"}}`)
	node := &corev1.Node{}
	eventually(t, 2*time.Minute, "pd-0 failed, the others upgraded", func() error {
		if err := k8s.Get(context.Background(), clientKey("pd-0"), node); err != nil {
			return err
		}
		if s := node.Labels[upgrade.LabelState]; s != upgrade.StateFailed {
			return fmt.Errorf("pd-0 in %q", s)
		}
		for _, n := range nodes[1:] {
			other := &corev1.Node{}
			if err := k8s.Get(context.Background(), clientKey(n), other); err != nil || other.Labels[upgrade.LabelState] != upgrade.StateDone {
				return fmt.Errorf("%s in %q", n, other.Labels[upgrade.LabelState])
			}
		}
		return nil
	})
	maxCordoned, _ := cordons.finish()
	reason := node.Annotations[upgrade.AnnotationFailure]
	t.Logf("pd-0: %s", reason)
	if !strings.Contains(reason, "after 20s of eviction") || !strings.Contains(reason, "The disruption budget job-pdb needs 1 healthy pods") {
		t.Errorf("failure reason %q does not name the budget", reason)
	}
	if !node.Spec.Unschedulable {
		t.Error("pd-0 was uncordoned: a failed node stays cordoned")
	}
	job := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: gpuNS, Name: "job-pd-0"}, job); err != nil || job.DeletionTimestamp != nil {
		t.Errorf("the protected job was removed (%v)", err)
	}
	if maxCordoned > parallel {
		t.Errorf("%d pd nodes cordoned at once, budget %d", maxCordoned, parallel)
	}

	_, out, errOut := nvdriver(t, "doctor", "pdb", "-o", "json")
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor: %v\n%s%s", err, out, errOut)
	}
	var f *doctor.Finding
	for i := range r.Findings {
		if r.Findings[i].Check == "upgrades" && r.Findings[i].Severity == doctor.Error {
			f = &r.Findings[i]
		}
	}
	if f == nil || !strings.Contains(f.Message, "PodDisruptionBudget "+gpuNS+"/job-pdb allows no eviction") ||
		!strings.HasPrefix(f.Fix, "kubectl -n "+gpuNS+" get pdb job-pdb -o wide; kubectl label node pd-0 ") {
		t.Fatalf("doctor's upgrades finding %+v does not name the budget and its command", f)
	}
	if out, err := run("sh", "-c", strings.SplitN(f.Fix, "; ", 2)[0]); err != nil || !strings.Contains(out, "job-pdb") {
		t.Errorf("doctor's command %q: %v\n%s", strings.SplitN(f.Fix, "; ", 2)[0], err, out)
	}
}
