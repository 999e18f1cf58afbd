package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// etcd SIGKILLed for 4 s and restarted with its own command line under a
// running rollout: the same controller process finishes it, no node goes
// back a state, every node has exactly two driver pods over the rollout
// (old and new), nothing is left cordoned, one DaemonSet.
func TestEtcdRestartMidRollout(t *testing.T) {
	const total = 4
	if out, err := run("go", "run", "./test/cluster/nodes", "--kubeconfig", kubeconfig, "--prefix", "et", "--gpu-nodes", fmt.Sprint(total), "--os", "ubuntu22.04", "--extras=false"); err != nil {
		t.Fatalf("creating nodes: %v\n%s", err, out)
	}
	var nodes []string
	for i := range total {
		nodes = append(nodes, fmt.Sprintf("et-%d", i))
	}
	t.Cleanup(func() { _, _ = run("kubectl", append([]string{"delete", "node", "--ignore-not-found"}, nodes...)...) })
	labelNodes(t, "etcd", "yes", nodes...)
	deleteCRs(t, "etcd-restart")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: etcd-restart}
spec:
  version: "470.141.10"
  nodeSelector: {etcd: "yes"}
  upgradePolicy: {maxParallelUpgrades: 1}
`)
	eventually(t, 2*time.Minute, "the drivers on the et nodes", func() error { return allNodesIn(t, "etcd-restart", total, upgrade.StateDone) })
	pid := controller.Process.Pid
	dsBefore := driverDSUIDs(t, "etcd-restart")

	var mu sync.Mutex
	var problems []string
	podsSeen, maxRank := map[string]map[string]bool{}, map[string]int{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			nl := &corev1.NodeList{}
			if err := k8s.List(context.Background(), nl, client.MatchingLabels{"etcd": "yes"}); err != nil {
				continue // the outage
			}
			dps := &corev1.PodList{}
			if err := k8s.List(context.Background(), dps, client.InNamespace(driverNS), client.MatchingLabels{"app.kubernetes.io/component": "nvidia-driver"}); err != nil {
				continue
			}
			mu.Lock()
			for _, p := range dps.Items {
				if strings.HasPrefix(p.Spec.NodeName, "et-") {
					if podsSeen[p.Spec.NodeName] == nil {
						podsSeen[p.Spec.NodeName] = map[string]bool{}
					}
					podsSeen[p.Spec.NodeName][p.Name] = true
				}
			}
			for _, n := range nl.Items {
				if r, ok := stateRank[n.Labels[upgrade.LabelState]]; ok {
					if r < maxRank[n.Name] {
						problems = append(problems, fmt.Sprintf("%s went back to %s", n.Name, n.Labels[upgrade.LabelState]))
					}
					maxRank[n.Name] = max(maxRank[n.Name], r)
				}
			}
			mu.Unlock()
		}
	}()

	kubectl(t, "patch", "nvidiadriver/etcd-restart", "--type=merge", `-p={"spec":{"version":"525.125.06"}}`)
	eventually(t, time.Minute, "the rollout under way", func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range maxRank {
			if r > 0 {
				return nil
			}
		}
		return fmt.Errorf("no node in the machine yet")
	})
	start := time.Now()
	restartComponent(t, "etcd", 4*time.Second)
	t.Logf("etcd down 4 s, kube-apiserver ready again %s after the kill", time.Since(start).Round(100*time.Millisecond))
	eventually(t, 4*time.Minute, "the rollout to finish after the etcd restart", func() error {
		if err := allNodesIn(t, "etcd-restart", total, upgrade.StateDone); err != nil {
			return err
		}
		for _, p := range driverPods(t) {
			if strings.HasPrefix(p.Spec.NodeName, "et-") && !strings.Contains(p.Spec.Containers[0].Image, "525.125.06") {
				return fmt.Errorf("%s still on %s", p.Name, p.Spec.Containers[0].Image)
			}
		}
		return nil
	})
	close(stop)
	<-done
	t.Logf("rollout of %d nodes with an etcd restart in it: %s", total, time.Since(start).Round(time.Second))
	if controller.ProcessState != nil || controller.Process.Pid != pid {
		t.Fatal("the controller was restarted: it must recover on its own")
	}
	if out, err := exec.Command("kill", "-0", strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("the controller exited during the etcd outage: %v %s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	for _, n := range nodes {
		if len(podsSeen[n]) != 2 {
			t.Errorf("%s had %d driver pods over the rollout, want 2 (old, new)", n, len(podsSeen[n]))
		}
		node := &corev1.Node{}
		if err := k8s.Get(context.Background(), clientKey(n), node); err != nil || node.Spec.Unschedulable {
			t.Errorf("%s left unschedulable (%v)", n, err)
		}
	}
	if after := driverDSUIDs(t, "etcd-restart"); fmt.Sprint(after) != fmt.Sprint(dsBefore) {
		t.Errorf("DaemonSets were recreated: %v -> %v", dsBefore, after)
	}
}
