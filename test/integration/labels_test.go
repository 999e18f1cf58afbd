package integration

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// patchesOf is how many PATCHes the controller sent for the node.
func patchesOf(name string) int64 {
	if n, ok := nodePatches.Load(name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// A new GPU node that joins a cluster whose CR selects it is written once:
// its GPU labels, its owner label and upgrade-done in one patch
// (docs/design.md, "One patch per new node"), and a later pass that finds
// nothing to change writes it no more.
func TestControllerLabelsNewNodeInOnePatch(t *testing.T) {
	startController(t)
	ctx := context.Background()
	// The CR first, and seen by the controller (its finalizer), as on a
	// cluster whose fleet grows: a node created before its CR gets its GPU
	// labels at once and its owner later, two patches by design.
	scenario(t, nil, nvd("op-gold", `{"version": "535.104.12", "nodeSelector": {"op": "1"}}`))
	eventually(t, "the controller to have seen op-gold", func() error {
		if d := getDriver(t, "op-gold"); !slices.Contains(d.Finalizers, v1alpha1.Finalizer) {
			return fmt.Errorf("finalizers %v", d.Finalizers)
		}
		return nil
	})
	var nodes []*corev1.Node
	for i := range 3 {
		n := gpuNode(fmt.Sprintf("op-%d", i), "ubuntu", "22.04", "", map[string]string{"op": "1"})
		if err := k8s.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, n) })
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		eventually(t, n.Name+" owned and upgrade-done", func() error {
			got := &corev1.Node{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), got); err != nil {
				return err
			}
			if o, s := got.Labels[plan.LabelOwner], got.Labels[upgrade.LabelState]; o != "op-gold" || s != upgrade.StateDone {
				return fmt.Errorf("owner %q, state %q", o, s)
			}
			return nil
		})
	}
	// The second use: a new version wakes the labeller and the upgrade
	// machine over the same nodes; no driver pod runs there, so neither has
	// anything to write to them.
	labeller, machine := reconcileCountOf(t, "node-labels"), reconcileCountOf(t, "upgrade")
	d := getDriver(t, "op-gold")
	if err := k8s.Patch(ctx, d, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"version":"535.129.03"}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the labeller and the upgrade machine to run again", func() error {
		if reconcileCountOf(t, "node-labels") <= labeller || reconcileCountOf(t, "upgrade") <= machine {
			return fmt.Errorf("not both yet")
		}
		return nil
	})
	for _, n := range nodes {
		if got := patchesOf(n.Name); got != 1 {
			t.Errorf("%s: %d PATCHes from the controller, want 1", n.Name, got)
		}
	}
}

// movesTimed is how many moves the labeller has timed
// (nvdriver_move_seconds).
func movesTimed(t *testing.T) uint64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "nvdriver_move_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// A node relabelled from one CR's selector to another's is moved, and the
// controller's part of that wait is timed (docs/design.md, "Move latency");
// its first owner, as it joined, is not a move.
func TestControllerTimesARelabelledNodesMove(t *testing.T) {
	startController(t)
	ctx := context.Background()
	n := gpuNode("mv-1", "ubuntu", "22.04", "", map[string]string{"mv": "a"})
	scenario(t, []*corev1.Node{n},
		nvd("mv-a", `{"version": "535.104.12", "nodeSelector": {"mv": "a"}}`),
		nvd("mv-b", `{"version": "535.104.12", "nodeSelector": {"mv": "b"}}`))
	owned := func(want string) func() error {
		return func() error {
			if got := nodeOwner(t, n.Name); got != want {
				return fmt.Errorf("owner %q, want %q", got, want)
			}
			return nil
		}
	}
	eventually(t, "mv-1 owned by mv-a", owned("mv-a"))
	before := movesTimed(t)
	if err := k8s.Patch(ctx, n, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"mv":"b"}}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "mv-1 moved to mv-b", owned("mv-b"))
	// The metric is observed after the patch returns, the owner label
	// may be read before: poll.
	eventually(t, "the move timed", func() error {
		if movesTimed(t) == before {
			return fmt.Errorf("no move timed")
		}
		return nil
	})
}
