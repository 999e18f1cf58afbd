package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nvdriver/nvdriver/pkg/controller"
)

// report writes the JSON results and prints the markdown table.
func (e *env) report() {
	if *out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		_ = os.MkdirAll(filepath.Dir(*out), 0o755)
		_ = os.WriteFile(*out, b, 0o644)
	}
	v := res.Values
	fmt.Printf("\n## %d GPU nodes, %d CRs (%s)\n\n", res.Nodes, res.CRs, res.Machine)
	fmt.Println("| measure | result | baseline / target |")
	fmt.Println("|---|---|---|")
	if v["converge_cpu_seconds"] > 0 {
		fmt.Printf("| converge %d → %d nodes, one CR, leader election off: controller CPU | %.1f CPU s (%.1f ms/node), %.0f s wall | target ≤ 50 CPU s at 5,000, ≤ 10 at 1,000; NVIDIA 523 CPU s at 5,000 |\n",
			convergeStart, res.Nodes, v["converge_cpu_seconds"], v["converge_cpu_seconds"]/float64(res.Nodes)*1000, v["converge_seconds"])
		fmt.Printf("| converge: API requests, writes | %.0f (%.2f per node), %.0f writes | target ≤ 2 per node + O(pools); NVIDIA 16.8 per node |\n",
			v["converge_requests"], v["converge_requests"]/float64(res.Nodes), v["converge_writes"])
		fmt.Printf("| converge: controller RSS at convergence | %.0f MiB (peak %.0f MiB), heap in use %.0f MiB | NVIDIA 1,687 MB (peak 1,705) |\n", v["converge_rss_mib"], v["converge_peak_rss_mib"], v["converge_heap_inuse_mib"])
	}
	fmt.Printf("| `preview` wall time (median of %d) | %.0f ms, peak RSS %.0f MiB, %v requests | `kubectl get nodes -o name` %.0f ms, %.0f MiB, %v requests: **%.2f×** (target ≤ 1.0×, ≤ 4 requests) |\n",
		*runs, v["preview_ms"], v["preview_rss_mib"], v["preview_requests"], v["kubectl_get_nodes_ms"], v["kubectl_get_nodes_rss_mib"], v["kubectl_get_nodes_requests"], v["preview_ratio"])
	fmt.Printf("| `status` wall time (median of %d) | %.0f ms, peak RSS %.0f MiB, %v requests | **%.2f×** of `kubectl get nodes -o name` |\n",
		*runs, v["status_ms"], v["status_rss_mib"], v["status_requests"], v["status_ratio"])
	fmt.Printf("| controller first start (labels every node) → every CR reconciled, every node owned | %.1f s (all CRs ready incl. kube's pod creation: %.1f s) | |\n", v["first_start_seconds"], v["first_start_all_ready_seconds"])
	fmt.Printf("| controller cold start (restart, converged) → every CR reconciled (median of %d) | %.2f s (max %.2f s) | target ≤ 10 s |\n", *runs, v["cold_start_seconds"], v["cold_start_max_seconds"])
	fmt.Printf("| controller RSS after convergence | %.0f MiB (peak %.0f MiB), heap in use %.0f MiB | target ≤ 100 MiB |\n", v["controller_rss_mib"], v["controller_peak_rss_mib"], v["controller_heap_inuse_mib"])
	fmt.Printf("| controller RSS after the idle window (the last cold start's) | %.0f MiB, heap in use %.0f MiB, resting %.0f | target ≤ 100 MiB |\n", v["idle_rss_mib"], v["idle_heap_inuse_mib"], v["idle_resting"])
	fmt.Printf("| idle %s: writes | %v (+ %v Lease renewals by leader election) | target 0 |\n", *idle, v["idle_writes"], v["idle_lease_writes"])
	fmt.Printf("| idle: requests/s, CPU over the window (its median slice), log volume | %.2f req/s, %.4f cores (%.4f), %.0f bytes/hour | targets ≤ 1 req/s, ≤ 0.01 core, ≤ 1 MB/hour |\n", v["idle_requests_per_second"], v["idle_cores"], v["idle_cores_median_slice"], v["idle_log_bytes_per_hour"])
	fmt.Printf("| idle: node heartbeats received; controller CPU per heartbeat | %.1f/s; %.2f ms | what the idle CPU is made of |\n", v["idle_heartbeats_per_second"], v["idle_cpu_ms_per_heartbeat"])
	fmt.Printf("| node move → move state (%v moves) | p50 %.0f ms, p99 %.0f ms | target p99 ≤ 1 s |\n", v["moves"], v["move_latency_p50_ms"], v["move_latency_p99_ms"])
	fmt.Printf("| of which the controller's (event → labeller's patch returned) / the bench's relabel PATCH | p50 %.0f / %.0f ms, p99 %.0f / %.0f ms | |\n", v["move_controller_p50_ms"], v["move_relabel_p50_ms"], v["move_controller_p99_ms"], v["move_relabel_p99_ms"])
	fmt.Printf("| of the controller's part: the API server answering its patch / the rest (the labeller's turn and pass) | p50 %.0f / %.0f ms, p99 %.0f / %.0f ms | |\n", v["move_answer_p50_ms"], v["move_own_p50_ms"], v["move_answer_p99_ms"], v["move_own_p99_ms"])
	fmt.Printf("| CPU per 1,000 reconciles (during the moves) | %.2f s | |\n", v["cpu_seconds_per_1000_reconciles"])
	fmt.Printf("| rollout of %.0f nodes at maxParallelUpgrades %d | %.1f s; %v transitions, controller latency p50 %.1f ms, p95 %.1f ms (queue wait p50 %.1f, p95 %.1f ms) | target p95 ≤ 1 s; NVIDIA ~2 min per node |\n",
		v["rollout_nodes"], *rollP, v["rollout_seconds"], v["rollout_transitions"], v["transition_p50_ms"], v["transition_p95_ms"], v["queue_wait_p50_ms"], v["queue_wait_p95_ms"])
	fmt.Printf("| the same rollout: its steps after the first pass's marking (every transition but into upgrade-required); the API server's answers | p50 %.0f ms, p95 %.0f ms; PATCH answered p50 %.0f ms, p95 %.0f ms | |\n",
		v["rollout_step_p50_ms"], v["rollout_step_p95_ms"], v["rollout_patch_p50_ms"], v["rollout_patch_p95_ms"])
	fmt.Printf("| the same rollout's transitions by part, p95 (the steps after the marking): the API server answering the node's requests; waiting for a pass worker; the controller's own | %.0f (%.0f) ms; %.0f (%.0f) ms; %.0f (%.0f) ms | whose time the latency is |\n",
		v["transition_answer_p95_ms"], v["rollout_step_answer_p95_ms"], v["transition_worker_p95_ms"], v["rollout_step_worker_p95_ms"], v["transition_own_p95_ms"], v["rollout_step_own_p95_ms"])
	fmt.Printf("| the same rollout's marking (every node upgrade-required, seen by a watcher) | %.1f s after the patch (the first node at %.1f s), %.0f patches/s; PATCH answered p50 %.0f ms, of it the client's rate limiter p50 %.1f ms, p95 %.1f ms (%d at a time: %.0f/s); cores: controller %.2f, kube-apiserver %.2f, etcd %.2f, machine busy %.2f | whose pace the transition p95 is |\n",
		v["marking_seconds"], v["marking_first_seconds"], v["marking_patches_per_second"], v["marking_patch_p50_ms"], v["marking_limiter_p50_ms"], v["marking_limiter_p95_ms"], controller.PassWorkers, v["marking_rate_at_answer_time"],
		v["marking_controller_cores"], v["marking_cores_kube-apiserver"], v["marking_cores_etcd"], v["marking_machine_busy_cores"])
	fmt.Printf("| the same rollout: CPU in cores (machine busy; controller; kube-apiserver; etcd) | %.2f; %.3f; %.2f; %.2f | the cluster's time apart from the controller's |\n",
		v["rollout_machine_busy_cores"], v["rollout_controller_cores"], v["rollout_cores_kube-apiserver"], v["rollout_cores_etcd"])
	fmt.Printf("| registry image checks (loopback registry, %.0f images) | first start %.0f checks; rollout of %.0f nodes %.0f checks, %.0f requests | target: one per distinct image per check interval (the rollout has 4 new images) |\n",
		v["registry_images"], v["registry_checks_first_start"], v["rollout_nodes"], v["registry_checks_rollout"], v["registry_requests_rollout"])
}
