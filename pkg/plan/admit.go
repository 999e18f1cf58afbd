package plan

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// Admit judges one NVIDIADriver before the API server stores it (the
// validating webhook; docs/design.md, "Admission"). old is nil on create;
// drivers are the stored NVIDIADrivers (obj's stored copy among them on
// update). It returns why obj must be refused, or nil.
//
// Only what obj itself adds is refused: nodes that obj makes selected by two
// non-default drivers, or a second default. A CR that already conflicts may
// still be edited (a version bump, a narrower selector), so nobody is trapped
// by a conflict the webhook could not prevent (node labels changing later, or
// the webhook down when it was applied); the controller reports those.
func Admit(nodes []Node, drivers []v1alpha1.NVIDIADriver, old, obj *v1alpha1.NVIDIADriver) *Problem {
	if obj.DeletionTimestamp != nil {
		return nil
	}
	if old != nil && old.Spec.Default == obj.Spec.Default && maps.Equal(old.Spec.NodeSelector, obj.Spec.NodeSelector) {
		return nil
	}
	others := make([]v1alpha1.NVIDIADriver, 0, len(drivers)+1)
	for _, d := range drivers {
		if d.Name != obj.Name {
			others = append(others, d)
		}
	}
	if obj.Spec.Default && (old == nil || !old.Spec.Default) {
		var defaults []string
		for _, d := range others {
			if d.Spec.Default && d.DeletionTimestamp == nil {
				defaults = append(defaults, d.Name)
			}
		}
		if len(defaults) > 0 {
			sort.Strings(defaults)
			return &Problem{Reason: ReasonConflictingDefault, Message: fmt.Sprintf(
				"NVIDIADriver %s is already the default: only one default: true NVIDIADriver works; set spec.default: false here (and a nodeSelector), or delete %s first",
				quoteJoin(defaults), quoteJoin(defaults))}
		}
	}
	// A node obj already shared with another driver is not obj's new doing.
	already := map[string]bool{}
	if old != nil {
		for _, c := range conflictsOf(Compute(nodes, append(slices.Clone(others), *old)), obj.Name) {
			already[c.Node] = true
		}
	}
	var mine []Conflict
	for _, c := range conflictsOf(Compute(nodes, append(slices.Clone(others), *obj)), obj.Name) {
		if !already[c.Node] {
			mine = append(mine, c)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	return &Problem{Reason: ReasonConflictingNodeSelector, Message: OverlapMessage(obj.Name, mine)}
}

func conflictsOf(p Plan, name string) []Conflict {
	if d := p.DriverByName(name); d != nil {
		return d.Conflicts
	}
	return nil
}

// NewConflicts are the conflicted nodes of after that were not conflicted in
// before, by node name.
func NewConflicts(before, after Plan) []Conflict {
	old := map[string]bool{}
	for _, d := range before.Drivers {
		for _, c := range d.Conflicts {
			old[c.Node] = true
		}
	}
	seen := map[string]bool{}
	var out []Conflict
	for _, d := range after.Drivers {
		for _, c := range d.Conflicts {
			if !old[c.Node] && !seen[c.Node] {
				seen[c.Node] = true
				out = append(out, c)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// OverlapMessage says that name would make these nodes selected by more than
// one NVIDIADriver, and how to fix it: the words of both the webhook's denial
// and assign's refusal.
func OverlapMessage(name string, conflicts []Conflict) string {
	others := map[string]bool{}
	nodes := make([]string, len(conflicts))
	for i, c := range conflicts {
		nodes[i] = c.Node
		for _, d := range c.Drivers {
			if d != name {
				others[d] = true
			}
		}
	}
	shown, more := nodes, ""
	if len(shown) > maxNamedNodes {
		shown, more = shown[:maxNamedNodes], fmt.Sprintf(" and %d more", len(nodes)-maxNamedNodes)
	}
	names := quoteJoin(slices.Sorted(maps.Keys(others)))
	who := "NVIDIADriver " + names + " already selects"
	if len(others) > 1 {
		who = "NVIDIADrivers " + names + " already select"
	}
	return fmt.Sprintf("NVIDIADriver %q would select %d node(s) that %s: %s%s; "+
		"a node must be selected by one NVIDIADriver: narrow spec.nodeSelector here or in %s, or label other nodes "+
		"(kubectl nvdriver preview -f FILE shows who selects what)",
		name, len(nodes), who, strings.Join(shown, ", "), more, names)
}
