package controller

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// ownWrites remembers, per node a reconciler patched, the resourceVersion
// the node had before, until the cache shows a later one (kube's
// "expectations"). While the cache still shows that version it has not seen
// our own write, and a pass deciding on it would act twice: the upgrade
// machine could hand a node's budget slot out again, the labeller would
// patch the node again with what it already holds.
type ownWrites struct {
	mu  sync.Mutex
	pre map[string]string
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
		w.pre = map[string]string{}
	}
	if _, ok := w.pre[node]; !ok { // keep the oldest: the cache must pass it
		w.pre[node] = pre
	}
}

// behind returns the nodes whose cached copy is still from before our last
// patch of them (nil when none), and forgets the nodes the cache has caught
// up on.
func (w *ownWrites) behind(nodes []*corev1.Node) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out map[string]bool
	for i := range nodes {
		pre, ok := w.pre[nodes[i].Name]
		if !ok {
			continue
		}
		if nodes[i].ResourceVersion != pre {
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
