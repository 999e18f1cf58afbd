package controller

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
)

// driverState is 1 for the state each NVIDIADriver is in, 0 for the others.
var driverState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "nvdriver_driver_state",
	Help: "State of each NVIDIADriver: 1 for its current state (ready or notReady).",
}, []string{"name", "state"})

func init() {
	metrics.Registry.MustRegister(driverState)
}

func recordState(name string, state v1alpha1.State) {
	for _, s := range []v1alpha1.State{v1alpha1.Ready, v1alpha1.NotReady} {
		v := 0.0
		if s == state {
			v = 1
		}
		driverState.WithLabelValues(name, string(s)).Set(v)
	}
}

func forgetState(name string) {
	driverState.DeletePartialMatch(map[string]string{"name": name})
}

// apiWrites counts the controller's mutating API requests by resource, so
// "no writes when idle" can be checked against the Lease renewals leader
// election makes by design.
var apiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_api_writes_total",
	Help: "Mutating API requests (POST, PUT, PATCH, DELETE) sent by the controller, by verb and resource[/subresource].",
}, []string{"verb", "resource"})

// upgradeTransition is the controller-side latency of one upgrade-machine
// transition: from the start of the pass that decided it to its node patch.
var upgradeTransition = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "nvdriver_upgrade_transition_seconds",
	Help:    "Controller time from the start of an upgrade pass to a node's transition written, by target state.",
	Buckets: latencyBuckets,
}, []string{"to"})

// latencyBuckets, for the latencies with a 1 s target (transitions, moves),
// are fine around it: a p95 read from coarser buckets (0.5, 1, 2.5 s) was
// mostly interpolation.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, .75, 1, 1.5, 2, 2.5, 5, 10}

// upgradeTransitionParts splits each transition's latency by whose time it
// was (docs/design.md, "Whose time a transition is"): the API server
// answering the node's own requests (answer), the node's step waiting for
// one of the pass's workers while all of them wait for answers to other
// nodes' requests (worker), and the rest, the controller's own (own).
var upgradeTransitionParts = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "nvdriver_upgrade_transition_part_seconds",
	Help:    "Each upgrade transition's latency by part: answer (the API server answering the node's requests), worker (waiting for a pass worker), own (the rest: the controller's computing and scheduling, its client's rate limiter, the pass's CR status write), by target state.",
	Buckets: latencyBuckets,
}, []string{"to", "part"})

// upgradeStateTime is how long nodes stay in each upgrade state, from the
// patch that put a node there to the one that took it out, both by this
// process (a state entered before a restart is not timed). Where a
// rollout's time goes: pod-restart-required is mostly the cluster's
// (kube-controller-manager making the new driver pod, the kubelet or kwok
// starting it), the other states the controller's.
var upgradeStateTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "nvdriver_upgrade_state_seconds",
	Help:    "Time nodes spent in an upgrade state, from the transition into it to the one out of it (both by this process), by state.",
	Buckets: []float64{.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600},
}, []string{"state"})

// statusWrites counts the status writes of each writer (driver: the pools,
// conditions and state; rollout: the upgrade machine's status.rollout) by
// result: written, conflict (the CR changed under the writer, retried), or
// paced (counts only, held for statusEvery).
var statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_status_writes_total",
	Help: "Status writes by writer (driver, rollout) and result (written, conflict, paced).",
}, []string{"writer", "result"})

// passSeconds is what each pass cost: its time less its waits on the API
// server. The pass interval grows with it (gated).
var passSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "nvdriver_pass_seconds",
	Help:    "Time of each reconcile pass less its waits on the API server, by controller.",
	Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
}, []string{"controller"})

// passesDeferred counts the reconciles put back because their object's
// pass interval had not ended (gated): the work they would have done joins
// that later pass.
var passesDeferred = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_passes_deferred_total",
	Help: "Reconciles deferred to the next pass interval of their object, by controller.",
}, []string{"controller"})

// planComputes counts the shared plan's lookups by result: a fleet at rest
// should be all hits (docs/design.md, "Plan cache").
var planComputes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_plan_cache_total",
	Help: "Lookups of the shared cluster plan, by result (hit; miss: the plan was computed; joined: waited for another pass computing the same plan).",
}, []string{"result"})

// nodeScans counts the plan cache's listings of the nodes: listed anew, or
// an earlier one reused because no node changed since (docs/design.md,
// "Node scans").
var nodeScans = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_node_scans_total",
	Help: "Snapshots of the nodes taken by the controller's passes, by result (listed, or reused: no node changed since the last listing).",
}, []string{"result"})

// nodeChangesSeen counts the node events nodeEvents hands on (a heartbeat is
// not one), by kind: each makes the next pass list the nodes afresh.
var nodeChangesSeen = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_node_changes_total",
	Help: "Node events that change something a reconciler reads (added, updated, deleted), by kind.",
}, []string{"event"})

// nodeHeartbeats counts the node events nodeEvents drops because they
// change nothing a reconciler reads (a status heartbeat, most of what an
// idle controller receives): at rest the controller's CPU is their number
// times what receiving one costs, and this says which of the two moved.
var nodeHeartbeats = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "nvdriver_node_heartbeats_total",
	Help: "Node events that change nothing a reconciler reads (status heartbeats), dropped before the reconcilers.",
})

// registryRequests counts image checks that reached a registry (a cached
// answer is not counted), by result: the cache's promise is one per
// distinct image per check interval, whatever the number of nodes.
var registryRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_registry_checks_total",
	Help: "Image checks that reached a registry (HEAD of the manifest, plus a GET for an index), by status and reason.",
}, []string{"status", "reason"})

func countRegistryRequest(r imagecheck.Result) {
	registryRequests.WithLabelValues(string(r.Status), r.Reason).Inc()
}

func init() {
	// The API server's answer time and the client's own rate limiter, as
	// Kubernetes' controllers export them: how much of a pass's wall time is
	// the cluster's, not the controller's. Labelled by verb and host only.
	metrics.RegisterRESTClientMetrics(metrics.MetricRequestLatency, metrics.MetricRateLimiterLatency)
	metrics.Registry.MustRegister(apiWrites, upgradeTransition, upgradeTransitionParts, upgradeStateTime, registryRequests, planComputes, nodeScans, nodeChangesSeen, nodeHeartbeats, statusWrites, passesDeferred, passSeconds, wakeups)
}

// CountWrites wraps a client transport to count mutating requests in
// nvdriver_api_writes_total.
func CountWrites(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		switch req.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			apiWrites.WithLabelValues(req.Method, resourceOf(req.URL.Path)).Inc()
		}
		return rt.RoundTrip(req)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf maps an API path to resource[/subresource]:
// /api/v1/nodes/n -> nodes, /apis/coordination.k8s.io/v1/namespaces/x/leases/l -> leases,
// /api/v1/namespaces/x/pods/p/eviction -> pods/eviction.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "other"
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "other"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}

// wakeups counts the events that got past a controller's predicates, by
// the kind of object that sent them: what keeps a reconciler passing
// (docs/design.md, "What wakes a pass").
var wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nvdriver_wakeups_total",
	Help: "Events that passed a controller's predicates, by controller and source kind.",
}, []string{"controller", "source"})
