package controller

import (
	"maps"
	"slices"
	"sync"
	"unsafe"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// snapshot is one read of the cluster from the cache: every decision of a
// reconcile is made on it, then acted on.
type snapshot struct {
	nodes   []*corev1.Node // the cache's own objects: read only
	drivers []v1alpha1.NVIDIADriver
	// facts[i] is what the passes read of nodes[i]'s labels (planCache
	// fills them; nil in a snapshot made by hand: fact works them out).
	facts []*nodeFact

	// shared is what the plan cache keeps beside the plan of this
	// snapshot's key, for every snapshot with that key, and memo the node
	// facts' (both nil in a snapshot made by hand).
	shared *planShared
	memo   *nodeMemo
	key    uint64
	owners map[string]string // nodeOwners' answer (from shared when there is one)
	// scan is the listing the nodes and facts are from (nil in a snapshot
	// made by hand): poolNodesOf keeps its answers there.
	scan *nodeScan
}

// planShared is what every snapshot with one plan key reads alike, worked
// out once per key rather than once per pass (docs/design.md, "Plan
// cache"): the nodes' owners (the owner label is in the key), where each
// node is in the plan, each CR's count of pool nodes not yet labelled for
// it, and each pool's platforms (the OS and architecture labels are in the
// key too). Read only once made.
type planShared struct {
	plan   *plan.Plan
	owners map[string]string

	placeOnce sync.Once
	place     map[string]placement // node -> its CR and pool in the plan

	mu        sync.Mutex
	pending   map[string][]int    // by CR: per pool, nodes not yet labelled for it
	platforms map[string][]string // by DaemonSet: its nodes' platforms, sorted
}

// placement is where a node is in a plan: the CR it is planned to and the
// index of its pool there ("" and 0: no CR).
type placement struct {
	driver string
	pool   int32
}

// placements are the plan's nodes by name, made once per key.
func (ps *planShared) placements() map[string]placement {
	ps.placeOnce.Do(func() { ps.place = placementsOf(ps.plan.Drivers...) })
	return ps.place
}

// placementsOf are the drivers' pool nodes by name.
func placementsOf(drivers ...plan.Driver) map[string]placement {
	out := map[string]placement{}
	for _, d := range drivers {
		for p, pool := range d.Pools {
			for _, n := range pool.Nodes {
				out[n] = placement{driver: d.Name, pool: int32(p)}
			}
		}
	}
	return out
}

// keptFor is what the plan cache keeps under name in the map field of
// the snapshot's key, made by build the first time; made afresh without a
// plan cache.
func keptFor[T any](s *snapshot, field func(*planShared) *map[string]T, name string, build func() T) T {
	if s.shared == nil {
		return build()
	}
	m := field(s.shared)
	s.shared.mu.Lock()
	v, ok := (*m)[name]
	s.shared.mu.Unlock()
	if ok {
		return v
	}
	v = build() // outside the lock: two passes may both build, alike
	s.shared.mu.Lock()
	if *m == nil {
		*m = map[string]T{}
	}
	(*m)[name] = v
	s.shared.mu.Unlock()
	return v
}

// fact is what the passes read of the i-th node's labels.
func (s *snapshot) fact(i int) *nodeFact {
	if s.facts == nil {
		s.facts = make([]*nodeFact, len(s.nodes))
	}
	if s.facts[i] == nil {
		s.facts[i] = factOf(s.nodes[i])
	}
	return s.facts[i]
}

// nodeOwners are the nodes' owner labels, shared read-only with the plan
// cache (the owner label is in its key).
func (s *snapshot) nodeOwners() map[string]string {
	if s.owners == nil {
		s.owners = make(map[string]string, len(s.nodes))
		for i := range s.nodes {
			s.owners[s.nodes[i].Name] = s.fact(i).plan.Owner
		}
	}
	return s.owners
}

// poolNodes is what a CR's status reads of one pool's nodes.
type poolNodes struct {
	states  map[string]int32 // the nodes with an upgrade state, by state
	pending int              // the nodes not yet labelled for the CR
}

// poolNodesOf is, per pool of the CR's plan pd, its nodes' upgrade states
// as this snapshot has them (the key leaves the state out, so states are
// never shared) and how many are not yet the CR's (that is in the key). A
// node's place in the plan is kept in its facts for the key it was found
// for, so an unchanged node costs a pass no look-up by name: a map of every
// node's state per pass and two look-ups per pool node, then one look-up
// per node, were each a tenth of the 5,000-node converge's CPU.
func (s *snapshot) poolNodesOf(pd *plan.Driver, driver string) []poolNodes {
	if len(pd.Pools) == 0 {
		return nil
	}
	if s.scan == nil || s.shared == nil {
		return s.countPoolNodes(pd, driver)
	}
	// The states are the facts', and the facts are the listing's: a pass
	// that reuses a listing reuses its counts too.
	at := scanPoolsKey{key: s.key, driver: driver}
	s.scan.mu.Lock()
	out, ok := s.scan.pools[at]
	s.scan.mu.Unlock()
	if !ok {
		out = s.countPoolNodes(pd, driver)
		s.scan.mu.Lock()
		if s.scan.pools == nil {
			s.scan.pools = map[scanPoolsKey][]poolNodes{}
		}
		s.scan.pools[at] = out
		s.scan.mu.Unlock()
	}
	// The caller's own copy: the counts go into a status.
	own := slices.Clone(out)
	for i := range own {
		own[i].states = maps.Clone(own[i].states)
	}
	return own
}

// countPoolNodes is poolNodesOf read from the nodes.
func (s *snapshot) countPoolNodes(pd *plan.Driver, driver string) []poolNodes {
	out := make([]poolNodes, len(pd.Pools))
	for i, n := range s.pendingOf(pd, driver) {
		out[i].pending = n
	}
	// Without a plan cache (a snapshot made by hand) each node is looked up.
	kept := s.shared != nil && s.memo != nil
	var place map[string]placement
	if kept {
		place = s.shared.placements()
		// The facts' place is read and written under the memo's lock, as sel.
		s.memo.mu.Lock()
		defer s.memo.mu.Unlock()
	} else {
		place = placementsOf(*pd)
	}
	for i := range s.nodes {
		f := s.fact(i)
		if f.state == "" {
			continue
		}
		var at placement
		if !kept {
			at = place[s.nodes[i].Name]
		} else {
			// Looked up by name only when the node or the key is new.
			if f.place.key != s.key {
				f.place.key, f.place.at = s.key, place[s.nodes[i].Name]
			}
			at = f.place.at
		}
		if at.driver == driver {
			if out[at.pool].states == nil {
				out[at.pool].states = map[string]int32{}
			}
			out[at.pool].states[f.state]++
		}
	}
	return out
}

// pendingOf is, per pool of pd, how many of its nodes are not yet labelled
// for the CR, once per key.
func (s *snapshot) pendingOf(pd *plan.Driver, driver string) []int {
	return keptFor(s, func(ps *planShared) *map[string][]int { return &ps.pending }, driver, func() []int {
		owners := s.nodeOwners()
		n := make([]int, len(pd.Pools))
		for p, pool := range pd.Pools {
			for _, name := range pool.Nodes {
				if owners[name] != driver {
					n[p]++
				}
			}
		}
		return n
	})
}

// platformsOf gives a pool's nodes' platforms ("os/arch", sorted) for the
// image check, once per key and pool where the plan cache shares one:
// while a fleet comes up every pass checks its CR's unsettled pools, and
// indexing 5,000 nodes per pass, then looking each pool node up, were a
// sixth and then a tenth of the driver controller's CPU.
func (s *snapshot) platformsOf() func(pool plan.Pool) []string {
	var byName map[string]string
	build := func(pool plan.Pool) []string {
		if byName == nil {
			byName = make(map[string]string, len(s.nodes))
			for i := range s.nodes {
				byName[s.nodes[i].Name] = s.fact(i).platform
			}
		}
		set := map[string]bool{}
		for _, n := range pool.Nodes {
			if p, ok := byName[n]; ok {
				set[p] = true
			} else {
				set[imagecheck.Platform(nil)] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	return func(pool plan.Pool) []string {
		return keptFor(s, func(ps *planShared) *map[string][]string { return &ps.platforms }, pool.DaemonSet, func() []string { return build(pool) })
	}
}

func (s *snapshot) planNodes() []plan.Node {
	out := make([]plan.Node, len(s.nodes))
	for i := range s.nodes {
		out[i] = plan.Node{Name: s.nodes[i].Name, Labels: s.nodes[i].Labels, Facts: &s.fact(i).plan}
	}
	return out
}

// nodeFact is what the passes read of one node's labels, worked out once
// per version of the node (nodeMemo) rather than looked up in its label map
// by every pass: those lookups, on every node in every pass, were a quarter
// of the controller's CPU at 5,000 nodes (docs/design.md, "Node facts").
// Shared and read-only once made.
type nodeFact struct {
	name, resourceVersion string
	// the node's share of the plan cache's key from the labels the plan
	// reads by itself (snapshotKey); the labels the CRs select by are
	// added per pass (sel)
	key       uint64
	plan      plan.Facts
	state     string            // the upgrade-state label
	hasState  bool              // whether it is set (maybe to "")
	platform  string            // imagecheck.Platform
	gpuLabels map[string]string // plan.GPULabels: nil when none is missing
	skip      bool              // the upgrade machine's skip label is "true"
	ready     bool              // nodeReady

	// sel is the hash of the node's values of the labels the CRs select
	// by, for the set of keys of signature sig: the one part of a fact
	// that is not fixed when it is made, read and written under the
	// memo's lock only (snapshotKeyWith).
	sel struct{ sig, hash uint64 }
	// place is where the node is in the plan of key (poolNodesOf), under
	// the memo's lock too.
	place struct {
		key uint64
		at  placement
	}
}

func factOf(n *corev1.Node) *nodeFact {
	f := &nodeFact{
		name: n.Name, resourceVersion: n.ResourceVersion, key: nodeKey(n),
		plan: plan.FactsOf(n.Labels), platform: imagecheck.Platform(n.Labels), gpuLabels: plan.GPULabels(n.Labels),
		skip: n.Labels[upgrade.LabelSkip] == "true", ready: nodeReady(n),
	}
	f.state, f.hasState = n.Labels[plan.LabelUpgradeState]
	return f
}

// nodeMemo remembers each node's facts: between two passes only the nodes
// that changed have a new one. One is shared by every reconciler
// (cachedReads).
//
// Keyed by the address of the cached node object, not its name: the
// informer stores a new object for every version of a node and never
// changes one, and a pass looks up every node, so the key is the one thing
// it can hash without reading the node (hashing 5,000 names per pass, each a
// cache miss, was a tenth of the controller's CPU while a fleet came up).
// An address, not a pointer, so that the memo keeps no node alive; a fact
// is used only when its name and resourceVersion are the node's, which
// also makes an address the allocator reused for another node a miss.
type nodeMemo struct {
	mu sync.Mutex
	m  map[uintptr]*nodeFact
}

// facts are the nodes' facts, in their order; a nil memo works them out
// afresh. all says nodes are every node of the cluster: only then are the
// deleted nodes' facts forgotten (now and then).
func (m *nodeMemo) facts(nodes []*corev1.Node, all bool) []*nodeFact {
	if m == nil {
		out := make([]*nodeFact, len(nodes))
		for i, n := range nodes {
			out[i] = factOf(n)
		}
		return out
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.factsLocked(nodes, all)
}

func (m *nodeMemo) factsLocked(nodes []*corev1.Node, all bool) []*nodeFact {
	out := make([]*nodeFact, len(nodes))
	// Every version of a node leaves an entry behind: a full read that
	// finds a quarter more entries than nodes keeps only the nodes' own.
	var prev map[uintptr]*nodeFact
	if m.m == nil || (all && len(m.m) > len(nodes)+len(nodes)/4+64) {
		prev, m.m = m.m, make(map[uintptr]*nodeFact, len(nodes))
	}
	for i, n := range nodes {
		at := uintptr(unsafe.Pointer(n))
		f, ok := m.m[at]
		if !ok && prev != nil {
			if f, ok = prev[at]; ok {
				m.m[at] = f
			}
		}
		if !ok || f.resourceVersion != n.ResourceVersion || f.name != n.Name || n.ResourceVersion == "" {
			f = factOf(n)
			if n.ResourceVersion != "" {
				m.m[at] = f
			}
		}
		out[i] = f
	}
	return out
}

// nodeKey hashes the node's name and the labels the plan reads by itself,
// less the upgrade state (a CR that selects by it brings it in through sel),
// and its OS and architecture labels, the image check's platform (shared per
// key: planShared).
func nodeKey(n *corev1.Node) uint64 {
	var labels uint64
	for k, v := range n.Labels {
		if k == plan.LabelUpgradeState || !isPlanLabel(k) && k != corev1.LabelOSStable && k != corev1.LabelArchStable {
			continue
		}
		labels += mix(hashString(hashString(fnvOffset, k)^1, v))
	}
	return mix(hashString(fnvOffset, n.Name) ^ mix(labels))
}
