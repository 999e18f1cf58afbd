package plan

import "github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"

// What the plan reads of each node, worked out once per plan (or, by a
// caller that keeps them, once per version of a node).

// Facts are what the plan reads of a node's labels other than through the
// CRs' nodeSelectors.
type Facts struct {
	GPU      bool   // IsGPUNode
	Excluded string // Excluded: the skip reason, or ""
	Owner    string // the owner label's value
	Kernel   string // the kernel label's value
	// OSTag is OSTag's tag, "" when an OS label is missing; osVersionKey
	// is the version label it was made from.
	OSTag        string
	osVersionKey string
}

// FactsOf works out a node's Facts from its labels.
func FactsOf(labels map[string]string) Facts {
	f := Facts{GPU: IsGPUNode(labels), Excluded: excluded(labels), Owner: labels[LabelOwner], Kernel: labels[LabelKernel]}
	if tag, key, ok := osTagOf(labels); ok {
		f.OSTag, f.osVersionKey = tag, key
	}
	return f
}

// selector is a live non-default driver's nodeSelector as pairs: ranging
// over a map per node and CR was most of a plan's cost at thousands of nodes.
type selector struct {
	d     *v1alpha1.NVIDIADriver
	pairs [][2]string
}

func (s selector) matches(labels map[string]string) bool {
	for _, kv := range s.pairs {
		if got, ok := labels[kv[0]]; !ok || got != kv[1] {
			return false
		}
	}
	return true
}

// Excluded is the skip reason of a node whose driver is not ours to run
// (pre-installed on the host, or disabled), "" otherwise.
func Excluded(labels map[string]string) string { return excluded(labels) }

func excluded(labels map[string]string) string {
	switch labels[LabelDeployDriver] {
	case DeployPreInstalled:
		return ReasonPreInstalled
	case DeployFalse:
		return ReasonDisabled
	}
	return ""
}
