package controller

import (
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// ownWrites remembers, per node a reconciler patched, the resourceVersions
// the node had before each of its patches, until the cache shows another one
// (kube's "expectations"). While the cache shows one of them it has not seen
// our last write, and a pass deciding on it would act twice: the upgrade
// machine could hand a node's budget slot out again, or write a state the
// node has already left (after a chain of steps, docs/design.md, "Chained
// steps"), the labeller would patch the node again with what it already
// holds.
type ownWrites struct {
	mu  sync.Mutex
	pre map[string][]string
}

// wrote records a patch of node that took it from resourceVersion pre to
// post; a patch that changed nothing (post == pre) brings no event, so it is
// not waited for.
func (w *ownWrites) wrote(node, pre, post string) {
	if post == pre {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pre == nil {
		w.pre = map[string][]string{}
	}
	w.pre[node] = append(w.pre[node], pre)
}

// behind returns the nodes whose cached copy is from before one of our
// patches of them (nil when none), and forgets the nodes the cache has
// caught up on.
func (w *ownWrites) behind(nodes []*corev1.Node) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out map[string]bool
	for i := range nodes {
		pre, ok := w.pre[nodes[i].Name]
		if !ok {
			continue
		}
		if !slices.Contains(pre, nodes[i].ResourceVersion) {
			delete(w.pre, nodes[i].Name)
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[nodes[i].Name] = true
	}
	return out
}
