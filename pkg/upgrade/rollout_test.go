package upgrade

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// fleet is n nodes named n00.. waiting to upgrade (upgrade-required, stale pod).
func fleet(n int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = Node{Name: fmt.Sprintf("n%02d", i), State: StateRequired, DriverPod: stale, Annotations: map[string]string{}, Labels: map[string]string{}}
	}
	return out
}

// set changes the named nodes of a fleet.
func set(nodes []Node, f func(*Node), names ...string) []Node {
	for i := range nodes {
		for _, n := range names {
			if nodes[i].Name == n {
				f(&nodes[i])
			}
		}
	}
	return nodes
}

func upgraded(n *Node) { n.State, n.DriverPod = StateDone, fresh }
func inFlight(n *Node) { n.State = StatePodRestart }
func failedHere(rev string) func(*Node) {
	return func(n *Node) {
		n.State = StateFailed
		n.Annotations = map[string]string{AnnotationFailure: "the new driver pod did not become Ready", AnnotationFailedRevision: rev}
	}
}

func withRollout(f func(*v1alpha1.DriverUpgradePolicySpec)) Policy {
	up := &v1alpha1.DriverUpgradePolicySpec{AutoUpgrade: true, MaxParallelUpgrades: 1}
	f(up)
	return PolicyFor(&v1alpha1.NVIDIADriverSpec{Version: "550.90.07", UpgradePolicy: up})
}

func canary(nodes intstr.IntOrString) func(*v1alpha1.DriverUpgradePolicySpec) {
	return func(up *v1alpha1.DriverUpgradePolicySpec) {
		up.Canary = &v1alpha1.CanarySpec{Nodes: nodes, Promotion: v1alpha1.PromotionManual}
	}
}

func heldNames(g Gate) []string {
	var out []string
	for n := range g.Held {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func names(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%02d", prefix, i))
	}
	return out
}

// TestTrack is the wave, budget and halt arithmetic of one pass.
func TestTrack(t *testing.T) {
	plain := defaults()
	manual2 := withRollout(canary(intstr.FromInt32(2)))
	rev := manual2.Revision
	started := &v1alpha1.RolloutStatus{Revision: rev, StartedAt: metav1.NewTime(now.Add(-time.Hour))}
	chosen := func(nodes ...string) *v1alpha1.RolloutStatus {
		s := started.DeepCopy()
		s.CanaryNodes = nodes
		return s
	}
	auto := withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) {
		up.Canary = &v1alpha1.CanarySpec{Nodes: intstr.FromInt32(1), Promotion: v1alpha1.PromotionAutomatic, BakeSeconds: ptr.To[int32](60)}
	})
	autoDone := func(ago time.Duration) *v1alpha1.RolloutStatus {
		s := chosen("n00")
		s.Revision = auto.Revision
		s.CanaryDoneAt = ptrTime(now.Add(-ago))
		return s
	}

	cases := []struct {
		name      string
		nodes     []Node
		policy    Policy
		prev      *v1alpha1.RolloutStatus
		resumedAt string
		phase     string
		held      []string // nil: none
		canary    []string // nil: not checked
		halted    bool
		check     func(t *testing.T, g Gate)
	}{
		{name: "no canary, no failure: nothing held", nodes: fleet(4), policy: plain, phase: v1alpha1.RolloutProgressing},
		{name: "a canary of 2: the first two in name order go, the rest wait", nodes: fleet(20), policy: manual2,
			phase: v1alpha1.RolloutCanary, canary: []string{"n00", "n01"}, held: names("n", 2, 20)},
		{name: "a canary percentage of the CR's nodes rounds up", nodes: fleet(15), policy: withRollout(canary(intstr.FromString("10%"))),
			phase: v1alpha1.RolloutCanary, canary: []string{"n00", "n01"}, held: names("n", 2, 15)},
		{name: "a canary larger than the CR takes every node, and nothing is left to promote",
			nodes: set(fleet(3), upgraded, "n00", "n01", "n02"), policy: withRollout(canary(intstr.FromInt32(50))),
			prev: chosen("n00", "n01", "n02"), phase: v1alpha1.RolloutComplete},
		{name: "the canary is chosen among nodes that need the upgrade", nodes: set(fleet(5), upgraded, "n00"), policy: manual2,
			phase: v1alpha1.RolloutCanary, canary: []string{"n01", "n02"}, held: names("n", 3, 5)},
		{name: "a canary selector picks the canaries", nodes: set(fleet(6), func(n *Node) { n.Labels["pool"] = "canary" }, "n03", "n05"),
			policy: withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) {
				up.Canary = &v1alpha1.CanarySpec{Nodes: intstr.FromInt32(5), Promotion: v1alpha1.PromotionManual,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "canary"}}}
			}),
			phase: v1alpha1.RolloutCanary, canary: []string{"n03", "n05"}, held: []string{"n00", "n01", "n02", "n04"}},
		{name: "a selector matching no node waits and says so", nodes: fleet(3),
			policy: withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) {
				up.Canary = &v1alpha1.CanarySpec{Nodes: intstr.FromInt32(1), Promotion: v1alpha1.PromotionManual,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "none"}}}
			}),
			phase: v1alpha1.RolloutWaiting, held: names("n", 0, 3), check: func(t *testing.T, g Gate) {
				if !strings.Contains(g.Status.Message, "matches spec.upgradePolicy.canary.selector") {
					t.Errorf("message %q", g.Status.Message)
				}
			}},
		{name: "a restarted controller keeps the canary it chose", nodes: set(fleet(6), upgraded, "n04"), policy: manual2,
			prev: chosen("n04", "n05"), phase: v1alpha1.RolloutCanary, canary: []string{"n04", "n05"}, held: names("n", 0, 4)},
		{name: "a canary node in flight is not held, and nor is it counted done", nodes: set(fleet(6), inFlight, "n00"), policy: manual2,
			prev: chosen("n00", "n01"), phase: v1alpha1.RolloutCanary, held: names("n", 2, 6), check: func(t *testing.T, g Gate) {
				if g.Status.InFlight != 1 || g.Status.Done != 0 {
					t.Errorf("in flight %d done %d", g.Status.InFlight, g.Status.Done)
				}
			}},
		{name: "a manual canary done waits for a person", nodes: set(fleet(6), upgraded, "n00", "n01"), policy: manual2,
			prev: chosen("n00", "n01"), phase: v1alpha1.RolloutWaiting, held: names("n", 2, 6), check: func(t *testing.T, g Gate) {
				if g.Status.CanaryDoneAt == nil || !strings.Contains(g.Status.Message, "rollout resume` upgrades the other 4") {
					t.Errorf("canary done at %v, message %q", g.Status.CanaryDoneAt, g.Status.Message)
				}
			}},
		{name: "resume promotes the canary", nodes: set(fleet(6), upgraded, "n00", "n01"), policy: manual2,
			prev: chosen("n00", "n01"), resumedAt: "2026-12-01T12:00:00Z", phase: v1alpha1.RolloutProgressing, check: func(t *testing.T, g Gate) {
				if !g.Status.Promoted || g.Status.ResumedAt != "2026-12-01T12:00:00Z" {
					t.Errorf("promoted %v resumed %q", g.Status.Promoted, g.Status.ResumedAt)
				}
			}},
		{name: "a resume already acted on does nothing again", nodes: set(fleet(6), upgraded, "n00", "n01"), policy: manual2,
			prev: func() *v1alpha1.RolloutStatus {
				s := chosen("n00", "n01")
				s.ResumedAt = "2026-12-01T11:00:00Z"
				return s
			}(), resumedAt: "2026-12-01T11:00:00Z", phase: v1alpha1.RolloutWaiting, held: names("n", 2, 6)},
		{name: "an automatic canary bakes", nodes: set(fleet(4), upgraded, "n00"), policy: auto, prev: autoDone(30 * time.Second),
			phase: v1alpha1.RolloutBaking, held: names("n", 1, 4), check: func(t *testing.T, g Gate) {
				if want := now.Add(30 * time.Second); !g.WakeAt.Equal(want) {
					t.Errorf("wake at %v, want %v", g.WakeAt, want)
				}
			}},
		{name: "an automatic canary is promoted after its bake time", nodes: set(fleet(4), upgraded, "n00"), policy: auto, prev: autoDone(time.Minute),
			phase: v1alpha1.RolloutProgressing, check: func(t *testing.T, g Gate) {
				if !g.Status.Promoted {
					t.Error("not promoted")
				}
			}},
		{name: "a canary node failing halts with the default budget of 1", nodes: set(fleet(6), failedHere(rev), "n00"), policy: manual2,
			prev: chosen("n00", "n01"), phase: v1alpha1.RolloutHalted, halted: true, held: names("n", 1, 6), check: func(t *testing.T, g Gate) {
				if len(g.Status.FailedNodes) != 1 || g.Status.FailedNodes[0].Node != "n00" || !strings.Contains(g.Status.Message, "n00: the new driver pod did not become Ready") {
					t.Errorf("failed %v, message %q", g.Status.FailedNodes, g.Status.Message)
				}
			}},
		{name: "an automatic canary with a failure is not promoted while the budget allows it", nodes: set(set(fleet(4), failedHere(""), "n00"), upgraded, "n01"),
			policy: func() Policy {
				p := withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) {
					up.Canary = &v1alpha1.CanarySpec{Nodes: intstr.FromInt32(2), Promotion: v1alpha1.PromotionAutomatic, BakeSeconds: ptr.To[int32](0)}
					up.FailureBudget = ptr.To(intstr.FromInt32(3))
				})
				return p
			}(), prev: func() *v1alpha1.RolloutStatus {
				s := autoDone(time.Hour)
				s.CanaryNodes = []string{"n00", "n01"}
				s.CanaryDoneAt = nil
				return s
			}(),
			phase: v1alpha1.RolloutCanary, held: []string{"n02", "n03"}},
		{name: "budget 10% of 20 is 2: one failure goes on", nodes: set(fleet(20), failedHere(plain.Revision), "n03"),
			policy: func() Policy { p := plain; p.FailureBudget = intstr.FromString("10%"); return p }(), phase: v1alpha1.RolloutProgressing},
		{name: "budget 10% of 20 is 2: two failures halt, nothing more starts", nodes: set(fleet(20), failedHere(plain.Revision), "n03", "n07"),
			policy: func() Policy { p := plain; p.FailureBudget = intstr.FromString("10%"); return p }(), phase: v1alpha1.RolloutHalted, halted: true,
			held: func() []string {
				all := names("n", 0, 20)
				return append(append(all[:3:3], all[4:7]...), all[8:]...)
			}()},
		{name: "a failure on an older revision does not count", nodes: set(fleet(4), failedHere("older"), "n00"), policy: plain, phase: v1alpha1.RolloutProgressing},
		{name: "resume after a halt accepts the failures so far", nodes: set(fleet(4), failedHere(plain.Revision), "n00"), policy: plain,
			prev: &v1alpha1.RolloutStatus{Revision: plain.Revision, Phase: v1alpha1.RolloutHalted}, resumedAt: "t1", phase: v1alpha1.RolloutProgressing,
			check: func(t *testing.T, g Gate) {
				if !reflect.DeepEqual(g.Status.AcceptedFailures, []string{"n00"}) {
					t.Errorf("accepted %v", g.Status.AcceptedFailures)
				}
			}},
		{name: "a new failure after the resume halts again", nodes: set(fleet(4), failedHere(plain.Revision), "n00", "n02"), policy: plain,
			prev: &v1alpha1.RolloutStatus{Revision: plain.Revision, ResumedAt: "t1", AcceptedFailures: []string{"n00"}}, resumedAt: "t1",
			phase: v1alpha1.RolloutHalted, halted: true, held: []string{"n01", "n03"}},
		{name: "pause mid-wave: no node starts, in-flight nodes are not held", nodes: set(fleet(5), inFlight, "n00", "n01"),
			policy: withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) { up.Paused = true }), phase: v1alpha1.RolloutPaused, held: names("n", 2, 5)},
		{name: "halted wins over paused", nodes: set(fleet(3), failedHere(""), "n00"),
			policy: withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) { up.Paused = true }), phase: v1alpha1.RolloutHalted, halted: true, held: names("n", 1, 3)},
		{name: "a new revision starts a new rollout: new canary, resume forgotten", nodes: fleet(4), policy: manual2,
			prev: &v1alpha1.RolloutStatus{Revision: "older", CanaryNodes: []string{"n03"}, Promoted: true, ResumedAt: "t0"}, resumedAt: "t0",
			phase: v1alpha1.RolloutCanary, canary: []string{"n00", "n01"}, held: []string{"n02", "n03"}, check: func(t *testing.T, g Gate) {
				if !g.Status.StartedAt.Time.Equal(now) || g.Status.Promoted || g.Status.ResumedAt != "t0" {
					t.Errorf("started %v promoted %v resumed %q", g.Status.StartedAt, g.Status.Promoted, g.Status.ResumedAt)
				}
			}},
		{name: "no node needs the revision yet (a first install): no canary chosen, nothing held",
			nodes: []Node{{Name: "a", Annotations: map[string]string{}}, {Name: "b", Annotations: map[string]string{}}}, policy: manual2,
			phase: v1alpha1.RolloutProgressing, canary: nil},
		{name: "every node done: complete", nodes: set(fleet(3), upgraded, "n00", "n01", "n02"), policy: plain, phase: v1alpha1.RolloutComplete,
			check: func(t *testing.T, g Gate) {
				if g.Status.CompletedAt == nil || g.Status.Done != 3 || g.Status.Total != 3 {
					t.Errorf("%+v", g.Status)
				}
			}},
		{name: "skipped nodes are neither counted nor held", nodes: set(set(fleet(3), upgraded, "n00", "n01"), func(n *Node) { n.Skip = true }, "n02"),
			policy: plain, phase: v1alpha1.RolloutComplete},
		{name: "a move is never held: a paused CR still lets its nodes go (or come)", nodes: set(fleet(3), func(n *Node) { n.Annotations[AnnotationMoveTo] = MoveRelease }, "n01"),
			policy: withRollout(func(up *v1alpha1.DriverUpgradePolicySpec) { up.Paused = true }), phase: v1alpha1.RolloutPaused, held: []string{"n00", "n02"}},
		{name: "a moving node is not chosen as a canary", nodes: set(fleet(3), func(n *Node) { n.Annotations[AnnotationMoveTo] = "other" }, "n00"),
			policy: withRollout(canary(intstr.FromInt32(1))), phase: v1alpha1.RolloutCanary, canary: []string{"n01"}, held: []string{"n02"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := Track(tc.nodes, tc.policy, tc.prev, tc.resumedAt, now)
			if g.Status.Phase != tc.phase {
				t.Errorf("phase %q (%s), want %q", g.Status.Phase, g.Status.Message, tc.phase)
			}
			if got := heldNames(g); !reflect.DeepEqual(got, tc.held) {
				t.Errorf("held %v, want %v", got, tc.held)
			}
			if tc.canary != nil && !reflect.DeepEqual(g.Status.CanaryNodes, tc.canary) {
				t.Errorf("canary %v, want %v", g.Status.CanaryNodes, tc.canary)
			}
			if g.Halted != tc.halted {
				t.Errorf("halted %v, want %v", g.Halted, tc.halted)
			}
			if tc.check != nil {
				tc.check(t, g)
			}
		})
	}
}

// The rollout says per pool whether what is left to do is disruptive or
// restart-only.
func TestTrackPoolShares(t *testing.T) {
	nodes := fleet(5)
	set(nodes, func(n *Node) { n.Pool = "ds-a" }, "n00", "n01", "n02")
	set(nodes, func(n *Node) { n.Pool = "ds-b" }, "n03", "n04")
	set(nodes, func(n *Node) { n.DriverPod = sameDigest }, "n03", "n04")
	set(nodes, func(n *Node) { n.State = StatePodRestart; n.Annotations[AnnotationRestartOnly] = "true" }, "n04")
	set(nodes, upgraded, "n00")
	got := Track(nodes, defaults(), nil, "", now).Status.Pools
	want := []v1alpha1.RolloutPool{{DaemonSet: "ds-a", Change: ChangeDisruptive, Pending: 2}, {DaemonSet: "ds-b", Change: ChangeRestartOnly, Pending: 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("pools %+v, want %+v", got, want)
	}
}

// TestTrackHoldsThroughDecide: a held node does not enter the machine, the
// others do within the budget.
func TestTrackHoldsThroughDecide(t *testing.T) {
	p := withRollout(canary(intstr.FromInt32(2)))
	p.MaxParallelUpgrades, p.MaxUnavailable = 0, intstr.FromString("100%")
	nodes := fleet(6)
	g := Track(nodes, p, nil, "", now)
	for i := range nodes {
		nodes[i].Held = g.Held[nodes[i].Name]
	}
	var entered []string
	for _, d := range Decide(nodes, p, now) {
		if d.To == StateCordon {
			entered = append(entered, d.Node)
		}
	}
	if !reflect.DeepEqual(entered, []string{"n00", "n01"}) {
		t.Errorf("entered %v, want the canary n00 n01", entered)
	}
}

func TestFailureBudgetNodes(t *testing.T) {
	for _, tc := range []struct {
		v     intstr.IntOrString
		total int
		want  int
	}{
		{intstr.FromInt32(1), 10, 1}, {intstr.FromInt32(3), 2, 3}, {intstr.FromString("10%"), 20, 2},
		{intstr.FromString("10%"), 21, 3}, {intstr.FromString("1%"), 5, 1}, {intstr.FromString("bad"), 5, 1},
	} {
		if got := FailureBudgetNodes(tc.v, tc.total); got != tc.want {
			t.Errorf("%s of %d: %d, want %d", tc.v.String(), tc.total, got, tc.want)
		}
	}
}

func TestRevisionOfIgnoresWhereAndHow(t *testing.T) {
	a := &v1alpha1.NVIDIADriverSpec{Version: "550.90.07", NodeSelector: map[string]string{"a": "b"}}
	b := a.DeepCopy()
	b.NodeSelector, b.Default, b.UpgradePolicy = map[string]string{"c": "d"}, true, &v1alpha1.DriverUpgradePolicySpec{Paused: true}
	_, ha := RevisionOf(a)
	_, hb := RevisionOf(b)
	if ha != hb {
		t.Errorf("nodeSelector/default/upgradePolicy changed the revision: %s %s", ha, hb)
	}
	b.Version = "560.35.03"
	if _, hc := RevisionOf(b); hc == ha {
		t.Error("a new version kept the revision")
	}
}

// A node waiting to start is held while its pod's DaemonSet has a template
// the DaemonSet controller has not observed; moves and nodes already in the
// machine are not, and an earlier reason (a pause) is kept.
func TestTrackHoldsUntilObserved(t *testing.T) {
	pending := &DriverPod{Name: "p", TemplatePending: true}
	observed := &DriverPod{Name: "p"}
	nodes := []Node{
		{Name: "waiting", State: StateRequired, DriverPod: pending, Annotations: map[string]string{}},
		{Name: "observed", State: StateRequired, DriverPod: observed, Annotations: map[string]string{}},
		{Name: "in-flight", State: StatePodRestart, DriverPod: pending, Annotations: map[string]string{}},
		{Name: "moving", State: StateRequired, DriverPod: pending, Annotations: map[string]string{AnnotationMoveTo: "other"}},
	}
	g := Track(nodes, defaults(), nil, "", now)
	want := map[string]bool{"waiting": true}
	for _, n := range nodes {
		if (g.Held[n.Name] != "") != want[n.Name] {
			t.Errorf("%s: held %q", n.Name, g.Held[n.Name])
		}
	}
	if g.Held["waiting"] != HeldTemplatePending {
		t.Errorf("waiting: held %q", g.Held["waiting"])
	}
	p := defaults()
	p.Paused = true
	if got := Track(nodes, p, nil, "", now).Held["waiting"]; got != "rollout paused" {
		t.Errorf("an earlier reason was overwritten: %q", got)
	}
}
