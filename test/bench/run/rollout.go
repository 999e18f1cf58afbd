package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/controller"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// rollout: the default CR takes every node (the others are deleted: their
// nodes move to it), then its version is patched at maxParallelUpgrades P.
func (e *env) rollout() error {
	t0 := time.Now()
	if *nodesN > *rollAll {
		return e.patchDefault(e.nodes.ownedBy("default"))
	}
	for _, name := range e.crs {
		if name == "default" {
			continue
		}
		if err := e.c.Delete(context.Background(), &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			return err
		}
	}
	if err := poll(30*time.Minute, "every node moved to the default CR", func() (bool, error) {
		list := &v1alpha1.NVIDIADriverList{}
		if err := e.c.List(context.Background(), list); err != nil {
			return false, err
		}
		return len(list.Items) == 1 && e.nodes.ownedBy("default") >= *nodesN, nil
	}); err != nil {
		return err
	}
	if err := e.waitAllReady(30 * time.Minute); err != nil {
		return err
	}
	res.Values["delete_19_crs_to_default_ready_seconds"] = time.Since(t0).Seconds()
	logf("19 CRs deleted, every node moved to the default and ready: %.1f s", res.Values["delete_19_crs_to_default_ready_seconds"])

	return e.patchDefault(*nodesN)
}

// patchDefault rolls the default CR's `want` nodes to a new version at
// maxParallelUpgrades P and measures it.
func (e *env) patchDefault(want int) error {
	res.Values["rollout_nodes"] = float64(want)
	e.ctrl.quiet(5 * time.Second)
	m0 := e.ctrl.scrape()
	reg0 := e.reg.Requests.Load()
	patch := fmt.Sprintf(`{"spec":{"version":"`+rolloutVersion+`","upgradePolicy":{"maxParallelUpgrades":%d,"maxUnavailable":"100%%"}}}`, *rollP)
	cpu0, ctrl0 := sampleCPU(), e.ctrl.cpuSeconds()
	t1 := time.Now()
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if err := e.c.Patch(context.Background(), d, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return err
	}
	marking := e.measureMarking(want, m0, cpu0, ctrl0, t1)
	if err := poll(60*time.Minute, "the rollout", func() (bool, error) {
		got := &v1alpha1.NVIDIADriver{}
		if err := e.c.Get(context.Background(), client.ObjectKey{Name: "default"}, got); err != nil {
			return false, err
		}
		return got.Status.ObservedGeneration == got.Generation && got.Status.State == v1alpha1.Ready &&
			e.nodes.ownedByInState("default", upgrade.StateDone) >= want, nil
	}); err != nil {
		return err
	}
	res.Values["rollout_seconds"] = time.Since(t1).Seconds()
	cpu1, ctrl1 := sampleCPU(), e.ctrl.cpuSeconds()
	m1 := e.ctrl.scrape()
	res.Values["registry_checks_rollout"] = m1.sum("nvdriver_registry_checks_total", nil) - m0.sum("nvdriver_registry_checks_total", nil)
	res.Values["registry_requests_rollout"] = float64(e.reg.Requests.Load() - reg0)
	logf("registry during the rollout: %.0f checks, %.0f requests", res.Values["registry_checks_rollout"], res.Values["registry_requests_rollout"])
	h := histBetween(m0, m1, "nvdriver_upgrade_transition_seconds")
	q := histBetween(m0, m1, "workqueue_queue_duration_seconds", "name", "upgrade")
	res.Values["rollout_transitions"] = h.count()
	res.Values["transition_p50_ms"] = h.quantile(0.5) * 1000
	res.Values["transition_p95_ms"] = h.quantile(0.95) * 1000
	res.Values["queue_wait_p50_ms"] = q.quantile(0.5) * 1000
	res.Values["queue_wait_p95_ms"] = q.quantile(0.95) * 1000
	logf("rollout of %d nodes at maxParallelUpgrades %d: %.1f s; %0.f transitions, controller latency p50 %.1f ms p95 %.1f ms (+ queue wait p50 %.1f ms p95 %.1f ms)",
		want, *rollP, res.Values["rollout_seconds"], h.count(), res.Values["transition_p50_ms"], res.Values["transition_p95_ms"],
		res.Values["queue_wait_p50_ms"], res.Values["queue_wait_p95_ms"])
	// The API server's share of a pass: how long the controller's requests
	// took to be answered, and waited on its own rate limiter, during the
	// rollout (coarse buckets: 5, 25, 100, 250, 500 ms, 1 s, ...).
	api := histBetween(m0, m1, "rest_client_request_duration_seconds")
	patches := histBetween(m0, m1, "rest_client_request_duration_seconds", "verb", "PATCH")
	limiter := histBetween(m0, m1, "rest_client_rate_limiter_duration_seconds")
	res.Values["rollout_api_requests"] = api.count()
	res.Values["rollout_api_p50_ms"] = api.quantile(0.5) * 1000
	res.Values["rollout_api_p95_ms"] = api.quantile(0.95) * 1000
	res.Values["rollout_patch_p50_ms"] = patches.quantile(0.5) * 1000
	res.Values["rollout_patch_p95_ms"] = patches.quantile(0.95) * 1000
	res.Values["rollout_rate_limiter_p95_ms"] = limiter.quantile(0.95) * 1000
	logf("rollout: %.0f API requests by the controller, answered in p50 %.0f ms p95 %.0f ms (PATCH p50 %.0f ms p95 %.0f ms); client rate limiter wait p95 %.1f ms",
		api.count(), res.Values["rollout_api_p50_ms"], res.Values["rollout_api_p95_ms"], res.Values["rollout_patch_p50_ms"], res.Values["rollout_patch_p95_ms"], res.Values["rollout_rate_limiter_p95_ms"])
	logf("rollout: requests by method %v; writes %v", countsBetween(m0, m1, "rest_client_requests_total", "method"),
		countsBetween(m0, m1, "nvdriver_api_writes_total", "verb", "resource"))
	logf("rollout: %s", passesBetween("rollout", m0, m1))
	logf("rollout: mean time per node in each state (nodes): %s", stateTimes("rollout", m0, m1))
	logf("rollout: transition latency p50/p95 by the state entered (transitions): %s", transitionsByState("rollout", m0, m1))
	// The first pass marks every node upgrade-required at once (NVIDIA's
	// machine does too): a burst of a node patch per node, as fast as the
	// API server takes them. The steps after it go a budget at a time.
	steps := h.minus(histBetween(m0, m1, "nvdriver_upgrade_transition_seconds", "to", upgrade.StateRequired))
	res.Values["rollout_step_p50_ms"] = steps.quantile(0.5) * 1000
	res.Values["rollout_step_p95_ms"] = steps.quantile(0.95) * 1000
	logf("rollout: the machine's steps after the marking (every transition but into upgrade-required): %.0f, p50 %.0f ms p95 %.0f ms",
		steps.count(), res.Values["rollout_step_p50_ms"], res.Values["rollout_step_p95_ms"])
	// Whose time each transition was (docs/design.md, "Whose time a
	// transition is"): the API server answering the node's own requests,
	// waiting for a pass worker (all busy waiting for answers), and the
	// controller's own rest; over every transition and over the steps.
	const parts = "nvdriver_upgrade_transition_part_seconds"
	for _, part := range []string{"answer", "worker", "own"} {
		all := histBetween(m0, m1, parts, "part", part)
		stepPart := all.minus(histBetween(m0, m1, parts, "part", part, "to", upgrade.StateRequired))
		res.Values["transition_"+part+"_p50_ms"] = all.quantile(0.5) * 1000
		res.Values["transition_"+part+"_p95_ms"] = all.quantile(0.95) * 1000
		res.Values["rollout_step_"+part+"_p95_ms"] = stepPart.quantile(0.95) * 1000
	}
	logf("rollout: transitions by part, p50 / p95 (the steps after the marking p95): the API server's answers %.0f / %.0f ms (%.0f), waiting for a worker %.0f / %.0f ms (%.0f), the controller's own %.0f / %.0f ms (%.0f)",
		res.Values["transition_answer_p50_ms"], res.Values["transition_answer_p95_ms"], res.Values["rollout_step_answer_p95_ms"],
		res.Values["transition_worker_p50_ms"], res.Values["transition_worker_p95_ms"], res.Values["rollout_step_worker_p95_ms"],
		res.Values["transition_own_p50_ms"], res.Values["transition_own_p95_ms"], res.Values["rollout_step_own_p95_ms"])
	logf("rollout: where the machine's CPU went, in cores: %s", cpuBetween("rollout", cpu0, cpu1, ctrl1-ctrl0, res.Values["rollout_seconds"]))
	<-marking
	return nil
}

// measureMarking measures the rollout's first pass, which writes
// upgrade-required on every node of the CR (NVIDIA's machine does too): how
// long until a watcher sees every node marked, how fast the API server took
// the patches, where the machine's CPU went meanwhile, and a CPU profile of
// the controller over it. It is the transition p95's largest part; this is
// what says whose time it is (docs/design.md, "The rollout's marking").
// It returns when every node is marked; the channel closes when the
// profile is saved.
func (e *env) measureMarking(want int, m0 metricsText, cpu0 cpuSample, ctrl0 float64, t1 time.Time) <-chan struct{} {
	profiled := make(chan struct{})
	go func() {
		defer close(profiled)
		e.ctrl.cpuProfile(fmt.Sprintf("bench-results/rollout-marking-cpu-%d.pprof", *nodesN), markingProfile)
	}()
	// Marked: in upgrade-required or already past it. A node done again
	// before all are marked would need the marking, six passes and a
	// driver pod's restart: tens of seconds.
	var first time.Time
	err := poll(5*time.Minute, "every node marked upgrade-required", func() (bool, error) {
		n := e.nodes.ownedInMachine("default")
		if n > 0 && first.IsZero() {
			first = time.Now()
		}
		return n >= want, nil
	})
	if err != nil {
		logf("marking: %v", err)
		return profiled
	}
	secs := time.Since(t1).Seconds()
	// From the first node seen marked: the time before it is the
	// DaemonSet's new template reaching the upgrade pass.
	writing := time.Since(first).Seconds()
	cpu1, ctrl1 := sampleCPU(), e.ctrl.cpuSeconds()
	m1 := e.ctrl.scrape()
	// client-go's request duration includes its rate limiter's wait: the
	// wait is read apart, to tell the API server's answers from the
	// client holding its own requests back.
	patches := histBetween(m0, m1, "rest_client_request_duration_seconds", "verb", "PATCH")
	limiter := histBetween(m0, m1, "rest_client_rate_limiter_duration_seconds")
	res.Values["marking_limiter_p50_ms"] = limiter.quantile(0.5) * 1000
	res.Values["marking_limiter_p95_ms"] = limiter.quantile(0.95) * 1000
	res.Values["marking_seconds"] = secs
	res.Values["marking_first_seconds"] = secs - writing
	res.Values["marking_patches_per_second"] = float64(want) / max(writing, 0.1)
	res.Values["marking_patch_p50_ms"] = patches.quantile(0.5) * 1000
	res.Values["marking_patch_p95_ms"] = patches.quantile(0.95) * 1000
	// The rate PassWorkers calls at a time reach at that answer time: the
	// controller's own bound. The API server is the limit when the
	// measured rate is this one.
	if p50 := patches.quantile(0.5); p50 > 0 {
		res.Values["marking_rate_at_answer_time"] = controller.PassWorkers / p50
	}
	logf("marking: every one of %d nodes upgrade-required %.1f s after the patch, the first after %.1f s (%.0f patches/s); its PATCHes answered p50 %.0f ms p95 %.0f ms, %d at a time: %.0f/s at that answer time",
		want, secs, res.Values["marking_first_seconds"], res.Values["marking_patches_per_second"], res.Values["marking_patch_p50_ms"], res.Values["marking_patch_p95_ms"], controller.PassWorkers, res.Values["marking_rate_at_answer_time"])
	logf("marking: of that, the client's rate limiter held requests p50 %.1f ms p95 %.1f ms", res.Values["marking_limiter_p50_ms"], res.Values["marking_limiter_p95_ms"])
	logf("marking: where the machine's CPU went, in cores: %s", cpuBetween("marking", cpu0, cpu1, ctrl1-ctrl0, secs))
	return profiled
}

// markingProfile is how long the controller's CPU profile of the marking
// runs (from the patch; the marking takes 2–10 s at 1,000–5,000 nodes).
const markingProfile = 10 * time.Second
