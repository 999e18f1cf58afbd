package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// notReadyAnnotation stops kwok from making the node Ready again
// (test/tools/kwok/cmd/stages).
const notReadyAnnotation = "nvdriver.test/not-ready"

// setNodeReady makes a kwok node NotReady (as a kubelet that stopped
// reporting would leave it) or lets kwok make it Ready again.
func setNodeReady(t *testing.T, name string, ready bool) {
	t.Helper()
	if ready {
		kubectl(t, "annotate", "node", name, notReadyAnnotation+"-")
		return
	}
	kubectl(t, "annotate", "node", name, notReadyAnnotation+"=true", "--overwrite")
	kubectl(t, "patch", "node", name, "--subresource=status", "--type=strategic", "-p",
		`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady","message":"simulated by the e2e test"}]}}`)
}

// A node that goes NotReady in the middle of its upgrade counts against
// maxUnavailable: with maxUnavailable 1 no other node leaves service while
// it is NotReady (sampled every 100 ms: never two nodes out of service), and
// when it is Ready again the rollout finishes, nothing left cordoned.
func TestNodeNotReadyMidUpgrade(t *testing.T) {
	fullFaultsOnly(t)
	const total = 3
	faultNodes(t, "nr", "notready", total)
	deleteCRs(t, "notready")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: notready}
spec:
  version: "470.141.10"
  nodeSelector: {notready: "yes"}
  upgradePolicy: {maxParallelUpgrades: 0, maxUnavailable: 1, podDeletion: {force: true}, waitForCompletion: {podSelector: "app=hold"}}
`)
	eventually(t, 2*time.Minute, "the drivers running and Ready on the nr nodes", func() error {
		if err := allNodesIn(t, "notready", total, upgrade.StateDone); err != nil {
			return err
		}
		d := &v1alpha1.NVIDIADriver{}
		if err := k8s.Get(context.Background(), clientKey("notready"), d); err != nil {
			return err
		}
		if d.Status.State != v1alpha1.Ready {
			return fmt.Errorf("state %q", d.Status.State)
		}
		return nil
	})

	// Out of service: NotReady or cordoned.
	out := countNodes("notready", func(n *corev1.Node) bool { return n.Spec.Unschedulable || !nodeReady(n) })
	// A job that holds nr-0 (the first in name order) in wait-for-jobs-required,
	// so it is mid-upgrade when it goes NotReady.
	workloadNamespace(t, gpuNS)
	applyStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: hold, namespace: %s, labels: {app: hold}}
spec:
  nodeName: nr-0
  automountServiceAccountToken: false
  containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, gpuNS))
	kubectl(t, "patch", "nvidiadriver/notready", "--type=merge", `-p={"spec":{"version":"525.125.06"}}`)
	const first = "nr-0"
	eventually(t, time.Minute, first+" waiting for its job", func() error {
		n := &corev1.Node{}
		if err := k8s.Get(context.Background(), clientKey(first), n); err != nil {
			return err
		}
		if s := n.Labels[upgrade.LabelState]; s != upgrade.StateWaitForJobs {
			return fmt.Errorf("in %q", s)
		}
		return nil
	})
	setNodeReady(t, first, false)
	t.Cleanup(func() { _, _ = run("kubectl", "annotate", "node", first, notReadyAnnotation+"-") })
	// The job ends while the node is NotReady: the node goes on through the
	// machine (or waits in it), and stays unavailable whatever its state.
	kubectl(t, "-n", gpuNS, "delete", "pod", "hold", "--wait=false")
	// NotReady for 20 s: long enough for the machine to have handed the slot
	// on several times (it re-checks every 2 s).
	notReadyUntil := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(notReadyUntil); <-tick.C {
		nl := &corev1.NodeList{}
		if err := k8s.List(context.Background(), nl, client.MatchingLabels{"notready": "yes"}); err == nil {
			for _, n := range nl.Items {
				if s := n.Labels[upgrade.LabelState]; n.Name != first && s != upgrade.StateDone && s != upgrade.StateRequired && s != "" {
					t.Fatalf("%s entered the machine (%s) while %s was NotReady: its slot was handed on", n.Name, s, first)
				}
			}
		}
	}
	n0 := &corev1.Node{}
	if err := k8s.Get(context.Background(), clientKey(first), n0); err == nil {
		t.Logf("%s after 20 s NotReady, its job gone: %s", first, n0.Labels[upgrade.LabelState])
	}
	setNodeReady(t, first, true)
	eventually(t, 3*time.Minute, "the rollout to finish once the node is back", func() error {
		if err := allNodesIn(t, "notready", total, upgrade.StateDone); err != nil {
			return err
		}
		nl := &corev1.NodeList{}
		if err := k8s.List(context.Background(), nl, client.MatchingLabels{"notready": "yes"}); err != nil {
			return err
		}
		for _, n := range nl.Items {
			if n.Spec.Unschedulable || !nodeReady(&n) {
				return fmt.Errorf("%s still out of service", n.Name)
			}
		}
		return nil
	})
	worst, worstNodes := out.finish()
	t.Logf("%s NotReady for 20 s mid-upgrade; most nodes out of service at once: %d %v", first, worst, worstNodes)
	if worst > 1 {
		t.Errorf("%d nodes out of service at once (%v), maxUnavailable 1", worst, worstNodes)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
