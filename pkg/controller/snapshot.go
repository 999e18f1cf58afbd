package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

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

// planCache shares one plan among the reconciles that see the same cluster:
// one node event wakes every CR (and the node labeller), and each used to
// recompute the same plan — most of the controller's CPU at thousands of
// nodes. gen is bumped by informer handlers on every event the plan depends
// on (node added, removed or relabelled; any NVIDIADriver change); a plan is
// reused only for the gen it was computed at.
type planCache struct {
	gen   atomic.Uint64
	mu    sync.Mutex
	at    uint64
	valid bool
	plan  plan.Plan
}

func (c *planCache) changed() { c.gen.Add(1) }

// compute takes a snapshot and returns it with the plan for it. The gen is
// read before the snapshot, so a cached plan is never older than the events
// counted in its gen; an event landing in between bumps gen and wakes the
// reconcile again.
func (c *planCache) compute(ctx context.Context, r client.Reader) (*snapshot, plan.Plan, error) {
	if c == nil { // no cache wired (tests building a reconciler by hand)
		snap, err := takeSnapshot(ctx, r)
		if err != nil {
			return nil, plan.Plan{}, err
		}
		return snap, plan.Compute(snap.planNodes(), snap.drivers), nil
	}
	g := c.gen.Load()
	snap, err := takeSnapshot(ctx, r)
	if err != nil {
		return nil, plan.Plan{}, err
	}
	c.mu.Lock()
	if c.valid && c.at == g {
		p := c.plan
		c.mu.Unlock()
		return snap, p, nil
	}
	c.mu.Unlock()
	p := plan.Compute(snap.planNodes(), snap.drivers)
	c.mu.Lock()
	if !c.valid || g >= c.at {
		c.at, c.plan, c.valid = g, p, true
	}
	c.mu.Unlock()
	return snap, p, nil
}
