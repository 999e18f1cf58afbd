package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func keyTestSnapshot() *snapshot {
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Labels: labels}}
	}
	return &snapshot{
		nodes: []*corev1.Node{
			node("a", map[string]string{"pool": "gold", "nvidia.com/gpu.present": "true"}),
			node("b", map[string]string{"pool": "silver", "nvidia.com/gpu.present": "true"}),
			node("c", nil),
		},
		drivers: []v1alpha1.NVIDIADriver{
			{ObjectMeta: metav1.ObjectMeta{Name: "gold", UID: "u1", Generation: 1, ResourceVersion: "5"},
				Spec: v1alpha1.NVIDIADriverSpec{NodeSelector: map[string]string{"pool": "gold"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "silver", UID: "u2", Generation: 3, ResourceVersion: "6"},
				Spec: v1alpha1.NVIDIADriverSpec{NodeSelector: map[string]string{"pool": "silver"}}},
		},
	}
}

// The plan cache's key changes exactly when something plan.Compute reads
// changes: order and resourceVersions (status heartbeats, status writes)
// must not invalidate it; labels, names, generations and deletions must.
func TestSnapshotKey(t *testing.T) {
	base := snapshotKey(keyTestSnapshot())
	cases := []struct {
		name string
		edit func(s *snapshot)
		same bool
	}{
		{"nodes in another order", func(s *snapshot) { slices.Reverse(s.nodes) }, true},
		{"CRs in another order", func(s *snapshot) { slices.Reverse(s.drivers) }, true},
		{"a node's status heartbeat", func(s *snapshot) { s.nodes[0].ResourceVersion = "99"; s.nodes[0].Status.Phase = "x" }, true},
		{"a CR's status write", func(s *snapshot) { s.drivers[0].ResourceVersion = "99"; s.drivers[0].Status.State = "ready" }, true},
		{"a label value", func(s *snapshot) { s.nodes[0].Labels["pool"] = "silver" }, false},
		{"a label the plan reads by itself", func(s *snapshot) { delete(s.nodes[1].Labels, "nvidia.com/gpu.present") }, false},
		{"an owner label", func(s *snapshot) { s.nodes[0].Labels[plan.LabelOwner] = "gold" }, false},
		// kube-controller-manager adds these to every new node, one at a
		// time; no CR selects by them and the plan does not read them.
		{"a label nobody selects by", func(s *snapshot) { s.nodes[0].Labels["beta.kubernetes.io/os"] = "linux" }, true},
		{"a CR selects by another key", func(s *snapshot) {
			s.drivers[0].Spec.NodeSelector = map[string]string{"rack": "r1"}
		}, false},
		{"a label added", func(s *snapshot) { s.nodes[2].Labels = map[string]string{"pool": "gold"} }, false},
		{"labels swapped between nodes", func(s *snapshot) { s.nodes[0].Labels, s.nodes[1].Labels = s.nodes[1].Labels, s.nodes[0].Labels }, false},
		{"a key and value split differently", func(s *snapshot) { delete(s.nodes[0].Labels, "pool"); s.nodes[0].Labels["poolg"] = "old" }, false},
		{"a node removed", func(s *snapshot) { s.nodes = s.nodes[:2] }, false},
		{"a node renamed", func(s *snapshot) { s.nodes[2].Name = "d" }, false},
		{"a CR's generation", func(s *snapshot) { s.drivers[1].Generation++ }, false},
		{"a CR being deleted", func(s *snapshot) { s.drivers[0].DeletionTimestamp = &metav1.Time{} }, false},
		{"a CR recreated (new UID)", func(s *snapshot) { s.drivers[0].UID = "u3" }, false},
		{"a CR removed", func(s *snapshot) { s.drivers = s.drivers[:1] }, false},
		// Every step of every node's upgrade writes this label; the plan
		// does not read it.
		{"an upgrade state", func(s *snapshot) { s.nodes[0].Labels[plan.LabelUpgradeState] = "upgrade-done" }, true},
		{"an upgrade state a CR selects by", func(s *snapshot) {
			s.drivers[0].Spec.NodeSelector = map[string]string{"pool": "gold", plan.LabelUpgradeState: "upgrade-done"}
			s.nodes[0].Labels[plan.LabelUpgradeState] = "upgrade-done"
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := keyTestSnapshot()
			tc.edit(s)
			if got := snapshotKey(s) == base; got != tc.same {
				t.Errorf("key unchanged = %v, want %v", got, tc.same)
			}
		})
	}
}

// A CR that selects by the upgrade state brings it into the key.
func TestSnapshotKeyWithSelectedState(t *testing.T) {
	s := keyTestSnapshot()
	s.drivers[0].Spec.NodeSelector[plan.LabelUpgradeState] = "upgrade-done"
	before := snapshotKey(s)
	s.nodes[0].Labels[plan.LabelUpgradeState] = "upgrade-done"
	if snapshotKey(s) == before {
		t.Error("the upgrade state a CR selects by changed and the key did not")
	}
}

// The remembered node facts give the same key as hashing afresh, and a
// node's new resourceVersion (any change to it) is worked out again.
func TestSnapshotKeyRemembered(t *testing.T) {
	hashes := &nodeMemo{}
	s := keyTestSnapshot()
	if got, want := snapshotKeyWith(s, hashes), snapshotKey(s); got != want {
		t.Fatalf("remembered key %x, fresh %x", got, want)
	}
	s.nodes[0].Labels["pool"] = "silver"
	s.nodes[0].Labels[plan.LabelOwner] = "silver"
	s.nodes[0].Labels[plan.LabelUpgradeState] = "upgrade-required"
	s.nodes[0].ResourceVersion = "2"
	if got, want := snapshotKeyWith(s, hashes), snapshotKey(s); got != want {
		t.Fatalf("after a label change with a new resourceVersion: remembered key %x, fresh %x", got, want)
	}
	if e := hashes.m[uintptr(unsafe.Pointer(s.nodes[0]))]; e.resourceVersion != "2" || e.plan.Owner != "silver" || e.state != "upgrade-required" {
		t.Errorf("node a remembered at resourceVersion %q with owner %q and state %q, want 2, silver, upgrade-required",
			e.resourceVersion, e.plan.Owner, e.state)
	}
	// The CRs select by another key, the nodes unchanged: the remembered
	// selected values are worked out again.
	s.drivers[1].Spec.NodeSelector = map[string]string{"rack": "r1"}
	s.nodes[1].Labels["rack"] = "r1"
	s.nodes[1].ResourceVersion = "2"
	if got, want := snapshotKeyWith(s, hashes), snapshotKey(s); got != want {
		t.Fatalf("after a selector change: remembered key %x, fresh %x", got, want)
	}
	s.nodes[2].Labels = map[string]string{"rack": "r1"}
	s.nodes[2].ResourceVersion = "2"
	before := snapshotKeyWith(s, hashes)
	s.nodes[2].Labels["rack"] = "r2"
	s.nodes[2].ResourceVersion = "3"
	if snapshotKeyWith(s, hashes) == before {
		t.Fatal("a selected label changed and the remembered key did not")
	}
	s.nodes[1].ResourceVersion = "" // objects built by hand: never remembered
	s.nodes[1].Labels["pool"] = "bronze"
	if got, want := snapshotKeyWith(s, hashes), snapshotKey(s); got != want {
		t.Fatalf("a node without resourceVersion: remembered key %x, fresh %x", got, want)
	}
}

// The memo forgets deleted nodes only when it is shown every node: one CR's
// upgrade pass reads a few nodes and must not wipe the others' facts.
func TestNodeMemoForgetsOnlyOnAFullRead(t *testing.T) {
	var all []*corev1.Node
	for i := range 100 {
		all = append(all, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i), ResourceVersion: "1",
			Labels: map[string]string{plan.LabelOwner: "gold", plan.LabelUpgradeState: "upgrade-done", upgrade.LabelSkip: "true"}}})
	}
	m := &nodeMemo{}
	first := m.facts(all, true)
	if f := first[7]; f.plan.Owner != "gold" || f.state != "upgrade-done" || !f.skip || !f.ready {
		t.Fatalf("facts of n7: %+v", f)
	}
	if again := m.facts(all[:2], false); again[1] != first[1] {
		t.Error("an unchanged node's facts were worked out again")
	}
	if len(m.m) != 100 {
		t.Fatalf("a partial read left %d facts, want 100", len(m.m))
	}
	m.facts(all[:10], true) // 90 nodes deleted: 100 > 10+10/4+64
	if len(m.m) != 10 {
		t.Fatalf("a full read of 10 nodes left %d facts, want 10", len(m.m))
	}
}

// The informer stores a new object for each version of a node: the memo
// knows a node's facts by its object, works out a new object's afresh,
// and drops the entries of replaced objects on a full read.
func TestNodeMemoFollowsTheObjects(t *testing.T) {
	var nodes []*corev1.Node
	for i := range 400 {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i), ResourceVersion: "1",
			Labels: map[string]string{plan.LabelOwner: "gold"}}})
	}
	m := &nodeMemo{}
	first := m.facts(nodes, true)
	if again := m.facts(nodes, true); again[3] != first[3] {
		t.Error("the same object's facts were worked out again")
	}
	// Every node gets a new version, as a new object.
	for round := 2; round <= 4; round++ {
		for i, n := range nodes {
			c := n.DeepCopy()
			c.ResourceVersion = fmt.Sprint(round)
			c.Labels[plan.LabelOwner] = fmt.Sprint("owner-", round)
			nodes[i] = c
		}
		got := m.facts(nodes, true)
		if f := got[3]; f == first[3] || f.plan.Owner != fmt.Sprint("owner-", round) || f.resourceVersion != fmt.Sprint(round) {
			t.Fatalf("round %d: n3's facts %+v, want those of its new object", round, f)
		}
		if max := len(nodes) + len(nodes)/4 + 64 + len(nodes); len(m.m) > max {
			t.Fatalf("round %d: %d entries for %d nodes, more than %d: replaced objects are not dropped", round, len(m.m), len(nodes), max)
		}
	}
	m.facts(nodes, true)
	if len(m.m) > len(nodes)+len(nodes)/4+64 {
		t.Errorf("%d entries for %d nodes after a full read", len(m.m), len(nodes))
	}
	// A node object changed in place (as tests build them, never the
	// cache) with a new resourceVersion is worked out again too.
	nodes[0].ResourceVersion = "9"
	nodes[0].Labels[plan.LabelOwner] = "silver"
	if f := m.facts(nodes[:1], false)[0]; f.plan.Owner != "silver" {
		t.Errorf("a new resourceVersion in the same object: owner %q, want silver", f.plan.Owner)
	}
}

// A CR's status counts the states of its own pool nodes, per pool, as the
// snapshot has them, and the pool nodes not yet labelled for it; a node's
// place in the plan is kept per key, and a new key places it again. A
// snapshot made by hand (no plan cache) counts the same.
func TestPoolNodesOf(t *testing.T) {
	var nodes []*corev1.Node
	for i := range 8 {
		l := map[string]string{plan.LabelOwner: "gold"}
		if i%3 != 0 {
			l[upgrade.LabelState] = fmt.Sprint("state-", i%2)
		}
		if i == 4 {
			l[plan.LabelOwner] = "silver" // on its way in
		}
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("n", i), ResourceVersion: "1", Labels: l}})
	}
	planOf := func(gold, bronze [][]string) *plan.Plan {
		p := &plan.Plan{}
		for _, d := range []struct {
			name  string
			pools [][]string
		}{{"gold", gold}, {"bronze", bronze}} {
			pd := plan.Driver{Name: d.name}
			for _, names := range d.pools {
				pd.Pools = append(pd.Pools, plan.Pool{DaemonSet: fmt.Sprint(d.name, len(pd.Pools)), Nodes: names})
			}
			p.Drivers = append(p.Drivers, pd)
		}
		return p
	}
	memo := &nodeMemo{}
	snapFor := func(p *plan.Plan, key uint64) *snapshot {
		s := &snapshot{nodes: nodes, facts: memo.facts(nodes, true), memo: memo, key: key}
		s.shared = &planShared{plan: p, owners: s.nodeOwners()}
		return s
	}
	check := func(what string, s *snapshot, p *plan.Plan, want map[string][]poolNodes) {
		t.Helper()
		for name, w := range want {
			got := s.poolNodesOf(p.DriverByName(name), name)
			if !reflect.DeepEqual(got, w) {
				t.Errorf("%s, %s: %+v, want %+v", what, name, got, w)
			}
			byHand := (&snapshot{nodes: nodes}).poolNodesOf(p.DriverByName(name), name)
			if !reflect.DeepEqual(byHand, w) {
				t.Errorf("%s, %s, a snapshot made by hand: %+v, want %+v", what, name, byHand, w)
			}
		}
	}
	p1 := planOf([][]string{{"n1", "n3"}, {"n4", "n5"}}, [][]string{{"n0", "n2"}, {"n6", "n7"}})
	check("first key", snapFor(p1, 1), p1, map[string][]poolNodes{
		// n3 has no state; n4 is silver's
		"gold":   {{states: map[string]int32{"state-1": 1}}, {states: map[string]int32{"state-0": 1, "state-1": 1}, pending: 1}},
		"bronze": {{states: map[string]int32{"state-0": 1}, pending: 2}, {states: map[string]int32{"state-1": 1}, pending: 2}},
	})
	if f := memo.facts(nodes[5:6], false)[0]; f.place.key != 1 || f.place.at != (placement{"gold", 1}) {
		t.Errorf("n5's place kept in its facts: %+v, want gold's pool 1 for key 1", f.place)
	}
	// A new key: n5 moves to bronze; n1 has a new state in a new object.
	nodes[1] = nodes[1].DeepCopy()
	nodes[1].ResourceVersion = "2"
	nodes[1].Labels[upgrade.LabelState] = "state-9"
	p2 := planOf([][]string{{"n1", "n3"}, {"n4"}}, [][]string{{"n0", "n2"}, {"n5", "n6", "n7"}})
	check("second key", snapFor(p2, 2), p2, map[string][]poolNodes{
		"gold":   {{states: map[string]int32{"state-9": 1}}, {states: map[string]int32{"state-0": 1}, pending: 1}},
		"bronze": {{states: map[string]int32{"state-0": 1}, pending: 2}, {states: map[string]int32{"state-1": 2}, pending: 3}},
	})
	if got := snapFor(p2, 2).poolNodesOf(&plan.Driver{}, "gold"); len(got) != 0 {
		t.Errorf("no pools: %+v", got)
	}
}

// A pool's platforms for the image check: sorted, once per key and pool.
func TestPlatformsOf(t *testing.T) {
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1", Labels: map[string]string{corev1.LabelArchStable: "arm64"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", ResourceVersion: "1"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c", ResourceVersion: "1", Labels: map[string]string{corev1.LabelArchStable: "arm64"}}},
	}
	pool := plan.Pool{DaemonSet: "ds", Nodes: []string{"a", "b", "c", "gone"}}
	want := []string{"linux/amd64", "linux/arm64"}
	shared := &planShared{}
	s := &snapshot{nodes: nodes, shared: shared}
	if got := s.platformsOf()(pool); !slices.Equal(got, want) {
		t.Errorf("platforms %v, want %v", got, want)
	}
	if got := (&snapshot{nodes: nodes}).platformsOf()(pool); !slices.Equal(got, want) {
		t.Errorf("made by hand: platforms %v, want %v", got, want)
	}
	if got := shared.platforms["ds"]; !slices.Equal(got, want) {
		t.Errorf("kept for the key: %v, want %v", got, want)
	}
}

// The driver's passes reuse the last listing of the nodes while no node
// changed since and it is younger than scanReuseFor; a heartbeat is no
// change, a label is. The labeller's passes (computeFresh) always list,
// and a plan cache without the count of changes never reuses.
func TestNodeScanReuse(t *testing.T) {
	store := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	ne := &nodeEvents{store: store}
	node := func(name, rv string, state string) *corev1.Node {
		n := cachedNode(func(n *corev1.Node) {
			n.Name, n.UID, n.ResourceVersion = name, types.UID("uid-"+name), rv
			n.Labels[plan.LabelOSID], n.Labels[plan.LabelOSVersion] = "ubuntu", "22.04"
			if state != "" {
				n.Labels[upgrade.LabelState] = state
			}
		})
		return n
	}
	for _, name := range []string{"n1", "n2", "n3"} {
		n := node(name, "1", upgrade.StateDone)
		_ = store.Add(n)
		ne.OnAdd(n, false)
	}
	update := func(old, n *corev1.Node) {
		_ = store.Update(n)
		ne.OnUpdate(old, n)
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	gold := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold", UID: "g", Generation: 1},
		Spec: v1alpha1.NVIDIADriverSpec{DriverType: "gpu", Version: "535.104.12", Repository: "nvcr.io/nvidia", Image: "driver",
			NodeSelector: map[string]string{"pool": "gold"}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(gold).Build()
	now := time.Unix(1000, 0)
	pc := &planCache{reads: &cachedReads{nodes: store}, changes: &ne.changes, now: func() time.Time { return now }}

	pass := func(what string, fresh bool) (*snapshot, map[string]int32) {
		t.Helper()
		compute := pc.compute
		if fresh {
			compute = pc.computeFresh
		}
		s, p, err := compute(context.Background(), c)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		pd := p.DriverByName("gold")
		if pd == nil || len(pd.Pools) != 1 {
			t.Fatalf("%s: gold's plan %+v, want one pool", what, pd)
		}
		return s, s.poolNodesOf(pd, "gold")[0].states
	}
	first, states := pass("first pass", false)
	if states[upgrade.StateDone] != 3 {
		t.Fatalf("first pass: states %v, want 3 done", states)
	}
	states[upgrade.StateDone] = 99 // the caller's own copy
	if s, states := pass("nothing changed", false); s.scan != first.scan || states[upgrade.StateDone] != 3 {
		t.Errorf("nothing changed: listed again (%v) or counts %v, want the first listing and 3 done", s.scan != first.scan, states)
	}
	n1 := store.List()[0].(*corev1.Node)
	beat := n1.DeepCopy()
	beat.ResourceVersion = "2"
	update(n1, beat)
	if s, _ := pass("after a heartbeat", false); s.scan != first.scan {
		t.Errorf("a heartbeat made the next pass list the nodes again")
	}
	if s, _ := pass("the labeller's", true); s.scan == first.scan {
		t.Errorf("computeFresh reused a listing")
	}
	second, _ := pass("after the labeller's listing", false)

	required := node(beat.Name, "3", upgrade.StateRequired)
	update(beat, required)
	third, states := pass("after a state change", false)
	if third.scan == second.scan || states[upgrade.StateRequired] != 1 || states[upgrade.StateDone] != 2 {
		t.Errorf("after a state change: reused %v, states %v, want a new listing with 1 required and 2 done", third.scan == second.scan, states)
	}
	now = now.Add(scanReuseFor)
	if s, _ := pass("after scanReuseFor", false); s.scan == third.scan {
		t.Errorf("a listing was reused after scanReuseFor")
	}

	pc.changes = nil
	a, _ := pass("without a count", false)
	if b, _ := pass("without a count, again", false); a.scan == b.scan {
		t.Errorf("a plan cache without the count of changes reused a listing")
	}
}

// Passes that need the plan of one key while another pass computes it wait
// for that computation instead of computing it again, and get its plan.
func TestPlanComputedOncePerKeyAtATime(t *testing.T) {
	store := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for _, name := range []string{"n1", "n2"} {
		_ = store.Add(cachedNode(func(n *corev1.Node) {
			n.Name, n.UID, n.ResourceVersion = name, types.UID("uid-"+name), "1"
			n.Labels[plan.LabelOSID], n.Labels[plan.LabelOSVersion] = "ubuntu", "22.04"
		}))
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	gold := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold", UID: "g", Generation: 1},
		Spec: v1alpha1.NVIDIADriverSpec{DriverType: "gpu", Version: "535.104.12", Repository: "nvcr.io/nvidia", Image: "driver"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(gold).Build()

	var computed atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	pc := &planCache{reads: &cachedReads{nodes: store}}
	pc.computePlan = func(nodes []plan.Node, drivers []v1alpha1.NVIDIADriver) plan.Plan {
		if computed.Add(1) == 1 {
			close(started)
			<-release
		}
		return plan.Compute(nodes, drivers)
	}
	type answer struct {
		snap *snapshot
		p    plan.Plan
		err  error
	}
	answers := make(chan answer, 3)
	pass := func() {
		s, p, err := pc.computeFresh(context.Background(), c)
		answers <- answer{s, p, err}
	}
	go pass()
	<-started
	go pass()
	go pass()
	joined := func() int {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		if pc.flight == nil {
			return -1
		}
		return pc.flight.joined
	}
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return joined() == 2, nil
	}); err != nil {
		t.Fatalf("the two later passes did not wait for the first one's plan (joined %d, computed %d)", joined(), computed.Load())
	}
	close(release)
	var got []answer
	for range 3 {
		got = append(got, <-answers)
	}
	if n := computed.Load(); n != 1 {
		t.Errorf("the plan was computed %d times, want once", n)
	}
	for i, a := range got {
		if a.err != nil {
			t.Fatalf("pass %d: %v", i, a.err)
		}
		if d := a.p.DriverByName("gold"); d == nil || len(d.Pools) != 1 || len(a.snap.owners) != 2 || a.snap.shared != got[0].snap.shared {
			t.Errorf("pass %d: gold %+v, owners %v, shared with the first: %v", i, d, a.snap.owners, a.snap.shared == got[0].snap.shared)
		}
	}
	if pc.flight != nil {
		t.Error("the finished computation is still in flight")
	}
	// The next pass of the same key is a plain hit.
	if _, _, err := pc.computeFresh(context.Background(), c); err != nil || computed.Load() != 1 {
		t.Errorf("a later pass: computed %d times, %v", computed.Load(), err)
	}
}
