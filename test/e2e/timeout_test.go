package e2e

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// stopControllerGracefully sends SIGTERM and waits: the controller releases
// its Lease, so the next one leads at once.
func stopControllerGracefully(t *testing.T) {
	t.Helper()
	if controller == nil || controller.Process == nil {
		return
	}
	_ = controller.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _, _ = controller.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Log("the controller did not stop on SIGTERM within 30 s; killing it")
		stopController()
	}
}

// A step timeout is measured from the start time stored on the node, not
// from the controller's memory: a controller restarted at 90 % of a 30 s
// waitForCompletion timeout moves the node on at the original deadline,
// neither 30 s after the restart nor before the deadline.
func TestStepTimeoutSurvivesARestart(t *testing.T) {
	const timeout = 30 * time.Second
	faultNodes(t, "to", "timeout", 1)
	deleteCRs(t, "timeout")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: timeout}
spec:
  version: "470.141.10"
  nodeSelector: {timeout: "yes"}
`)
	eventually(t, 2*time.Minute, "the driver on to-0", func() error { return driversRunning(t, "timeout", 1) })
	workloadNamespace(t, gpuNS)
	applyStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: long-job, namespace: %s, labels: {app: long-job}}
spec:
  nodeName: to-0
  automountServiceAccountToken: false
  containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, gpuNS))
	kubectl(t, "patch", "nvidiadriver/timeout", "--type=merge", "-p", fmt.Sprintf(
		`{"spec":{"version":"525.125.06","upgradePolicy":{"waitForCompletion":{"podSelector":"app=long-job","timeoutSeconds":%d},"podDeletion":{"force":true}}}}`, int(timeout.Seconds())))

	node := &corev1.Node{}
	var start time.Time
	eventually(t, time.Minute, "to-0 waiting for its job", func() error {
		if err := k8s.Get(context.Background(), clientKey("to-0"), node); err != nil {
			return err
		}
		sec, err := strconv.ParseInt(node.Annotations[upgrade.AnnotationWaitStart], 10, 64)
		if node.Labels[upgrade.LabelState] != upgrade.StateWaitForJobs || err != nil {
			return fmt.Errorf("state %q, start %q", node.Labels[upgrade.LabelState], node.Annotations[upgrade.AnnotationWaitStart])
		}
		start = time.Unix(sec, 0)
		return nil
	})
	deadline := start.Add(timeout)

	// The restart, at 90 % of the timeout.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(start.Add(timeout * 9 / 10)); <-tick.C {
		if err := k8s.Get(context.Background(), clientKey("to-0"), node); err == nil && node.Labels[upgrade.LabelState] != upgrade.StateWaitForJobs {
			t.Fatalf("to-0 left wait-for-jobs-required %s before its deadline (now %q)", time.Until(deadline).Round(time.Second), node.Labels[upgrade.LabelState])
		}
	}
	stopControllerGracefully(t)
	if err := startController(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()

	var left time.Time
	eventually(t, timeout+30*time.Second, "to-0 to leave wait-for-jobs-required", func() error {
		if err := k8s.Get(context.Background(), clientKey("to-0"), node); err != nil {
			return err
		}
		if s := node.Labels[upgrade.LabelState]; s == upgrade.StateWaitForJobs {
			return fmt.Errorf("still waiting")
		}
		left = time.Now()
		return nil
	})
	t.Logf("timeout %s, restart %s before the deadline, the node moved on %s after it", timeout,
		deadline.Sub(restarted).Round(100*time.Millisecond), left.Sub(deadline).Round(100*time.Millisecond))
	if left.Before(deadline) {
		t.Errorf("the node moved on %s before the deadline stored on it", deadline.Sub(left))
	}
	if late := left.Sub(deadline); late > 10*time.Second {
		t.Errorf("the node moved on %s after the deadline: the restart restarted the timeout", late)
	}
	eventually(t, 2*time.Minute, "to-0 upgraded", func() error { return allNodesIn(t, "timeout", 1, upgrade.StateDone) })
}
