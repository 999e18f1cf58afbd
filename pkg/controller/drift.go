package controller

import (
	"reflect"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
