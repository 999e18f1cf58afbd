package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// nodeLabelsKey is the single work item of the node labeller: labels depend on
// every CR and every node, so one pass plans once and patches what differs.
var nodeLabelsKey = ctrl.Request{NamespacedName: types.NamespacedName{Name: "node-labels"}}

// NodeLabeler keeps the GPU and owner labels on nodes in line with the plan:
// gpu.present on NFD GPU nodes, deploy.driver=true only where absent or empty,
// and the owner label routing each GPU node to exactly one CR.
type NodeLabeler struct {
	Client    client.Client
	Namespace string

	plans *planCache

	// written: the nodes this labeller patched, until the cache has seen
	// our write (ownWrites): a pass on the older copy would patch the node
	// again (one node write in ten, while a fleet comes up).
	written ownWrites

	// moves times the moves this labeller starts (nvdriver_move_seconds),
	// from the node events that woke it (labellerWakes).
	moves moveClock
}

// Reconcile implements reconcile.Reconciler.
func (r *NodeLabeler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	woken := r.moves.take() // before the cache is read (moveClock.take)
	snap, p, err := r.plans.computeFresh(ctx, r.Client)
	if err != nil {
		for node, at := range woken {
			r.moves.giveBack(node, at)
		}
		return ctrl.Result{}, err
	}
	running := r.nodesRunningDrivers()
	c := newNodeChanges()
	// GPU labels first, so a node NFD just found is planned as a GPU node.
	nodes := snap.planNodes()
	for i := range nodes {
		for k, v := range snap.fact(i).gpuLabels {
			set(c.labels, nodes[i].Name, k, v)
		}
	}
	c.releaseLeftNodes(snap, p)
	c.moveOwners(ctx, snap, nodes, p, running)
	behind := r.holdBehind(snap, c)
	err = r.patchNodes(ctx, c, snap)
	r.timeMoves(c, woken)
	if behind {
		// Our own write is on its way to the cache; its event wakes a pass,
		// but not always (an annotation alone is filtered), so look again.
		return ctrl.Result{RequeueAfter: cacheCatchUp}, err
	}
	return ctrl.Result{}, err
}

// timeMoves observes the moves this pass wrote for the nodes an event woke
// it for, and gives back to the next pass those it did not write (held
// behind our own write, or a failed patch): that pass will.
func (r *NodeLabeler) timeMoves(c *nodeChanges, woken map[string]time.Time) {
	for node, at := range woken {
		if !c.moves[node] {
			continue // nothing to move: the event woke the pass for something else
		}
		if p, ok := c.patched[node]; ok {
			r.moves.moved(at, p)
		} else {
			r.moves.giveBack(node, at)
		}
	}
}

// holdBehind drops the changes of nodes whose cached copy is still the one
// from before our last patch of them. It reports whether any node was held.
func (r *NodeLabeler) holdBehind(snap *snapshot, c *nodeChanges) bool {
	held := false
	for name := range r.written.behind(snap.nodes) {
		if c.labels[name] != nil || c.annotations[name] != nil || c.uncordon[name] {
			delete(c.labels, name)
			delete(c.annotations, name)
			delete(c.uncordon, name)
			held = true
		}
	}
	return held
}

// nodeChanges are the label and annotation changes per node (nil = remove)
// and the nodes to uncordon, written as one merge patch per node.
type nodeChanges struct {
	labels, annotations map[string]map[string]*string
	uncordon            map[string]bool
	// moves: the nodes, owned before, whose move these changes start (their
	// owner label or move-to annotation); patched: the nodes whose patch
	// went through (patchNodes), with when and how long it took the API
	// server to answer. For the move clock.
	moves   map[string]bool
	patched map[string]nodePatched
}

func newNodeChanges() *nodeChanges {
	return &nodeChanges{labels: map[string]map[string]*string{}, annotations: map[string]map[string]*string{}, uncordon: map[string]bool{},
		moves: map[string]bool{}, patched: map[string]nodePatched{}}
}

// releaseLeftNodes hands back, as they were, the nodes that left every
// driver while the upgrade machine held them.
func (c *nodeChanges) releaseLeftNodes(snap *snapshot, p plan.Plan) {
	for i, n := range snap.nodes {
		f := snap.fact(i)
		state := f.state
		if !f.hasState || f.plan.Owner != "" || p.Owner[n.Name] != "" {
			continue
		}
		// The node left every driver (its CR was deleted, or it was relabelled
		// to nothing) while the upgrade machine held it: hand it back as it was.
		setNull(c.labels, n.Name, upgrade.LabelState)
		if upgrade.InProgress(state) && n.Spec.Unschedulable && n.Annotations[upgrade.AnnotationInitialUnsched] != "true" {
			c.uncordon[n.Name] = true
		}
		for _, k := range upgrade.NodeAnnotations {
			if _, ok := n.Annotations[k]; ok {
				setAnnotationNull(c.annotations, n.Name, k)
			}
		}
	}
}

// moveOwners sets each node's owner label to its planned owner: directly
// where no driver runs, else by asking the upgrade machine to move it.
func (c *nodeChanges) moveOwners(ctx context.Context, snap *snapshot, nodes []plan.Node, p plan.Plan, running map[string]bool) {
	for i, n := range nodes {
		want, have := p.Owner[n.Name], n.Facts.Owner
		target := want
		if target == "" {
			target = upgrade.MoveRelease
		}
		moving := snap.nodes[i].Annotations[upgrade.AnnotationMoveTo]
		if want == have {
			if moving != "" { // the plan changed back: the move is off
				setAnnotationNull(c.annotations, n.Name, upgrade.AnnotationMoveTo)
			}
			continue
		}
		if have != "" && running[n.Name] {
			// A driver runs here: swapping it under GPU jobs is what we never do.
			// The upgrade machine cordons and empties the node, then moves it.
			if moving != target {
				c.moves[n.Name] = true
				setAnnotation(c.annotations, n.Name, upgrade.AnnotationMoveTo, target)
				if st := snap.fact(i).state; st == "" || st == upgrade.StateDone {
					set(c.labels, n.Name, upgrade.LabelState, upgrade.StateRequired)
				}
			}
			continue
		}
		if have != "" {
			log.FromContext(ctx).Info("moving node directly (no driver pod runs there)", "node", n.Name, "from", have, "to", want)
			c.moves[n.Name] = true
		}
		if want == "" {
			if _, ok := n.Labels[plan.LabelOwner]; ok {
				setNull(c.labels, n.Name, plan.LabelOwner)
			}
			continue
		}
		set(c.labels, n.Name, plan.LabelOwner, want)
		// No driver runs here and the upgrade machine has never seen the
		// node: the pod the DaemonSet will make is the current template, the
		// case NVIDIA's machine marks upgrade-done once the pod appears. Said
		// now, in the same patch, it saves every new node a second write
		// (docs/design.md, "One patch per new node").
		if f := snap.fact(i); !f.hasState && !f.skip && !running[n.Name] {
			set(c.labels, n.Name, upgrade.LabelState, upgrade.StateDone)
		}
	}
}

func (r *NodeLabeler) patchNodes(ctx context.Context, c *nodeChanges, snap *snapshot) error {
	pre := make(map[string]string, len(c.labels))
	for _, n := range snap.nodes {
		if c.labels[n.Name] != nil || c.annotations[n.Name] != nil {
			pre[n.Name] = n.ResourceVersion
		}
	}
	var firstErr error
	for name := range c.annotations {
		if c.labels[name] == nil {
			c.labels[name] = map[string]*string{}
		}
	}
	// Patched concurrently (bounded): on a fresh cluster of thousands of nodes
	// every node needs its labels, and one round trip at a time would take
	// minutes; the client's QPS limit still paces the whole.
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		work = make(chan string)
	)
	for range min(nodePatchWorkers, len(c.labels)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				labels := c.labels[name]
				patch := map[string]any{"metadata": map[string]any{"labels": labels}}
				if a := c.annotations[name]; len(a) > 0 {
					patch["metadata"].(map[string]any)["annotations"] = a
				}
				if c.uncordon[name] {
					patch["spec"] = map[string]any{"unschedulable": false}
				}
				body, _ := json.Marshal(patch)
				node := &corev1.Node{}
				node.Name = name
				waited := excludeFromCost(ctx)
				pctx, answers := withAnswerClock(ctx, r.moves.clock)
				err := r.Client.Patch(pctx, node, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager))
				waited()
				if err != nil {
					log.FromContext(ctx).Error(err, "labelling node", "node", name)
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("labelling node %s: %w", name, err)
					}
					mu.Unlock()
					continue
				}
				if p, ok := pre[name]; ok {
					r.written.wrote(name, p, node.ResourceVersion)
				}
				mu.Lock()
				c.patched[name] = nodePatched{at: r.moves.clock(), answer: answers.answered()}
				mu.Unlock()
			}
		}()
	}
	for name := range c.labels {
		work <- name
	}
	close(work)
	wg.Wait()
	return firstErr
}

// nodePatchWorkers bounds the concurrent node patches of one labelling pass.
const nodePatchWorkers = 16

func set(changes map[string]map[string]*string, node, key, value string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	v := value
	changes[node][key] = &v
}

func setNull(changes map[string]map[string]*string, node, key string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	changes[node][key] = nil
}

func setAnnotation(changes map[string]map[string]*string, node, key, value string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	v := value
	changes[node][key] = &v
}

// nodesRunningDrivers are the nodes where a driver pod runs (not terminating).
func (r *NodeLabeler) nodesRunningDrivers() map[string]bool {
	out := map[string]bool{}
	for _, p := range r.plans.reads.allPods() {
		if p.Namespace == r.Namespace && p.NodeName != "" && p.DeletionTimestamp == nil && p.Phase != corev1.PodSucceeded && p.Phase != corev1.PodFailed {
			out[p.NodeName] = true
		}
	}
	return out
}

func setAnnotationNull(changes map[string]map[string]*string, node, key string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	changes[node][key] = nil
}
