package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// rolloutSampler watches the nodes labelled key=yes every 100 ms: states
// never go back, driver pods seen per node, most nodes cordoned at once.
type rolloutSampler struct {
	mu          sync.Mutex
	problems    []string
	podsSeen    map[string]map[string]bool
	maxRank     map[string]int
	maxCordoned int
	stop, done  chan struct{}
}

func sampleRollout(key string) *rolloutSampler {
	s := &rolloutSampler{podsSeen: map[string]map[string]bool{}, maxRank: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			nl := &corev1.NodeList{}
			pods := &corev1.PodList{}
			if k8s.List(context.Background(), nl, client.MatchingLabels{key: "yes"}) != nil ||
				k8s.List(context.Background(), pods, client.InNamespace(driverNS), client.MatchingLabels{"app.kubernetes.io/component": "nvidia-driver"}) != nil {
				continue
			}
			mine := map[string]bool{}
			s.mu.Lock()
			cordoned := 0
			for _, n := range nl.Items {
				mine[n.Name] = true
				if n.Spec.Unschedulable {
					cordoned++
				}
				if r, ok := stateRank[n.Labels[upgrade.LabelState]]; ok {
					if r < s.maxRank[n.Name] {
						s.problems = append(s.problems, fmt.Sprintf("%s went back to %s", n.Name, n.Labels[upgrade.LabelState]))
					}
					s.maxRank[n.Name] = max(s.maxRank[n.Name], r)
				}
			}
			s.maxCordoned = max(s.maxCordoned, cordoned)
			for _, p := range pods.Items {
				if mine[p.Spec.NodeName] {
					if s.podsSeen[p.Spec.NodeName] == nil {
						s.podsSeen[p.Spec.NodeName] = map[string]bool{}
					}
					s.podsSeen[p.Spec.NodeName][p.Name] = true
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// underWay: some node has entered the machine.
func (s *rolloutSampler) underWay() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.maxRank {
		if r > 0 {
			return nil
		}
	}
	return fmt.Errorf("no node in the machine yet")
}

// restarted: the node has had a second driver pod (its new one).
func (s *rolloutSampler) restarted(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.podsSeen[node]) >= 2
}

// check stops the sampler and reports what it saw go wrong.
func (s *rolloutSampler) check(t *testing.T, nodes []string, budget int) {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	// The last node's new pod may have come after the sampler's last look.
	if pods, err := listDriverPods(); err == nil {
		for _, p := range pods {
			if s.podsSeen[p.Spec.NodeName] != nil {
				s.podsSeen[p.Spec.NodeName][p.Name] = true
			}
		}
	}
	for _, p := range s.problems {
		t.Error(p)
	}
	for _, n := range nodes {
		if len(s.podsSeen[n]) != 2 {
			t.Errorf("%s had %d driver pods over the rollout, want 2 (old, new)", n, len(s.podsSeen[n]))
		}
	}
	if s.maxCordoned > budget {
		t.Errorf("%d nodes cordoned at once, budget %d", s.maxCordoned, budget)
	}
}

// rolledOnto: every node of the driver is upgrade-done and every driver pod
// on a node named prefix-* runs version.
func rolledOnto(t *testing.T, driver string, total int, prefix, version string) error {
	if err := allNodesIn(t, driver, total, upgrade.StateDone); err != nil {
		return err
	}
	pods, err := listDriverPods()
	if err != nil {
		return err
	}
	for _, p := range pods {
		if strings.HasPrefix(p.Spec.NodeName, prefix+"-") && !strings.Contains(p.Spec.Containers[0].Image, version) {
			return fmt.Errorf("%s still on %s", p.Name, p.Spec.Containers[0].Image)
		}
	}
	return nil
}

// faultNodes creates total GPU nodes prefix-0.. labelled key=yes, deleted at the end.
func faultNodes(t *testing.T, prefix, key string, total int) []string {
	t.Helper()
	if out, err := run("go", "run", "./test/cluster/nodes", "--kubeconfig", kubeconfig, "--prefix", prefix, "--gpu-nodes", fmt.Sprint(total), "--os", "ubuntu22.04", "--extras=false"); err != nil {
		t.Fatalf("creating nodes: %v\n%s", err, out)
	}
	var nodes []string
	for i := range total {
		nodes = append(nodes, fmt.Sprintf("%s-%d", prefix, i))
	}
	t.Cleanup(func() { _, _ = run("kubectl", append([]string{"delete", "node", "--ignore-not-found"}, nodes...)...) })
	labelNodes(t, key, "yes", nodes...)
	return nodes
}

// kube-apiserver answers 30 % of the controller's and the plugin's writes
// and 10 % of their reads with 429 or 500 for 60 s in the middle of a
// rollout (a proxy between them): the controller backs off (its request
// rate is reported), loses no decision (no state repeated, two driver pods
// per node, the budget kept) and finishes; upgrade --wait and status -w,
// through the same proxy, keep following and end normally.
func TestAPIErrorsDuringRollout(t *testing.T) {
	fullFaultsOnly(t)
	// One node at a time, so the rollout runs through the whole fault.
	const total, parallel = 16, 1
	nodes := faultNodes(t, "ae", "apierr", total)
	proxy := startFaultProxy(t)
	stopController()
	t.Cleanup(func() {
		if err := startController(); err != nil {
			t.Fatal(err)
		}
	})
	ctrl := startReplicaWith(t, "via-proxy", proxy.kubeconfig(t, chartServiceAccount))
	eventually(t, time.Minute, "the controller behind the proxy leading", func() error {
		if !ctrl.leading() {
			return fmt.Errorf("not leading")
		}
		return nil
	})
	deleteCRs(t, "api-errors")
	applyStdin(t, fmt.Sprintf(`apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: api-errors}
spec:
  version: "470.141.10"
  nodeSelector: {apierr: "yes"}
  upgradePolicy: {maxParallelUpgrades: %d, maxUnavailable: "100%%"}
`, parallel))
	eventually(t, 2*time.Minute, "the drivers on the ae nodes", func() error { return driversRunning(t, "api-errors", total) })

	pluginKC := proxy.kubeconfig(t, "")
	watch := startStatusWatchWith(t, "api-errors", pluginKC)
	sampler := sampleRollout("apierr")
	type result struct {
		code        int
		out, errOut string
	}
	res := make(chan result, 1)
	go func() {
		code, out, errOut := nvdriverNoT("upgrade", "api-errors", "--to", "525.125.06", "--wait", "--timeout", "8m", "--kubeconfig", pluginKC)
		res <- result{code, out, errOut}
	}()
	eventually(t, 30*time.Second, "the rollout under way", sampler.underWay)
	doneNodes := func() int {
		n := 0
		for _, node := range ownedNodes(t, "api-errors") {
			if node.Labels[upgrade.LabelState] == upgrade.StateDone && sampler.restarted(node.Name) {
				n++
			}
		}
		return n
	}
	before, doneBefore, framesBefore := proxy.requests.Load(), doneNodes(), strings.Count(watch.since(0), "\n---")
	proxy.set(0.3, false)
	proxy.readErrors(0.1)
	faultStart := time.Now()
	// The fault lasts 60 s whatever happens meanwhile (the sampler watches).
	<-time.After(60 * time.Second)
	proxy.set(0, false)
	proxy.readErrors(0)
	during := proxy.requests.Load() - before
	t.Logf("60 s of injected errors: %d requests through the proxy (%.1f/s: controller, upgrade --wait and status -w), %d requests answered with 429/500, %d writes passed; nodes upgraded during the fault: %d (%d before it); status -w frames during it: %d",
		during, float64(during)/time.Since(faultStart).Seconds(), proxy.injected.Load(), proxy.writes.Load(), doneNodes()-doneBefore, doneBefore,
		strings.Count(watch.since(0), "\n---")-framesBefore)
	if rate := float64(during) / time.Since(faultStart).Seconds(); rate > 100 {
		t.Errorf("%.0f requests/s during the fault: a retry storm", rate)
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(5 * time.Minute):
		t.Fatal("upgrade --wait did not return")
	}
	if r.code != 0 {
		t.Fatalf("upgrade --wait through the errors: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	t.Logf("upgrade --wait: %s", strings.TrimSpace(r.errOut))
	if !strings.Contains(r.errOut, "still following") || !strings.Contains(r.errOut, "following again") {
		t.Errorf("upgrade --wait did not say it lost and found the API server again:\n%s", r.errOut)
	}
	eventually(t, 3*time.Minute, "every node on the new driver", func() error { return rolledOnto(t, "api-errors", total, "ae", "525.125.06") })
	sampler.check(t, nodes, parallel)
	mark := watch.len()
	kubectl(t, "patch", "nvidiadriver/api-errors", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	eventually(t, 30*time.Second, "status -w to show a change made after the errors", func() error {
		if !strings.Contains(watch.since(mark), `"version": "550.90.07"`) {
			return fmt.Errorf("no frame with the new version yet")
		}
		return nil
	})
	watch.stop(t)
	if data, err := os.ReadFile(ctrl.log); err == nil {
		t.Logf("controller log lines with the injected error: %d", strings.Count(string(data), "injected by the e2e fault proxy"))
	}
}

// The controller is cut off from kube-apiserver (every connection through
// its proxy dropped) for longer than its Lease: it stops leading and exits
// (controller-runtime's rule on a lost Lease), the other replica takes over,
// and when the partition heals nothing of the first reaches the API: no
// write passed the proxy after the cut.
func TestControllerPartition(t *testing.T) {
	proxy := startFaultProxy(t)
	stopController()
	t.Cleanup(func() {
		if err := startController(); err != nil {
			t.Fatal(err)
		}
	})
	a := startReplicaWith(t, "partitioned", proxy.kubeconfig(t, chartServiceAccount))
	eventually(t, time.Minute, "the partitioned replica leading", func() error {
		if !a.leading() {
			return fmt.Errorf("not leading")
		}
		return nil
	})
	b := startReplica(t, "direct")
	cut := time.Now()
	proxy.set(0, true)
	writesAtCut := proxy.writes.Load()
	var exited, took time.Duration
	eventually(t, 90*time.Second, "the partitioned replica to exit and the other to lead", func() error {
		select {
		case <-a.done:
			if exited == 0 {
				exited = time.Since(cut)
			}
		default:
			return fmt.Errorf("the partitioned replica still runs")
		}
		if !b.leading() {
			return fmt.Errorf("the other replica not leading yet")
		}
		took = time.Since(cut)
		return nil
	})
	proxy.set(0, false) // heal
	t.Logf("partition: the cut-off replica exited %s after the cut, the other led %s after it; %d requests dropped",
		exited.Round(100*time.Millisecond), took.Round(100*time.Millisecond), proxy.dropped.Load())
	if code := a.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("the cut-off replica exited 0: losing the Lease is an error")
	}
	if data, err := os.ReadFile(a.log); err == nil && !strings.Contains(string(data), "leader election lost") {
		t.Errorf("the cut-off replica's log does not say it lost the Lease:\n%s", tail(string(data), 10))
	}
	// A change after the heal is reconciled by the new leader alone.
	labelNodes(t, "partition", "yes", "gpu-node-5")
	deleteCRs(t, "partition")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: partition}
spec: {version: "535.104.12", nodeSelector: {partition: "yes"}}
`)
	eventually(t, time.Minute, "the new leader reconciling", func() error { return allNodesIn(t, "partition", 1, upgrade.StateDone) })
	if w := proxy.writes.Load() - writesAtCut; w != 0 {
		t.Errorf("%d writes of the cut-off replica reached kube-apiserver after the cut", w)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// status -w whose connections are all cut (watches included) for 10 s says
// once that it lost the API server and, when a change comes through after
// the heal, that it is back; the frame with the change follows.
func TestStatusWatchSaysWhenItLosesTheAPIServer(t *testing.T) {
	labelNodes(t, "sw", "yes", "gpu-node-4")
	deleteCRs(t, "status-watch")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: status-watch}
spec: {version: "535.104.12", nodeSelector: {sw: "yes"}}
`)
	proxy := startFaultProxy(t)
	watch := startStatusWatchWith(t, "status-watch", proxy.kubeconfig(t, ""))
	proxy.mu.Lock()
	open := len(proxy.conns)
	proxy.mu.Unlock()
	proxy.cut()
	eventually(t, 30*time.Second, "status -w to say it lost the API server", func() error {
		if !strings.Contains(watch.errOut.String(), "watching the API server failed") {
			return fmt.Errorf("stderr so far: %q (%d connections cut, %d requests dropped since)", watch.errOut.String(), open, proxy.dropped.Load())
		}
		return nil
	})
	proxy.set(0, false) // heal
	mark := watch.len()
	kubectl(t, "patch", "nvidiadriver/status-watch", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	eventually(t, 60*time.Second, "status -w back with the change", func() error {
		if !strings.Contains(watch.since(mark), `"version": "550.90.07"`) {
			return fmt.Errorf("no frame with the new version yet")
		}
		return nil
	})
	watch.stop(t)
	e := watch.errOut.String()
	if strings.Count(e, "still following") != 1 || !strings.Contains(e, "API server back; following again") || strings.Contains(e, "SetLogger") {
		t.Errorf("status -w's stderr:\n%s\nwant one 'still following', one 'API server back; following again', nothing else", e)
	}
	t.Logf("status -w across a cut: %s", strings.ReplaceAll(strings.TrimSpace(e), "\n", " | "))
}
