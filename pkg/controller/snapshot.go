package controller

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
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

// nodeLabels are the nodes' upgrade states (where set) and owner labels.
func (s *snapshot) nodeLabels() (states, owners map[string]string) {
	states, owners = map[string]string{}, map[string]string{}
	for _, n := range s.nodes {
		if st := n.Labels[plan.LabelUpgradeState]; st != "" {
			states[n.Name] = st
		}
		owners[n.Name] = n.Labels[plan.LabelOwner]
	}
	return states, owners
}

// platformOf gives a node's "os/arch" for the image check, indexing the
// nodes on the first call only (most reconciles check nothing).
func (s *snapshot) platformOf() func(node string) string {
	var byName map[string]string
	return func(node string) string {
		if byName == nil {
			byName = make(map[string]string, len(s.nodes))
			for i := range s.nodes {
				byName[s.nodes[i].Name] = imagecheck.Platform(s.nodes[i].Labels)
			}
		}
		if p, ok := byName[node]; ok {
			return p
		}
		return imagecheck.Platform(nil)
	}
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
// nodes. The key is the snapshot itself (every node's and CR's name and
// resourceVersion): the same objects give the same plan, whatever order the
// informers delivered their events in.
type planCache struct {
	mu    sync.Mutex
	key   uint64
	valid bool
	plan  plan.Plan
}

func snapshotKey(s *snapshot) uint64 {
	h := fnv.New64a()
	for i := range s.nodes {
		h.Write([]byte(s.nodes[i].Name))
		h.Write([]byte{0})
		h.Write([]byte(s.nodes[i].ResourceVersion))
		h.Write([]byte{1})
	}
	h.Write([]byte{2})
	for i := range s.drivers {
		h.Write([]byte(s.drivers[i].Name))
		h.Write([]byte{0})
		h.Write([]byte(s.drivers[i].ResourceVersion))
		h.Write([]byte{1})
	}
	return h.Sum64()
}

// compute takes a snapshot and returns it with its plan, computed once per
// distinct snapshot.
func (c *planCache) compute(ctx context.Context, r client.Reader) (*snapshot, plan.Plan, error) {
	snap, err := takeSnapshot(ctx, r)
	if err != nil {
		return nil, plan.Plan{}, err
	}
	if c == nil { // no cache wired (tests building a reconciler by hand)
		return snap, plan.Compute(snap.planNodes(), snap.drivers), nil
	}
	key := snapshotKey(snap)
	c.mu.Lock()
	if c.valid && c.key == key {
		p := c.plan
		c.mu.Unlock()
		return snap, p, nil
	}
	c.mu.Unlock()
	p := plan.Compute(snap.planNodes(), snap.drivers)
	c.mu.Lock()
	c.key, c.plan, c.valid = key, p, true
	c.mu.Unlock()
	return snap, p, nil
}
