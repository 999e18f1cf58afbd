package controller

import "testing"

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
