package controller

import (
	"testing"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// The pods on a node are listed where the pass's decision reads them; while
// a node's driver pod is being replaced, once per restartRecheck only.
func TestNeedsPods(t *testing.T) {
	r := &UpgradeReconciler{}
	policy := upgrade.Policy{}
	node := func(state string, pod *upgrade.DriverPod) upgrade.Node {
		return upgrade.Node{State: state, DriverPod: pod}
	}
	old := &upgrade.DriverPod{Name: "old"}
	going := &upgrade.DriverPod{Name: "old", Deleting: true}
	fresh := &upgrade.DriverPod{Name: "new", InSync: true}
	for _, tc := range []struct {
		name  string
		in    upgrade.Node
		first bool // the first pass
		again bool // a pass right after
	}{
		{"pod deletion", node(upgrade.StatePodDeletion, old), true, true},
		{"drain", node(upgrade.StateDrain, old), true, true},
		{"restart, the old pod still there", node(upgrade.StatePodRestart, old), true, true},
		{"restart, the old pod going", node(upgrade.StatePodRestart, going), true, false},
		{"restart, no pod yet", node(upgrade.StatePodRestart, nil), true, false},
		{"restart, the new pod in sync", node(upgrade.StatePodRestart, fresh), false, false},
		{"cordon", node(upgrade.StateCordon, old), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Name = tc.name // a node of its own per case: recheckDue remembers nodes
			if got := r.needsPods(in, policy); got != tc.first {
				t.Errorf("first pass: %v, want %v", got, tc.first)
			}
			if got := r.needsPods(in, policy); got != tc.again {
				t.Errorf("next pass: %v, want %v", got, tc.again)
			}
		})
	}
	// Leaving pod-restart forgets the listing: the next restart lists at once.
	r.transitioned("restart, no pod yet", upgrade.Decision{From: upgrade.StatePodRestart, To: upgrade.StateValidation})
	if !r.needsPods(upgrade.Node{Name: "restart, no pod yet", State: upgrade.StatePodRestart}, policy) {
		t.Error("after the node left pod-restart, its next restart did not list at once")
	}
}
