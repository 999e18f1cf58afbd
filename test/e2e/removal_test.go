package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// The removal rules of spec.upgradePolicy, as NVIDIA's operator applies them
// with kubectl's drain code: under podDeletion.deleteEmptyDir: false a GPU
// pod with an emptyDir stays, and under force: false an unmanaged GPU pod
// stays; each node ends upgrade-failed, still cordoned, with a reason naming
// the pod, and nothing is evicted. With drain.enable the failed deletion
// hands over to the drain, which removes only what its podSelector matches;
// a GPU pod the selector leaves fails the node instead of restarting the
// driver under it.
func TestUpgradeHonoursRemovalRules(t *testing.T) {
	const ns = "e2e-removal"
	workloadNamespace(t, ns)
	labelNodes(t, "rm", "strict", "gpu-node-1", "gpu-node-2")
	labelNodes(t, "rm", "drain", "gpu-node-3")
	labelNodes(t, "rm", "narrow", "gpu-node-5")
	deleteCRs(t, "rm-strict", "rm-drain", "rm-narrow")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: rm-strict}
spec:
  version: "535.104.12"
  nodeSelector: {rm: strict}
  upgradePolicy:
    maxParallelUpgrades: 0
    maxUnavailable: "100%"
    podDeletion: {force: false, deleteEmptyDir: false, timeoutSeconds: 120}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: rm-drain}
spec:
  version: "535.104.12"
  nodeSelector: {rm: drain}
  upgradePolicy:
    maxParallelUpgrades: 0
    maxUnavailable: "100%"
    podDeletion: {force: false, deleteEmptyDir: false, timeoutSeconds: 120}
    drain: {enable: true, force: true, deleteEmptyDir: true, podSelector: "drain=yes", timeoutSeconds: 120}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: rm-narrow}
spec:
  version: "535.104.12"
  nodeSelector: {rm: narrow}
  upgradePolicy:
    maxParallelUpgrades: 0
    maxUnavailable: "100%"
    podDeletion: {force: false, deleteEmptyDir: false, timeoutSeconds: 120}
    drain: {enable: true, force: true, deleteEmptyDir: true, podSelector: "drain=yes", timeoutSeconds: 120}
`)
	eventually(t, 2*time.Minute, "both CRs on the old version", func() error {
		if err := allNodesIn(t, "rm-strict", 2, upgrade.StateDone); err != nil {
			return err
		}
		if err := allNodesIn(t, "rm-narrow", 1, upgrade.StateDone); err != nil {
			return err
		}
		return allNodesIn(t, "rm-drain", 1, upgrade.StateDone)
	})
	// gpu-node-1: a managed GPU pod with scratch space; gpu-node-2: a GPU pod
	// no controller would recreate; gpu-node-3: a GPU pod with scratch space
	// and a CPU pod, both labelled for the drain, and a CPU pod that is not.
	pod := func(name, node, labels string, gpu, emptyDir bool) string {
		res, vols := "", ""
		if gpu {
			res = `, resources: {limits: {nvidia.com/gpu: "1"}}`
		}
		if emptyDir {
			vols = "\n  volumes: [{name: scratch, emptyDir: {}}]"
		}
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  nodeName: %s
  automountServiceAccountToken: false
  containers: [{name: c, image: nvcr.io/nvidia/cuda:12.4.0-base%s}]%s
---
`, name, ns, labels, node, res, vols)
	}
	applyStdin(t, fmt.Sprintf(`apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: scratch, namespace: %[1]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: scratch}}
  template:
    metadata: {labels: {app: scratch}}
    spec:
      nodeSelector: {kubernetes.io/hostname: gpu-node-1}
      automountServiceAccountToken: false
      containers: [{name: c, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
      volumes: [{name: scratch, emptyDir: {}}]
---
`, ns)+pod("bare-gpu", "gpu-node-2", "app: bare", true, false)+
		pod("drain-gpu", "gpu-node-3", "drain: \"yes\"", true, true)+
		pod("drain-cpu", "gpu-node-3", "drain: \"yes\"", false, false)+
		pod("stay-cpu", "gpu-node-3", "app: stay", false, false)+
		// gpu-node-5: a GPU pod with scratch space the drain's selector misses.
		pod("narrow-gpu", "gpu-node-5", "app: narrow", true, true))
	eventually(t, time.Minute, "the workload pods running", func() error {
		out := kubectl(t, "get", "pods", "-n", ns, "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}")
		if strings.Count(out, "=Running") != 6 {
			return fmt.Errorf("pods: %s", out)
		}
		return nil
	})
	scratchPod := strings.TrimSpace(kubectl(t, "get", "pods", "-n", ns, "-l", "app=scratch", "-o", "jsonpath={.items[0].metadata.name}"))

	kubectl(t, "patch", "nvidiadriver/rm-strict", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	kubectl(t, "patch", "nvidiadriver/rm-drain", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	kubectl(t, "patch", "nvidiadriver/rm-narrow", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	eventually(t, 2*time.Minute, "rm-strict's and rm-narrow's nodes failed, rm-drain's done", func() error {
		if err := allNodesIn(t, "rm-strict", 2, upgrade.StateFailed); err != nil {
			return err
		}
		// Not back and forth between pod deletion and the drain: failed,
		// naming the pod the selector leaves.
		if err := allNodesIn(t, "rm-narrow", 1, upgrade.StateFailed); err != nil {
			return err
		}
		return allNodesIn(t, "rm-drain", 1, upgrade.StateDone)
	})
	for _, name := range []string{"gpu-node-1", "gpu-node-2"} {
		n := &corev1.Node{}
		_ = k8s.Get(context.Background(), clientKey(name), n)
		if !n.Spec.Unschedulable {
			t.Errorf("%s failed its upgrade but is not cordoned", name)
		}
	}
	pods := kubectl(t, "get", "pods", "-n", ns, "-o", "jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName}/{.metadata.deletionTimestamp} {end}")
	for _, want := range []string{scratchPod + "=gpu-node-1/ ", "bare-gpu=gpu-node-2/ ", "stay-cpu=gpu-node-3/ ", "narrow-gpu=gpu-node-5/ "} {
		if !strings.Contains(pods+" ", want) {
			t.Errorf("pod %s was removed, or moved: %s", strings.Split(want, "=")[0], pods)
		}
	}
	for _, gone := range []string{"drain-gpu=", "drain-cpu="} {
		if strings.Contains(pods, gone) {
			t.Errorf("the drain left %s: %s", strings.TrimSuffix(gone, "="), pods)
		}
	}
	// Each node keeps its reason; Events with one reason and action are
	// merged into a series by client-go's recorder (the second text can be
	// lost), so one Event is required, and every reason on its node.
	events := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=rm-strict", "-o", "jsonpath={range .items[*]}{.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, "upgrade failed: spec.upgradePolicy.podDeletion does not allow removing "+ns+"/") {
		t.Errorf("no upgrade-failed event naming a pod in\n%s", events)
	}
	for node, want := range map[string]string{
		"gpu-node-1": "spec.upgradePolicy.podDeletion does not allow removing " + ns + "/" + scratchPod + " (it has an emptyDir volume",
		"gpu-node-2": "spec.upgradePolicy.podDeletion does not allow removing " + ns + "/bare-gpu (no controller would recreate it: set spec.upgradePolicy.podDeletion.force: true",
	} {
		n := &corev1.Node{}
		if err := k8s.Get(context.Background(), clientKey(node), n); err != nil || !strings.Contains(n.Annotations[upgrade.AnnotationFailure], want) {
			t.Errorf("%s's failure reason %q lacks %q (%v)", node, n.Annotations[upgrade.AnnotationFailure], want, err)
		}
	}

	narrow := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=rm-narrow", "-o", "jsonpath={range .items[*]}{.note}{.message}{\"\\n\"}{end}")
	if want := "node gpu-node-5: upgrade failed: spec.upgradePolicy.drain does not allow removing " + ns + "/narrow-gpu (a GPU pod spec.upgradePolicy.drain.podSelector does not select"; !strings.Contains(narrow, want) {
		t.Errorf("no event %q in\n%s", want, narrow)
	}

	// Allowing both kinds and retrying the nodes (NVIDIA's way: relabel)
	// finishes the rollout.
	kubectl(t, "patch", "nvidiadriver/rm-strict", "--type=merge", `-p={"spec":{"upgradePolicy":{"podDeletion":{"force":true,"deleteEmptyDir":true}}}}`)
	kubectl(t, "delete", "pod", "narrow-gpu", "-n", ns, "--wait=true", "--timeout=60s")
	kubectl(t, "label", "node", "gpu-node-1", "gpu-node-2", "gpu-node-5", upgrade.LabelState+"="+upgrade.StateRequired, "--overwrite")
	eventually(t, 2*time.Minute, "rm-strict and rm-narrow done after the retry", func() error {
		if err := allNodesIn(t, "rm-narrow", 1, upgrade.StateDone); err != nil {
			return err
		}
		return allNodesIn(t, "rm-strict", 2, upgrade.StateDone)
	})
}
