package upgrade

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// RevisionOf is what a rollout brings to the nodes: the spec without the
// fields that say where and how it rolls (nodeSelector, default,
// upgradePolicy), as JSON, and its hash. An undo puts these fields back and
// leaves the others as they are, as `kubectl rollout undo` restores a
// Deployment's pod template only. See docs/design.md, "Rollouts".
func RevisionOf(spec *v1alpha1.NVIDIADriverSpec) (data []byte, hash string) {
	s := spec.DeepCopy()
	s.NodeSelector, s.Default, s.UpgradePolicy = nil, false, nil
	data, err := json.Marshal(s)
	if err != nil { // a typed struct always marshals
		panic(err)
	}
	h := fnv.New64a()
	h.Write(data)
	return data, fmt.Sprintf("%016x", h.Sum64())[:10]
}

// notRevisionFields are the spec's JSON keys a revision does not restore.
var notRevisionFields = map[string]bool{"nodeSelector": true, "default": true, "upgradePolicy": true}

// IsRevisionField reports whether an undo restores the spec's JSON key.
func IsRevisionField(key string) bool { return !notRevisionFields[key] }

func canaryPolicy(c *v1alpha1.CanarySpec) *Canary {
	out := &Canary{Nodes: c.Nodes, Manual: c.Promotion != v1alpha1.PromotionAutomatic, Bake: DefaultBake}
	if c.BakeSeconds != nil {
		out.Bake = time.Duration(*c.BakeSeconds) * time.Second
	}
	if c.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(c.Selector)
		if err != nil {
			out.SelectorError = err
		} else {
			out.Matches = func(l map[string]string) bool { return sel.Matches(labels.Set(l)) }
		}
	}
	return out
}
