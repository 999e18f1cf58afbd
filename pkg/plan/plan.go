// Package plan decides which node gets which driver. It is pure: the
// controller and `kubectl nvdriver preview` call the same Compute on a snapshot
// of the cluster, so a preview is exactly what the controller will do.
package plan

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// Rules names the conflict rule in force.
const (
	RulesNVDriver    = "nvdriver"
	RulesGPUOperator = "gpu-operator"
)

// Skip reasons (stable: they appear in the JSON output).
const (
	ReasonPreInstalled  = "PreInstalledDriver"
	ReasonDisabled      = "DriverDisabled"
	ReasonMissingOS     = "MissingOSLabels"
	ReasonMissingKernel = "MissingKernelLabel"
)

// Error reasons on a driver.
const (
	ReasonConflictingNodeSelector = "ConflictingNodeSelector"
	ReasonConflictingDefault      = "ConflictingDefault"
	ReasonInvalidSpec             = "InvalidSpec"
)

// maxNamedNodes bounds the node names quoted in a conflict message.
const maxNamedNodes = 10

// Node is what the plan needs of a node: its name and labels.
type Node struct {
	Name   string
	Labels map[string]string
}

// Plan is the outcome for a whole cluster.
type Plan struct {
	Rules     string   `json:"rules"`
	Drivers   []Driver `json:"drivers"`
	Uncovered []string `json:"uncovered"`
	// Owner maps every input node to the owner label it should carry ("" = none).
	Owner map[string]string `json:"-"`
}

// Driver is the outcome for one NVIDIADriver.
type Driver struct {
	Name          string              `json:"name"`
	DriverType    v1alpha1.DriverType `json:"driverType"`
	Default       bool                `json:"default"`
	SelectedNodes []string            `json:"selectedNodes"`
	Pools         []Pool              `json:"pools"`
	Skipped       []Skipped           `json:"skipped"`
	Conflicts     []Conflict          `json:"conflicts"`
	Warnings      []string            `json:"warnings"`
	// Leaving are nodes still labelled for this driver that the plan gives to
	// another: they stay in its pools until the controller has moved them.
	Leaving []string `json:"leaving,omitempty"`
	// Error is set when the driver cannot work as written (conflict, second
	// default, unresolvable image); the controller reports it as Error=True.
	Error *Problem `json:"error,omitempty"`
}

// Pool is one DaemonSet: the nodes of a driver sharing an OS release (and a
// kernel when precompiled).
type Pool struct {
	OSTag     string `json:"osTag"`
	Kernel    string `json:"kernel,omitempty"`
	DaemonSet string `json:"daemonSet"`
	Image     string `json:"image"`
	// Sidecars are the enabled GDS and GDRCopy images (keys SidecarGDS,
	// SidecarGDRCopy), resolved here so preview shows what the pods pull.
	Sidecars map[string]string `json:"sidecars,omitempty"`
	Nodes    []string          `json:"nodes"`
	// Leaving are the pool's nodes that the plan gives to another driver (or
	// to none): the DaemonSet keeps serving them until the controller has
	// drained and moved them; Driver.Leaving lists them too.
	Leaving []string `json:"leaving,omitempty"`
	// NodeSelector is the pool part of the pod nodeSelector: gpu.present, the
	// owner label, the OS labels (and the kernel). The user's spec.nodeSelector
	// is deliberately left out (NVIDIA puts it in): the owner label already
	// carries the selection, and with the user's labels in the template a
	// relabelled node would lose its driver pod to the DaemonSet controller at
	// once, under running GPU jobs, before the move protocol could drain it;
	// a selector edit would also change the template and restart every pod
	// (NVIDIA's gpu-operator#1661).
	NodeSelector map[string]string `json:"-"`
}

// Images are the distinct images the pool's containers run: the driver's
// (which the peermem sidecar shares) and the enabled sidecars', sorted.
func (p Pool) Images() []string {
	imgs := []string{p.Image}
	for _, img := range p.Sidecars {
		imgs = append(imgs, img)
	}
	slices.Sort(imgs)
	return slices.Compact(imgs)
}

// Skipped is a node a driver selects but cannot serve, with why.
type Skipped struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// Conflict is a node selected by more than one driver.
type Conflict struct {
	Node    string   `json:"node"`
	Drivers []string `json:"drivers"`
}

// Problem is a reason and a message that says what to fix.
type Problem struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Selects reports whether a non-default driver's nodeSelector matches the
// labels (absent or empty selects every GPU node, as in NVIDIA's operator).
func Selects(spec *v1alpha1.NVIDIADriverSpec, labels map[string]string) bool {
	for k, v := range spec.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Options tune Compute.
type Options struct {
	// Rules is RulesNVDriver (conflicts block only the drivers involved) or
	// RulesGPUOperator (NVIDIA's rule: any conflict blocks every driver).
	Rules string
}

// Compute plans the whole cluster. Drivers being deleted select nothing (their
// nodes fall to the other drivers or the default).
func Compute(nodes []Node, drivers []v1alpha1.NVIDIADriver) Plan {
	return ComputeWith(nodes, drivers, Options{})
}

// ComputeWith is Compute with options.
func ComputeWith(nodes []Node, drivers []v1alpha1.NVIDIADriver, opts Options) Plan {
	if opts.Rules == "" {
		opts.Rules = RulesNVDriver
	}
	p := Plan{Rules: opts.Rules, Uncovered: []string{}, Owner: make(map[string]string, len(nodes))}

	live := make([]*v1alpha1.NVIDIADriver, 0, len(drivers))
	for i := range drivers {
		if drivers[i].DeletionTimestamp == nil {
			live = append(live, &drivers[i])
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })

	out := make(map[string]*Driver, len(live))
	p.Drivers = make([]Driver, len(live))
	for i, d := range live {
		p.Drivers[i] = Driver{
			Name: d.Name, DriverType: d.Spec.Type(), Default: d.Spec.Default,
			SelectedNodes: []string{}, Pools: []Pool{}, Skipped: []Skipped{},
			Conflicts: []Conflict{}, Warnings: []string{},
		}
		out[d.Name] = &p.Drivers[i]
	}

	workingDefault := pickDefault(live, out)

	sortedNodes := slices.Clone(nodes)
	sort.Slice(sortedNodes, func(i, j int) bool { return sortedNodes[i].Name < sortedNodes[j].Name })

	// Pass 1: routing. Each GPU node goes to the one non-default driver whose
	// selector matches, else to the working default; two matches is a conflict
	// and the node keeps the owner it had.
	conflictNodes := map[string][]string{} // driver -> conflicted node names
	for _, n := range sortedNodes {
		if !IsGPUNode(n.Labels) {
			p.Owner[n.Name] = ""
			continue
		}
		var matched []*v1alpha1.NVIDIADriver
		for _, d := range live {
			if !d.Spec.Default && Selects(&d.Spec, n.Labels) {
				matched = append(matched, d)
			}
		}
		if len(matched) == 0 && workingDefault != nil {
			matched = []*v1alpha1.NVIDIADriver{workingDefault}
		}
		if reason := excluded(n.Labels); reason != "" {
			for _, d := range matched {
				out[d.Name].Skipped = append(out[d.Name].Skipped, Skipped{Node: n.Name, Reason: reason})
			}
			p.Owner[n.Name] = ""
			continue
		}
		switch len(matched) {
		case 0:
			p.Uncovered = append(p.Uncovered, n.Name)
			p.Owner[n.Name] = ""
		case 1:
			p.Owner[n.Name] = matched[0].Name
		default:
			names := make([]string, len(matched))
			for i, d := range matched {
				names[i] = d.Name
			}
			for _, d := range matched {
				out[d.Name].Conflicts = append(out[d.Name].Conflicts, Conflict{Node: n.Name, Drivers: names})
				conflictNodes[d.Name] = append(conflictNodes[d.Name], n.Name)
			}
			// The node keeps the owner it had, if that CR still lives: a label
			// naming a deleted CR would hold nothing but the node itself.
			if prev := n.Labels[LabelOwner]; out[prev] != nil {
				p.Owner[n.Name] = prev
			} else {
				p.Owner[n.Name] = ""
			}
		}
	}

	// NVIDIA's operator fails closed: while any conflict exists it changes no
	// owner label anywhere.
	if len(conflictNodes) > 0 && opts.Rules == RulesGPUOperator {
		for _, n := range sortedNodes {
			p.Owner[n.Name] = n.Labels[LabelOwner]
		}
	}

	// Pass 2: pools, from the final owners.
	byName := make(map[string]*v1alpha1.NVIDIADriver, len(live))
	for _, d := range live {
		byName[d.Name] = d
	}
	type poolKey struct{ osTag, kernel string }
	pools := map[string]map[poolKey]*Pool{}
	// A node is in the pool of the driver it should run (its planned owner) and,
	// while it is still labelled for another live driver, in that driver's pool
	// too: the node is leaving, and its running driver must stay until the
	// controller has emptied the node and moved the label (see pkg/upgrade).
	type member struct {
		n       Node
		owner   string
		leaving bool
	}
	var members []member
	for _, n := range sortedNodes {
		if owner := p.Owner[n.Name]; owner != "" {
			members = append(members, member{n: n, owner: owner})
		}
		if cur := n.Labels[LabelOwner]; cur != "" && cur != p.Owner[n.Name] && byName[cur] != nil && IsGPUNode(n.Labels) && excluded(n.Labels) == "" {
			members = append(members, member{n: n, owner: cur, leaving: true})
		}
	}
	for _, m := range members {
		n, owner := m.n, m.owner
		d, ok := byName[owner]
		if !ok {
			continue
		}
		pd := out[owner]
		if m.leaving {
			pd.Leaving = append(pd.Leaving, n.Name)
		} else {
			pd.SelectedNodes = append(pd.SelectedNodes, n.Name)
		}
		osTag, osSel, ok := OSTag(n.Labels)
		if !ok {
			if !m.leaving {
				pd.Skipped = append(pd.Skipped, Skipped{Node: n.Name, Reason: ReasonMissingOS})
			}
			continue
		}
		kernel := ""
		if d.Spec.IsPrecompiled() {
			kernel = n.Labels[LabelKernel]
			if kernel == "" {
				if !m.leaving {
					pd.Skipped = append(pd.Skipped, Skipped{Node: n.Name, Reason: ReasonMissingKernel})
				}
				continue
			}
		}
		if pools[owner] == nil {
			pools[owner] = map[poolKey]*Pool{}
		}
		key := poolKey{osTag, kernel}
		pool := pools[owner][key]
		if pool == nil {
			sel := make(map[string]string, 5)
			sel[LabelGPUPresent] = "true"
			maps.Copy(sel, osSel)
			if kernel != "" {
				sel[LabelKernel] = kernel
			}
			sel[LabelOwner] = d.Name
			img, err := Image(&d.Spec, osTag, kernel)
			if err != nil && pd.Error == nil {
				pd.Error = &Problem{Reason: ReasonInvalidSpec, Message: fmt.Sprintf("cannot resolve the driver image: %v", err)}
			}
			sidecars, err := SidecarImages(&d.Spec, osTag)
			if err != nil && pd.Error == nil {
				pd.Error = &Problem{Reason: ReasonInvalidSpec, Message: fmt.Sprintf("cannot resolve a sidecar image: %v", err)}
			}
			pool = &Pool{
				OSTag: osTag, Kernel: kernel, Image: img, Sidecars: sidecars, Nodes: []string{}, NodeSelector: sel,
				DaemonSet: DaemonSetName(d.Spec.Type(), osTag, string(d.UID), kernel),
			}
			pools[owner][key] = pool
		}
		pool.Nodes = append(pool.Nodes, n.Name)
		if m.leaving {
			pool.Leaving = append(pool.Leaving, n.Name)
		}
	}
	for name, byKey := range pools {
		pd := out[name]
		for _, pool := range byKey {
			pd.Pools = append(pd.Pools, *pool)
		}
		sort.Slice(pd.Pools, func(i, j int) bool {
			if pd.Pools[i].OSTag != pd.Pools[j].OSTag {
				return pd.Pools[i].OSTag < pd.Pools[j].OSTag
			}
			return pd.Pools[i].Kernel < pd.Pools[j].Kernel
		})
	}

	// Conflicts, scoped to the drivers involved (or to all, under NVIDIA's rule).
	anyConflict := false
	for _, d := range live {
		pd := out[d.Name]
		if len(pd.Conflicts) == 0 {
			continue
		}
		anyConflict = true
		if pd.Error == nil || pd.Error.Reason != ReasonConflictingDefault {
			pd.Error = &Problem{Reason: ReasonConflictingNodeSelector, Message: conflictMessage(pd)}
		}
	}
	if anyConflict && opts.Rules == RulesGPUOperator {
		for i := range p.Drivers {
			if p.Drivers[i].Error == nil {
				p.Drivers[i].Error = &Problem{Reason: ReasonConflictingNodeSelector,
					Message: "NVIDIA GPU Operator blocks every NVIDIADriver while any two select the same node"}
			}
		}
	}

	if opts.Rules == RulesGPUOperator {
		for _, d := range live {
			if pd := out[d.Name]; pd.Error == nil {
				if msg := nvidiaImageRule(&d.Spec); msg != "" {
					pd.Error = &Problem{Reason: ReasonInvalidSpec, Message: "NVIDIA's GPU Operator refuses this NVIDIADriver: " + msg}
				}
			}
		}
	}
	for _, d := range live {
		pd := out[d.Name]
		if !d.Spec.IsPrecompiled() && v1alpha1.IsBranch(d.Spec.Version) {
			pd.Warnings = append(pd.Warnings, fmt.Sprintf(
				"spec.version %q is a driver branch: NVIDIA publishes no driver image tagged with a bare branch unless usePrecompiled is true; use a full version such as %s.104.12", d.Spec.Version, d.Spec.Version))
		}
		if len(pd.SelectedNodes) == 0 && pd.Error == nil && len(pd.Skipped) == 0 {
			pd.Warnings = append(pd.Warnings, "selects no GPU node")
		}
	}
	return p
}

// nvidiaImageRule is NVIDIA's image rule, which has no defaults: with a
// version set, repository, image and version must all be set, for the
// driver, the enabled sidecars and a manager that sets a version; its
// operator refuses the CR (or renders an image the API server rejects)
// otherwise. It returns what to fix, or "".
func nvidiaImageRule(s *v1alpha1.NVIDIADriverSpec) string {
	if s.Repository == "" || s.Image == "" {
		return "invalid image specification: repository, image and version must all be set (set spec.repository, e.g. nvcr.io/nvidia, and spec.image, e.g. driver)"
	}
	if g := s.GPUDirectStorage; g != nil && v1alpha1.Enabled(g.Enabled) && (g.Repository == "" || g.Image == "") {
		return "spec.gds needs repository and image (e.g. " + DefaultComponentRepository + " and " + DefaultGDSImage + ")"
	}
	if g := s.GDRCopy; g != nil && v1alpha1.Enabled(g.Enabled) && (g.Repository == "" || g.Image == "") {
		return "spec.gdrcopy needs repository and image (e.g. " + DefaultComponentRepository + " and " + DefaultGDRCopyImage + ")"
	}
	if m := s.Manager; m.Version != "" && (m.Repository == "" || m.Image == "") {
		return "spec.manager sets a version and so needs repository and image too (e.g. " + DefaultComponentRepository + " and " + DefaultManagerImageName + ")"
	}
	return ""
}

// pickDefault chooses the working default: the oldest default driver
// (creationTimestamp, then name). The others get ConflictingDefault.
func pickDefault(live []*v1alpha1.NVIDIADriver, out map[string]*Driver) *v1alpha1.NVIDIADriver {
	var defaults []*v1alpha1.NVIDIADriver
	for _, d := range live {
		if d.Spec.Default {
			defaults = append(defaults, d)
		}
	}
	if len(defaults) == 0 {
		return nil
	}
	sort.SliceStable(defaults, func(i, j int) bool {
		ti, tj := defaults[i].CreationTimestamp, defaults[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return defaults[i].Name < defaults[j].Name
	})
	for _, d := range defaults[1:] {
		out[d.Name].Error = &Problem{Reason: ReasonConflictingDefault, Message: fmt.Sprintf(
			"NVIDIADriver %q is already the default (it is older); only one default: true NVIDIADriver works: set spec.default to false here or delete one of them", defaults[0].Name)}
	}
	return defaults[0]
}

func excluded(labels map[string]string) string {
	switch labels[LabelDeployDriver] {
	case DeployPreInstalled:
		return ReasonPreInstalled
	case DeployFalse:
		return ReasonDisabled
	}
	return ""
}

func conflictMessage(d *Driver) string {
	others := map[string]bool{}
	nodes := make([]string, 0, len(d.Conflicts))
	for _, c := range d.Conflicts {
		nodes = append(nodes, c.Node)
		for _, n := range c.Drivers {
			if n != d.Name {
				others[n] = true
			}
		}
	}
	names := slices.Sorted(maps.Keys(others))
	shown := nodes
	more := ""
	if len(shown) > maxNamedNodes {
		shown = shown[:maxNamedNodes]
		more = fmt.Sprintf(" and %d more", len(nodes)-maxNamedNodes)
	}
	return fmt.Sprintf("nodeSelector overlaps with NVIDIADriver %s on %d node(s): %s%s; make the nodeSelectors disjoint (e.g. kubectl nvdriver assign)",
		quoteJoin(names), len(nodes), strings.Join(shown, ", "), more)
}

func quoteJoin(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// DriverByName returns the named driver of the plan, or nil.
func (p *Plan) DriverByName(name string) *Driver {
	for i := range p.Drivers {
		if p.Drivers[i].Name == name {
			return &p.Drivers[i]
		}
	}
	return nil
}

// HasConflicts reports whether any driver has a conflict.
func (p *Plan) HasConflicts() bool {
	for i := range p.Drivers {
		if len(p.Drivers[i].Conflicts) > 0 {
			return true
		}
	}
	return false
}
