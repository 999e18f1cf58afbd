package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// etcd SIGKILLed for 4 s and restarted with its own command line under a
// running rollout: the same controller process finishes it, no node goes
// back a state, every node has exactly two driver pods over the rollout
// (old and new), nothing is left cordoned, one DaemonSet.
func TestEtcdRestartMidRollout(t *testing.T) {
	const total = 4
	nodes := faultNodes(t, "et", "etcd", total)
	deleteCRs(t, "etcd-restart")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: etcd-restart}
spec:
  version: "470.141.10"
  nodeSelector: {etcd: "yes"}
  upgradePolicy: {maxParallelUpgrades: 1}
`)
	eventually(t, 2*time.Minute, "the drivers on the et nodes", func() error { return driversRunning(t, "etcd-restart", total) })
	pid := controller.Process.Pid
	dsBefore := driverDSUIDs(t, "etcd-restart")

	sampler := sampleRollout("etcd")
	kubectl(t, "patch", "nvidiadriver/etcd-restart", "--type=merge", `-p={"spec":{"version":"525.125.06"}}`)
	eventually(t, time.Minute, "the rollout under way", sampler.underWay)
	start := time.Now()
	restartComponent(t, "etcd", 4*time.Second)
	t.Logf("etcd down 4 s, kube-apiserver ready again %s after the kill", time.Since(start).Round(100*time.Millisecond))
	eventually(t, 4*time.Minute, "the rollout to finish after the etcd restart", func() error {
		return rolledOnto(t, "etcd-restart", total, "et", "525.125.06")
	})
	sampler.check(t, nodes, 1)
	t.Logf("rollout of %d nodes with an etcd restart in it: %s", total, time.Since(start).Round(time.Second))
	if controller.ProcessState != nil || controller.Process.Pid != pid {
		t.Fatal("the controller was restarted: it must recover on its own")
	}
	if out, err := exec.Command("kill", "-0", strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("the controller exited during the etcd outage: %v %s", err, out)
	}
	for _, n := range nodes {
		node := &corev1.Node{}
		if err := k8s.Get(context.Background(), clientKey(n), node); err != nil || node.Spec.Unschedulable {
			t.Errorf("%s left unschedulable (%v)", n, err)
		}
	}
	if after := driverDSUIDs(t, "etcd-restart"); fmt.Sprint(after) != fmt.Sprint(dsBefore) {
		t.Errorf("DaemonSets were recreated: %v -> %v", dsBefore, after)
	}
}
