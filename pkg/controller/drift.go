package controller

import (
	"fmt"
	"hash/fnv"
	"reflect"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// drifted reports whether the live object no longer holds what the
// controller applies: some field of want's spec, labels or annotations is
// missing from live or has another value. A matching hash annotation only
// says the desired object did not change; someone may have edited the live
// one (kubectl edit of an image, a deleted toleration), and a level-triggered
// controller repairs that. Fields others added, and server defaults, are not
// drift: want need only be contained in live.
func drifted(want, live *unstructured.Unstructured) bool {
	for _, path := range [][]string{{"spec"}, {"metadata", "labels"}, {"metadata", "annotations"}} {
		w, _, _ := unstructured.NestedFieldNoCopy(want.Object, path...)
		l, _, _ := unstructured.NestedFieldNoCopy(live.Object, path...)
		if !contains(l, w) {
			return true
		}
	}
	return false
}

// contains: every field of want is in have with the same value; a list
// holds each wanted element somewhere (order and extra elements are free).
func contains(have, want any) bool {
	switch w := want.(type) {
	case nil:
		return true
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return len(w) == 0
		}
		for k, wv := range w {
			if !contains(h[k], wv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok {
			return len(w) == 0
		}
		for _, wv := range w {
			found := false
			for _, hv := range h {
				if contains(hv, wv) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(have, want)
	}
}

// intactPools remembers, per DaemonSet, what was rendered (poolRenderKey)
// and which live object was found to hold it (liveKey), the last time a
// pass checked. A pass whose pool and live DaemonSet are both the same again
// has nothing to render, hash or compare: at thousands of nodes the driver
// controller passes several times a second while nodes join, and the
// DaemonSet's template changes in none of them. The live object is known by
// what drifted reads (its generation for the spec, its labels and
// annotations), not its resourceVersion, which every status update moves.
type intactPools struct {
	mu   sync.Mutex
	seen map[string]intactPool
}

type intactPool struct {
	render string
	live   uint64
}

func (p *intactPools) still(name, renderKey string, live *appsv1.DaemonSet) bool {
	if live == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.seen[name]
	return ok && s.render == renderKey && s.live == liveKey(live)
}

func (p *intactPools) found(name, renderKey string, live *appsv1.DaemonSet) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[string]intactPool{}
	}
	p.seen[name] = intactPool{render: renderKey, live: liveKey(live)}
}

// poolRenderKey is everything render.DaemonSet reads: the CR's identity and
// spec (its generation) and the pool less its nodes.
func poolRenderKey(d *v1alpha1.NVIDIADriver, pool plan.Pool) string {
	return fmt.Sprintf("%s/%s/%d/%s/%s/%s/%s/%v/%v", d.UID, d.Name, d.Generation, pool.DaemonSet, pool.OSTag, pool.Kernel, pool.Image, pool.Sidecars, pool.NodeSelector)
}

// liveKey identifies what drifted compares of a live DaemonSet.
func liveKey(ds *appsv1.DaemonSet) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%v/%v", ds.UID, ds.Generation, ds.Labels, ds.Annotations)
	return h.Sum64()
}
