package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// A node getting its first driver is labelled owner and upgrade-done in one
// patch; every other case leaves the upgrade state to the upgrade machine.
func TestMoveOwnersFirstDriver(t *testing.T) {
	cases := []struct {
		name      string
		labels    map[string]string
		running   bool
		wantState *string // nil: the state label is not touched
	}{
		{"new node", map[string]string{}, false, ptr(upgrade.StateDone)},
		{"new node, a driver already runs there", map[string]string{}, true, nil},
		{"new node with a state from before", map[string]string{upgrade.LabelState: upgrade.StateRequired}, false, nil},
		{"moving from another CR, no driver runs", map[string]string{plan.LabelOwner: "other"}, false, nil},
		{"moving from another CR under a running driver", map[string]string{plan.LabelOwner: "other"}, true, ptr(upgrade.StateRequired)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: tc.labels}}
			snap := &snapshot{nodes: []corev1.Node{node}}
			p := plan.Plan{Owner: map[string]string{"n1": "gpu"}}
			c := newNodeChanges()
			c.moveOwners(context.Background(), snap, []plan.Node{{Name: "n1", Labels: tc.labels}}, p, map[string]bool{"n1": tc.running})

			got := c.labels["n1"][upgrade.LabelState]
			switch {
			case tc.wantState == nil && got != nil:
				t.Errorf("state label set to %q, want it left alone", *got)
			case tc.wantState != nil && (got == nil || *got != *tc.wantState):
				t.Errorf("state label = %v, want %q", deref(got), *tc.wantState)
			}
			_, stamped := c.annotations["n1"][upgrade.AnnotationStateSince]
			if wantStamp := tc.wantState != nil && *tc.wantState == upgrade.StateDone; stamped != wantStamp {
				t.Errorf("%s written: %v, want %v", upgrade.AnnotationStateSince, stamped, wantStamp)
			}
			if !tc.running || tc.labels[plan.LabelOwner] == "" {
				if o := c.labels["n1"][plan.LabelOwner]; o == nil || *o != "gpu" {
					t.Errorf("owner label = %v, want gpu", deref(o))
				}
			}
		})
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return *s
}
