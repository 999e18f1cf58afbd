package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// convergeStart is how many nodes the cluster has when the converge phase's
// controller starts; the rest arrive in batches of --batch while it runs.
const convergeStart = 8

// converge is the procedure NVIDIA's GPU Operator was measured with: one
// NVIDIADriver selecting every GPU node, the controller (leader election
// off) started on 8 nodes, the other N-8 created in batches while it runs,
// until the CR is ready with a driver pod available on every node. It
// measures the controller's CPU seconds and API requests for all of it,
// profiles the CPU, then removes the CR (the controller releases every node)
// and strips the GPU labels, so the fleet phases start on a cluster the
// controller has never seen.
func (e *env) converge() error {
	if err := e.createNodeRange(0, min(convergeStart, *nodesN)); err != nil {
		return err
	}
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "converge"}}
	d.Spec.Version = "535.104.12"
	d.Spec.Repository = e.reg.Host + "/nvidia"
	if err := e.pushImages([]*v1alpha1.NVIDIADriver{d}); err != nil {
		return err
	}
	if err := e.c.Create(context.Background(), d); err != nil {
		return fmt.Errorf("creating NVIDIADriver converge: %w", err)
	}
	t0 := time.Now()
	ctrl, err := startController(e.kubeconfig, "converge", "--leader-elect=false")
	if err != nil {
		return err
	}
	defer ctrl.stop() // on an error; stopping twice is harmless
	prof := ctrl.profileUntil()
	lastAvail, since := -1, time.Now()
	for first := convergeStart; first < *nodesN; first += *batch {
		if err := e.createNodeRange(first, min(first+*batch, *nodesN)); err != nil {
			return err
		}
	}
	if err := poll(60*time.Minute, "converge: the CR ready with a driver pod available on every node", func() (bool, error) {
		got := &v1alpha1.NVIDIADriver{}
		if err := e.c.Get(context.Background(), client.ObjectKey{Name: "converge"}, got); err != nil {
			return false, err
		}
		avail := e.availableDriverPods()
		if avail != lastAvail {
			lastAvail, since = avail, time.Now()
		} else if avail < *nodesN && time.Since(since) > time.Minute {
			e.repairKwokReadiness()
			since = time.Now()
		}
		if got.Status.State != v1alpha1.Ready || got.Status.ObservedGeneration != got.Generation {
			return false, nil
		}
		return avail >= *nodesN, nil
	}); err != nil {
		return err
	}
	cpu, m := ctrl.cpuSeconds(), ctrl.scrape()
	res.Values["converge_seconds"] = time.Since(t0).Seconds()
	res.Values["converge_cpu_seconds"] = cpu
	res.Values["converge_requests"] = m.sum("rest_client_requests_total", nil)
	res.Values["converge_writes"] = m.sum("nvdriver_api_writes_total", nil)
	res.Values["converge_rss_mib"] = ctrl.rssMiB()
	res.Values["converge_peak_rss_mib"] = ctrl.peakRSSMiB()
	res.Values["converge_heap_inuse_mib"] = m.sum("go_memstats_heap_inuse_bytes", nil) / (1 << 20)
	res.Values["converge_rss_file_mib"] = ctrl.procStatus("RssFile")
	prof(fmt.Sprintf("bench-results/converge-cpu-%d.pprof", *nodesN))
	ctrl.heapProfile(fmt.Sprintf("bench-results/converge-heap-%d.pprof", *nodesN))
	logf("converge %d → %d nodes, one CR: %.1f s wall, %.1f controller CPU s (%.1f ms/node), %.0f API requests (%.2f/node), %.0f writes, RSS %.0f MiB (peak %.0f; %.0f MiB file-backed), heap in use %.0f MiB",
		convergeStart, *nodesN, res.Values["converge_seconds"], cpu, cpu/float64(*nodesN)*1000, res.Values["converge_requests"],
		res.Values["converge_requests"]/float64(*nodesN), res.Values["converge_writes"], res.Values["converge_rss_mib"], res.Values["converge_peak_rss_mib"], res.Values["converge_rss_file_mib"], res.Values["converge_heap_inuse_mib"])
	byVerb := map[string]float64{}
	for _, s := range m {
		if s.name == "rest_client_requests_total" {
			byVerb[s.labels["method"]] += s.value
		}
	}
	writes := map[string]float64{}
	for _, s := range m {
		if s.name == "nvdriver_api_writes_total" {
			writes[s.labels["verb"]+" "+s.labels["resource"]] += s.value
		}
	}
	logf("converge requests by method: %v; writes: %v", byVerb, writes)
	reconciles := map[string]float64{}
	for _, s := range m {
		if s.name == "controller_runtime_reconcile_total" {
			reconciles[s.labels["controller"]] += s.value
		}
	}
	res.Values["converge_reconciles"] = m.sum("controller_runtime_reconcile_total", nil)
	statuses := map[string]float64{}
	for _, s := range m {
		if s.name == "nvdriver_status_writes_total" {
			statuses[s.labels["writer"]+" "+s.labels["result"]] += s.value
		}
	}
	logf("converge status writes by writer and result: %v", statuses)
	deferred := map[string]float64{}
	for _, s := range m {
		if s.name == "nvdriver_passes_deferred_total" {
			deferred[s.labels["controller"]] += s.value
		}
	}
	logf("converge reconciles deferred to their next pass interval (counted in the reconciles): %v", deferred)
	woken := map[string]float64{}
	for _, s := range m {
		if s.name == "nvdriver_wakeups_total" {
			woken[s.labels["controller"]+" by "+s.labels["source"]] += s.value
		}
	}
	logf("converge events past the predicates, by controller and source: %v", woken)
	passes := map[string]string{}
	for _, s := range m {
		if s.name == "nvdriver_pass_seconds_count" {
			c := s.labels["controller"]
			sum := m.sum("nvdriver_pass_seconds_sum", map[string]string{"controller": c})
			passes[c] = fmt.Sprintf("%.0f passes, %.1f s, %.1f ms each", s.value, sum, sum/max(s.value, 1)*1000)
			res.Values["converge_passes_"+c] = s.value
			res.Values["converge_pass_seconds_"+c] = sum
		}
	}
	logf("converge passes run by controller (their time less API waits): %v", passes)
	logf("converge reconciles by controller: %v; shared plan: %.0f hits, %.0f misses, %.0f joined; node listings: %.0f listed, %.0f reused", reconciles,
		m.sum("nvdriver_plan_cache_total", map[string]string{"result": "hit"}), m.sum("nvdriver_plan_cache_total", map[string]string{"result": "miss"}),
		m.sum("nvdriver_plan_cache_total", map[string]string{"result": "joined"}),
		m.sum("nvdriver_node_scans_total", map[string]string{"result": "listed"}), m.sum("nvdriver_node_scans_total", map[string]string{"result": "reused"}))
	res.Values["converge_node_scans_reused"] = m.sum("nvdriver_node_scans_total", map[string]string{"result": "reused"})
	nodeChanged := map[string]float64{}
	for _, s := range m {
		if s.name == "nvdriver_node_changes_total" {
			nodeChanged[s.labels["event"]] += s.value
		}
	}
	logf("converge node changes handed to the reconcilers (heartbeats aside): %v", nodeChanged)

	// Tear down as a user removing nvdriver would: the controller stopped,
	// the CR deleted (its DaemonSets and pods garbage-collected), the nodes'
	// labels and annotations ours removed. Letting the controller release
	// every node through its machine would cost the hour of a 5,000-node run.
	t1 := time.Now()
	ctrl.stop()
	if err := e.c.Patch(context.Background(), d, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		return err
	}
	if err := e.c.Delete(context.Background(), d); client.IgnoreNotFound(err) != nil {
		return err
	}
	if err := poll(30*time.Minute, "converge CR and its driver pods gone", func() (bool, error) {
		err := e.c.Get(context.Background(), client.ObjectKey{Name: "converge"}, &v1alpha1.NVIDIADriver{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		pods := &metav1.PartialObjectMetadataList{}
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := e.c.List(context.Background(), pods, client.InNamespace(namespace)); err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	}); err != nil {
		return err
	}
	if err := e.stripGPULabels(); err != nil {
		return err
	}
	logf("converge CR removed, nodes unlabelled: %.1f s", time.Since(t1).Seconds())
	return nil
}

// availableDriverPods sums numberAvailable over the driver DaemonSets.
func (e *env) availableDriverPods() int {
	list := &appsv1.DaemonSetList{}
	if err := e.c.List(context.Background(), list, client.InNamespace(namespace)); err != nil {
		return 0
	}
	n := 0
	for _, ds := range list.Items {
		n += int(ds.Status.NumberAvailable)
	}
	return n
}

// repairKwokReadiness does what a kubelet would for a driver pod that kwok
// left with every container ready but the pod not Ready: at 5,000 nodes kwok
// sometimes writes those two conditions inconsistently and never revisits
// the pod, and the DaemonSet never counts it available (seen once: 8 pods,
// a 19-minute stall). Repairs are counted in the results and logged.
func (e *env) repairKwokReadiness() {
	pods := &corev1.PodList{}
	if err := e.c.List(context.Background(), pods, client.InNamespace(namespace)); err != nil {
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		var ready, containers *corev1.PodCondition
		for j := range p.Status.Conditions {
			switch c := &p.Status.Conditions[j]; c.Type {
			case corev1.PodReady:
				ready = c
			case corev1.ContainersReady:
				containers = c
			}
		}
		if ready == nil || containers == nil || ready.Status == corev1.ConditionTrue || containers.Status != corev1.ConditionTrue ||
			len(p.Spec.ReadinessGates) > 0 || time.Since(ready.LastTransitionTime.Time) < time.Minute {
			continue
		}
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","lastTransitionTime":%q}]}}`, time.Now().UTC().Format(time.RFC3339))
		if err := e.c.Status().Patch(context.Background(), p, client.RawPatch(types.StrategicMergePatchType, []byte(patch))); err != nil {
			logf("repairing kwok's readiness of %s: %v", p.Name, err)
			continue
		}
		res.Values["converge_kwok_readiness_repairs"]++
		logf("kwok left pod %s on %s with its containers ready but the pod not Ready since %s: set Ready, as a kubelet would",
			p.Name, p.Spec.NodeName, ready.LastTransitionTime.Format(time.TimeOnly))
	}
}

// stripGPULabels removes the labels the controller puts on a GPU node, so
// the next start labels every node as on a cluster it has never seen.
func (e *env) stripGPULabels() error {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := e.c.List(context.Background(), list, client.HasLabels{groupLabel}); err != nil {
		return err
	}
	ann := map[string]any{}
	for _, k := range upgrade.NodeAnnotations {
		ann[k] = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{
		plan.LabelGPUPresent: nil, plan.LabelDeployDriver: nil, plan.LabelOwner: nil, plan.LabelUpgradeState: nil},
		"annotations": ann}})
	g := errgroup.Group{}
	g.SetLimit(32)
	for i := range list.Items {
		name := list.Items[i].Name
		g.Go(func() error {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			return e.c.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, patch))
		})
	}
	return g.Wait()
}

// profileUntil takes consecutive 30 s CPU profiles of the controller until
// the returned function is called, which merges them into one file at path
// and logs its top: a profile of a phase whose length is not known ahead.
func (p *controllerProc) profileUntil() func(path string) {
	var (
		mu    sync.Mutex
		parts []string
		stop  = make(chan struct{})
		done  = make(chan struct{})
	)
	dir, _ := os.MkdirTemp("", "nvdriver-bench-prof")
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			part := filepath.Join(dir, fmt.Sprintf("part-%03d.pprof", i))
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=30", p.pprof))
			if err != nil { // not listening yet
				time.Sleep(200 * time.Millisecond)
				continue
			}
			f, err := os.Create(part)
			if err == nil {
				_, _ = f.ReadFrom(resp.Body)
				f.Close()
				mu.Lock()
				parts = append(parts, part)
				mu.Unlock()
			}
			resp.Body.Close()
		}
	}()
	return func(path string) {
		close(stop)
		<-done // the profile in progress finishes (≤ 30 s)
		mu.Lock()
		defer mu.Unlock()
		if len(parts) == 0 {
			return
		}
		full := filepath.Join(root, path)
		_ = os.MkdirAll(filepath.Dir(full), 0o755)
		args := append([]string{"tool", "pprof", "-proto"}, parts...)
		b, err := exec.Command("go", args...).Output()
		if err != nil {
			logf("merging CPU profiles: %v", err)
			return
		}
		_ = os.WriteFile(full, b, 0o644)
		top, _ := exec.Command("go", "tool", "pprof", "-top", "-nodecount", "25", full).CombinedOutput()
		logf("CPU profile of the phase (%d × 30 s) saved to %s:\n%s", len(parts), path, strings.TrimSpace(string(top)))
		_ = os.RemoveAll(dir)
	}
}
