package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/nodes/gpu-node-0":                                      "nodes",
		"/api/v1/nodes":                                                 "nodes",
		"/api/v1/namespaces/gpu-operator/pods/p/eviction":               "pods/eviction",
		"/apis/coordination.k8s.io/v1/namespaces/gpu-operator/leases/l": "leases",
		"/apis/apps/v1/namespaces/gpu-operator/daemonsets/ds":           "daemonsets",
		"/apis/nvidia.com/v1alpha1/nvidiadrivers/demo-gold/status":      "nvidiadrivers/status",
		"/api/v1/namespaces/gpu-operator":                               "namespaces",
		"/apis/events.k8s.io/v1/namespaces/default/events":              "events",
		"/healthz": "other",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestOnlyOwnerOrStateChanged(t *testing.T) {
	base := map[string]string{"driver.config": "gold", "nvidia.com/gpu.present": "true", "nvidia.com/gpu-operator.driver.owner": "gold"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range base {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name string
		n    map[string]string
		want bool
	}{
		{"upgrade state set", with("nvidia.com/gpu-driver-upgrade-state", "cordon-required"), true},
		{"owner moved", with("nvidia.com/gpu-operator.driver.owner", "silver"), true},
		{"owner removed", with("nvidia.com/gpu-operator.driver.owner", ""), true},
		{"selector label changed", with("driver.config", "silver"), false},
		{"selector label removed", with("driver.config", ""), false},
		{"gpu.present removed", with("nvidia.com/gpu.present", ""), false},
	} {
		if got := onlyOwnerOrStateChanged(base, tc.n); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A node's time in a state is observed when it leaves a state this process
// moved it into, and not for a state found on the node (entered before a
// restart) nor once it rests.
func TestTransitionedTimesStates(t *testing.T) {
	count := func(state string) uint64 {
		return metricNow(t, upgradeStateTime.WithLabelValues(state).(prometheus.Metric)).GetHistogram().GetSampleCount()
	}
	r := &UpgradeReconciler{}
	before := map[string]uint64{}
	for _, s := range []string{upgrade.StateRequired, upgrade.StateCordon, upgrade.StatePodRestart, upgrade.StateUncordon} {
		before[s] = count(s)
	}
	r.transitioned("n1", upgrade.Decision{From: upgrade.StatePodRestart, To: upgrade.StateValidation}) // found there: not timed
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateValidation, To: upgrade.StateUncordon})
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateUncordon, To: upgrade.StateDone})
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateDone, To: upgrade.StateRequired})
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateRequired, To: upgrade.StateRequired}) // no change
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateRequired, To: upgrade.StateCordon})
	for state, want := range map[string]uint64{upgrade.StatePodRestart: 0, upgrade.StateUncordon: 1, upgrade.StateRequired: 1, upgrade.StateCordon: 0} {
		if got := count(state) - before[state]; got != want {
			t.Errorf("%s: %d observations, want %d", state, got, want)
		}
	}
	if _, ok := r.entered.Load("n1"); !ok {
		t.Error("the node's cordon-required entry is not remembered")
	}
	r.transitioned("n1", upgrade.Decision{From: upgrade.StateCordon, To: upgrade.StateFailed})
	if _, ok := r.entered.Load("n1"); ok {
		t.Error("a failed node is still remembered")
	}
}

// metricNow reads a metric's current value, for tests that count what a
// call observed.
func metricNow(t *testing.T, c prometheus.Metric) *dto.Metric {
	t.Helper()
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m
}
