package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// snapshot is one read of the cluster from the cache: every decision of a
// reconcile is made on it, then acted on.
type snapshot struct {
	nodes   []corev1.Node
	drivers []v1alpha1.NVIDIADriver
}

func takeSnapshot(ctx context.Context, c client.Reader) (*snapshot, error) {
	// Nodes straight from the cache, not deep-copied: every consumer of a
	// snapshot only reads them, and copying thousands of nodes per reconcile
	// dominated the controller's CPU and garbage at scale.
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := c.List(ctx, drivers); err != nil {
		return nil, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	return &snapshot{nodes: nodes.Items, drivers: drivers.Items}, nil
}

func (s *snapshot) planNodes() []plan.Node {
	out := make([]plan.Node, len(s.nodes))
	for i := range s.nodes {
		out[i] = plan.Node{Name: s.nodes[i].Name, Labels: s.nodes[i].Labels}
	}
	return out
}
