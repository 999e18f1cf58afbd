package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// planCache shares one plan among the reconciles that see the same cluster:
// one node event wakes every CR (and the node labeller), and each used to
// recompute the same plan. The key is what plan.Compute reads, and nothing
// else: node names, the labels the plan reads by itself (GPU, deploy, owner,
// OS, kernel: not the upgrade state) and those the CRs' nodeSelectors name;
// CR names, UIDs, generations, creation times and whether they are being
// deleted. A node's status heartbeat, a label nobody selects by or a CR's
// status write leaves it unchanged. It is combined without regard to order,
// because the cache lists objects in map order (docs/design.md, "Plan cache").
type planCache struct {
	reads *cachedReads
	// changes is the node events' count of changes (nodeEvents); nil: the
	// nodes are listed afresh for every snapshot.
	changes *atomic.Uint64
	now     func() time.Time // nil: time.Now

	mu    sync.Mutex
	key   uint64
	valid bool
	plan  plan.Plan
	// what the plan's snapshots share (the upgrade state is not in the
	// key, so states are never shared)
	shared *planShared
	scan   *nodeScan   // the last listing of the nodes
	flight *planFlight // the plan being computed, if any

	// computePlan is plan.Compute (nil), or a test's stand-in.
	computePlan func([]plan.Node, []v1alpha1.NVIDIADriver) plan.Plan
}

// nodeScan is one listing of the nodes with their facts and their share of
// the plan key. The driver's passes reuse the last one while no node has
// changed since it was taken (planCache.changes) and it is younger than
// scanReuseFor (docs/design.md, "Node scans"): while a fleet comes up, most
// passes are woken by DaemonSets, not nodes, and listing and reading 5,000
// unchanged nodes was most of each.
type nodeScan struct {
	changes uint64 // the count of node changes before the listing
	at      time.Time
	nodes   []*corev1.Node
	facts   []*nodeFact
	sig     uint64 // the selector keys the sum was made with (selectorKeys)
	sum     uint64 // the nodes' share of the plan key

	mu    sync.Mutex
	pools map[scanPoolsKey][]poolNodes // poolNodesOf's answers
}

type scanPoolsKey struct {
	key    uint64
	driver string
}

// scanReuseFor bounds how long a listing is reused: it holds the node
// objects it listed, and a node's status heartbeat (no change to a
// reconciler) makes the cache replace its object; an older listing would
// keep more of the replaced ones alive.
const scanReuseFor = 5 * time.Second

// selectorKeys are the label keys the CRs' nodeSelectors name, sorted and
// without repeats, and a signature of that set.
func selectorKeys(drivers []v1alpha1.NVIDIADriver) ([]string, uint64) {
	var keys []string
	for i := range drivers {
		for k := range drivers[i].Spec.NodeSelector {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	sig := uint64(fnvOffset)
	for _, k := range keys {
		sig = hashString(sig, k)
	}
	return keys, sig
}

// selectedHash hashes the node's values of the selected keys (a key it
// does not have hashes apart from any value).
func selectedHash(labels map[string]string, keys []string) uint64 {
	h := uint64(fnvOffset)
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			h = hashString(h, v)
		} else {
			h = mix(h ^ 0xab5e)
		}
	}
	return h
}

func snapshotKey(s *snapshot) uint64 { return snapshotKeyWith(s, nil) }

// snapshotKeyWith is the plan key, from the nodes' facts in memo; it fills
// the snapshot's facts.
func snapshotKeyWith(s *snapshot, memo *nodeMemo) uint64 {
	keys, sig := selectorKeys(s.drivers)
	return planKey(nodesKey(s, memo, keys, sig), s.drivers, len(s.nodes), sig)
}

// nodesKey is the nodes' share of the plan key, from their facts in memo
// (nil: made afresh); it fills the snapshot's facts.
func nodesKey(s *snapshot, memo *nodeMemo, keys []string, sig uint64) uint64 {
	var sum uint64
	if memo == nil {
		s.facts = memo.facts(s.nodes, true)
		for i, f := range s.facts {
			sum += mix(f.key ^ selectedHash(s.nodes[i].Labels, keys))
		}
		return sum
	}
	memo.mu.Lock()
	defer memo.mu.Unlock()
	s.facts = memo.factsLocked(s.nodes, true)
	for i, f := range s.facts {
		if f.sel.sig != sig || f.resourceVersion == "" {
			f.sel.sig, f.sel.hash = sig, selectedHash(s.nodes[i].Labels, keys)
		}
		sum += mix(f.key ^ f.sel.hash)
	}
	return sum
}

// planKey combines the nodes' share of the key with the CRs'.
func planKey(nodes uint64, drivers []v1alpha1.NVIDIADriver, nodeCount int, sig uint64) uint64 {
	var sum uint64
	for i := range drivers {
		d := &drivers[i]
		h := hashString(fnvOffset, d.Name)
		h = hashString(h, string(d.UID))
		h = hashString(h, strconv.FormatInt(d.Generation, 10))
		h = hashString(h, strconv.FormatInt(d.CreationTimestamp.UnixNano(), 10))
		if d.DeletionTimestamp != nil {
			h = mix(h ^ 0xdead)
		}
		sum += mix(h)
	}
	return mix(nodes ^ mix(sum+uint64(len(drivers))) ^ uint64(nodeCount) ^ sig)
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// hashString is FNV-1a over s, continued from h, without allocating.
func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	h ^= 0xff // a separator: ("ab","c") and ("a","bc") differ
	h *= fnvPrime
	return h
}

// mix is splitmix64's finaliser: the sums above combine well-spread values.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// compute takes a snapshot and returns it with its plan, computed once per
// distinct snapshot. The snapshot's nodes may be those of an earlier pass
// when none has changed since (nodeScan): equal in everything a reconciler
// reads but their resourceVersions, which a pass that patches nodes reads
// (computeFresh).
func (c *planCache) compute(ctx context.Context, r client.Reader) (*snapshot, plan.Plan, error) {
	return c.computeWith(ctx, r, true)
}

// computeFresh is compute on nodes listed now.
func (c *planCache) computeFresh(ctx context.Context, r client.Reader) (*snapshot, plan.Plan, error) {
	return c.computeWith(ctx, r, false)
}

func (c *planCache) computeWith(ctx context.Context, r client.Reader, reuse bool) (*snapshot, plan.Plan, error) {
	var changes uint64
	if c.changes != nil {
		changes = c.changes.Load() // before listing: a change after it is counted after it
	}
	// Not copied, nor are the nodes (cachedReads): the plan and the key
	// only read them, and a reconcile that changes its own CR reads it
	// apart (Get).
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := r.List(ctx, drivers, client.UnsafeDisableDeepCopy); err != nil {
		return nil, plan.Plan{}, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	snap := &snapshot{drivers: drivers.Items, memo: &c.reads.memo}
	keys, sig := selectorKeys(snap.drivers)
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	c.mu.Lock()
	sc := c.scan
	c.mu.Unlock()
	if reuse && c.changes != nil && sc != nil && sc.changes == changes && sc.sig == sig && now().Sub(sc.at) < scanReuseFor {
		nodeScans.WithLabelValues("reused").Inc()
	} else {
		nodeScans.WithLabelValues("listed").Inc()
		sc = &nodeScan{changes: changes, at: now(), nodes: c.reads.allNodes(), sig: sig}
		snap.nodes = sc.nodes
		sc.sum = nodesKey(snap, snap.memo, keys, sig)
		sc.facts = snap.facts
		if c.changes != nil {
			c.mu.Lock()
			if c.scan == nil || c.scan.changes <= changes {
				c.scan = sc
			}
			c.mu.Unlock()
		}
	}
	snap.nodes, snap.facts, snap.scan = sc.nodes, sc.facts, sc
	key := planKey(sc.sum, snap.drivers, len(sc.nodes), sig)
	snap.key = key
	c.mu.Lock()
	if c.valid && c.key == key {
		p := c.plan
		snap.shared, snap.owners = c.shared, c.shared.owners
		c.mu.Unlock()
		planComputes.WithLabelValues("hit").Inc()
		return snap, p, nil
	}
	if f := c.flight; f != nil && f.key == key {
		// Another pass is computing this very plan: one event wakes the
		// node labeller and two or more CRs at once, and each computing it
		// cost them all (docs/design.md, "Plan cache").
		f.joined++
		c.mu.Unlock()
		planComputes.WithLabelValues("joined").Inc()
		<-f.done
		if f.shared == nil { // the computing pass panicked
			return c.computeWith(ctx, r, reuse)
		}
		snap.shared, snap.owners = f.shared, f.shared.owners
		return snap, *f.shared.plan, nil
	}
	f := &planFlight{key: key, done: make(chan struct{})}
	c.flight = f
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.flight == f {
			c.flight = nil
		}
		c.mu.Unlock()
		close(f.done)
	}()
	planComputes.WithLabelValues("miss").Inc()
	compute := plan.Compute
	if c.computePlan != nil {
		compute = c.computePlan
	}
	p := compute(snap.planNodes(), snap.drivers)
	snap.shared = &planShared{plan: &p, owners: snap.nodeOwners()}
	c.mu.Lock()
	c.key, c.plan, c.valid = key, p, true
	c.shared = snap.shared
	f.shared = snap.shared
	c.mu.Unlock()
	return snap, p, nil
}

// planFlight is a plan being computed, for the passes that need the same
// key meanwhile: they wait for it rather than compute it again.
type planFlight struct {
	key    uint64
	done   chan struct{} // closed when the plan is in (or the pass panicked)
	shared *planShared   // nil until done, and after a panic
	joined int           // passes waiting for it (for the test)
}
