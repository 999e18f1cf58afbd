package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/plan"
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
