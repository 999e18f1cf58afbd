package controller

import (
	"context"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// A node the labeller patched is not patched again while the cache still
// shows it from before that patch; once the cache moves past it, it is.
func TestLabellerWaitsForItsOwnWrite(t *testing.T) {
	node := func(rv string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: rv}}
	}
	changes := func() *nodeChanges {
		c := newNodeChanges()
		set(c.labels, "n1", plan.LabelOwner, "gold")
		set(c.labels, "n2", plan.LabelOwner, "gold")
		return c
	}
	r := &NodeLabeler{}
	r.written.wrote("n1", "5", "6")
	r.written.wrote("n1", "6", "7") // the oldest is kept: the cache must pass it

	c := changes()
	if !r.holdBehind(&snapshot{nodes: []*corev1.Node{node("5")}}, c) {
		t.Fatal("cache at the version before our patch: want the node held")
	}
	if c.labels["n1"] != nil || c.labels["n2"] == nil {
		t.Errorf("held the wrong nodes: %v", c.labels)
	}

	c = changes()
	if r.holdBehind(&snapshot{nodes: []*corev1.Node{node("6")}}, c) {
		t.Error("cache past our patch: want nothing held")
	}
	if c.labels["n1"] == nil {
		t.Error("cache past our patch: the node's changes were dropped")
	}
	if len(r.written.pre) != 0 {
		t.Errorf("a node the cache caught up on is still remembered: %v", r.written.pre)
	}

	r.written.wrote("n1", "7", "7") // a patch that changed nothing: no event will come
	if len(r.written.pre) != 0 {
		t.Errorf("a no-op patch was remembered: %v", r.written.pre)
	}
}

// A GPU node that gets its first owner with no driver pod on it is written
// once: owner and upgrade-done together. A node the machine may have work
// on keeps its state to the machine: one with a driver pod already (an
// orphan), one its admin told the machine to skip, one with a state set.
func TestNewNodeOwnerAndDoneInOnePatch(t *testing.T) {
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Labels: labels}}
	}
	snap := &snapshot{nodes: []*corev1.Node{
		node("fresh", nil),
		node("orphan-pod", nil),
		node("skipped", map[string]string{upgrade.LabelSkip: "true"}),
		node("failed", map[string]string{upgrade.LabelState: upgrade.StateFailed}),
		node("moved-direct", map[string]string{plan.LabelOwner: "silver"}),
	}}
	p := plan.Plan{Owner: map[string]string{"fresh": "gold", "orphan-pod": "gold", "skipped": "gold", "failed": "gold", "moved-direct": "gold"}}
	c := newNodeChanges()
	c.moveOwners(context.Background(), snap, snap.planNodes(), p, map[string]bool{"orphan-pod": true})

	want := map[string]map[string]string{
		"fresh":        {plan.LabelOwner: "gold", upgrade.LabelState: upgrade.StateDone},
		"orphan-pod":   {plan.LabelOwner: "gold"},
		"skipped":      {plan.LabelOwner: "gold"},
		"failed":       {plan.LabelOwner: "gold"},
		"moved-direct": {plan.LabelOwner: "gold", upgrade.LabelState: upgrade.StateDone},
	}
	for name, w := range want {
		got := map[string]string{}
		for k, v := range c.labels[name] {
			if v == nil {
				t.Errorf("%s: %s removed", name, k)
				continue
			}
			got[k] = *v
		}
		if !maps.Equal(got, w) {
			t.Errorf("%s: labels written %v, want %v", name, got, w)
		}
	}
}

// The move clock times moves only: a node that had an owner and is given
// another (directly, or through the move-to annotation where a driver
// runs) or none; not a new node's first owner.
func TestMovesAreTheNodesThatHadAnOwner(t *testing.T) {
	node := func(name, owner string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Labels: map[string]string{}}}
		if owner != "" {
			n.Labels[plan.LabelOwner] = owner
		}
		return n
	}
	snap := &snapshot{nodes: []*corev1.Node{
		node("fresh", ""), node("direct", "silver"), node("driver-runs", "silver"), node("released", "silver"), node("stays", "gold"),
	}}
	p := plan.Plan{Owner: map[string]string{"fresh": "gold", "direct": "gold", "driver-runs": "gold", "stays": "gold"}}
	c := newNodeChanges()
	c.moveOwners(context.Background(), snap, snap.planNodes(), p, map[string]bool{"driver-runs": true, "stays": true})
	want := map[string]bool{"direct": true, "driver-runs": true, "released": true}
	if !maps.Equal(c.moves, want) {
		t.Errorf("moves %v, want %v", c.moves, want)
	}
}
