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
