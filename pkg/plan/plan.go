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
	// Facts, when set, must be FactsOf(Labels): a caller that plans the
	// same nodes again and again (the controller) keeps them per version
	// of a node rather than have each Compute look them up again.
	Facts *Facts
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
	// KernelImages, for a precompiled driver, are its images for every
	// (OS, kernel) seen on the cluster's GPU nodes, selected or not, with
	// the registry's answer: which kernels lack an image. Filled by preview
	// when it checks images; the planner never sets it.
	KernelImages []KernelImage `json:"kernelImages,omitempty"`
}

// The statuses of an ImageCheck (pkg/imagecheck defines them from these).
const (
	ImageStatusOK      = "ok"
	ImageStatusMissing = "missing"
	ImageStatusUnknown = "unknown"
)

// ImageCheck is a registry's answer about one image (preview fills it).
type ImageCheck struct {
	Image   string `json:"image"`
	Status  string `json:"status"` // ImageStatusOK, ImageStatusMissing or ImageStatusUnknown
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// KernelImage is a precompiled driver's image for one kernel.
type KernelImage struct {
	OSTag  string `json:"osTag"`
	Kernel string `json:"kernel"`
	// Nodes run that kernel; Selected of them are the driver's.
	Nodes    int        `json:"nodes"`
	Selected int        `json:"selected"`
	Check    ImageCheck `json:"check"`
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
	// Change is set by preview for a CR changed from its stored version:
	// "disruptive" (the driver's install changes), "restart-only" (the pods
	// restart in place, GPU jobs stay) or "none". Compute leaves it empty.
	Change string `json:"change,omitempty"`
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
	// ImageCheck is the registry's answer for each of Images(), when
	// preview checked them; the planner never sets it.
	ImageCheck []ImageCheck `json:"imageCheck,omitempty"`
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
	pl := newPlanner(nodes, drivers, opts)
	pl.route()
	pl.buildPools()
	pl.blockConflicts()
	pl.applyNVIDIAImageRule()
	pl.warn()
	return pl.p
}

// planner holds one Compute: the live drivers by name, their outcomes and
// the nodes in name order; each step below reads what the earlier ones left.
type planner struct {
	opts           Options
	p              Plan
	live           []*v1alpha1.NVIDIADriver // by name
	byName         map[string]*v1alpha1.NVIDIADriver
	out            map[string]*Driver // points into p.Drivers
	workingDefault *v1alpha1.NVIDIADriver
	nodes          []Node // by name, each with its Facts
	conflicted     bool
	// selectors are the live non-default drivers' nodeSelectors as pairs,
	// in live's order: ranging over a map per node and CR was most of a
	// plan's cost at thousands of nodes.
	selectors []selector
}

func newPlanner(nodes []Node, drivers []v1alpha1.NVIDIADriver, opts Options) *planner {
	pl := &planner{opts: opts, p: Plan{Rules: opts.Rules, Uncovered: []string{}, Owner: make(map[string]string, len(nodes))}}
	pl.live = make([]*v1alpha1.NVIDIADriver, 0, len(drivers))
	for i := range drivers {
		if drivers[i].DeletionTimestamp == nil {
			pl.live = append(pl.live, &drivers[i])
		}
	}
	sort.Slice(pl.live, func(i, j int) bool { return pl.live[i].Name < pl.live[j].Name })

	pl.out = make(map[string]*Driver, len(pl.live))
	pl.byName = make(map[string]*v1alpha1.NVIDIADriver, len(pl.live))
	pl.p.Drivers = make([]Driver, len(pl.live))
	for i, d := range pl.live {
		pl.p.Drivers[i] = Driver{
			Name: d.Name, DriverType: d.Spec.Type(), Default: d.Spec.Default,
			SelectedNodes: []string{}, Pools: []Pool{}, Skipped: []Skipped{},
			Conflicts: []Conflict{}, Warnings: []string{},
		}
		pl.out[d.Name] = &pl.p.Drivers[i]
		pl.byName[d.Name] = d
	}
	pl.workingDefault = pickDefault(pl.live, pl.out)
	for _, d := range pl.live {
		if d.Spec.Default {
			continue
		}
		sel := selector{d: d, pairs: make([][2]string, 0, len(d.Spec.NodeSelector))}
		for k, v := range d.Spec.NodeSelector {
			sel.pairs = append(sel.pairs, [2]string{k, v})
		}
		pl.selectors = append(pl.selectors, sel)
	}
	pl.nodes = slices.Clone(nodes)
	var facts []Facts // for the nodes that came without
	for i := range pl.nodes {
		if pl.nodes[i].Facts == nil {
			if facts == nil {
				facts = make([]Facts, len(pl.nodes))
			}
			facts[i] = FactsOf(pl.nodes[i].Labels)
			pl.nodes[i].Facts = &facts[i]
		}
	}
	slices.SortFunc(pl.nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return pl
}

// route gives each GPU node to the one non-default driver whose selector
// matches, else to the working default; two matches is a conflict and the
// node keeps the owner it had. NVIDIA's operator fails closed: while any
// conflict exists it changes no owner label anywhere.
func (pl *planner) route() {
	for _, n := range pl.nodes {
		pl.routeNode(n)
	}
	if pl.conflicted && pl.opts.Rules == RulesGPUOperator {
		for _, n := range pl.nodes {
			pl.p.Owner[n.Name] = n.Facts.Owner
		}
	}
}

func (pl *planner) routeNode(n Node) {
	if !n.Facts.GPU {
		pl.p.Owner[n.Name] = ""
		return
	}
	var matched []*v1alpha1.NVIDIADriver
	for _, s := range pl.selectors {
		if s.matches(n.Labels) {
			matched = append(matched, s.d)
		}
	}
	if len(matched) == 0 && pl.workingDefault != nil {
		matched = []*v1alpha1.NVIDIADriver{pl.workingDefault}
	}
	if reason := n.Facts.Excluded; reason != "" {
		for _, d := range matched {
			pl.out[d.Name].Skipped = append(pl.out[d.Name].Skipped, Skipped{Node: n.Name, Reason: reason})
		}
		pl.p.Owner[n.Name] = ""
		return
	}
	switch len(matched) {
	case 0:
		pl.p.Uncovered = append(pl.p.Uncovered, n.Name)
		pl.p.Owner[n.Name] = ""
	case 1:
		pl.p.Owner[n.Name] = matched[0].Name
	default:
		pl.conflicted = true
		names := make([]string, len(matched))
		for i, d := range matched {
			names[i] = d.Name
		}
		for _, d := range matched {
			pl.out[d.Name].Conflicts = append(pl.out[d.Name].Conflicts, Conflict{Node: n.Name, Drivers: names})
		}
		// The node keeps the owner it had, if that CR still lives: a label
		// naming a deleted CR would hold nothing but the node itself.
		if prev := n.Facts.Owner; pl.out[prev] != nil {
			pl.p.Owner[n.Name] = prev
		} else {
			pl.p.Owner[n.Name] = ""
		}
	}
}

type poolKey struct{ osTag, kernel string }

// member is a node in a driver's pools: the driver it should run (its
// planned owner) or, while it is still labelled for another live driver,
// that driver too, as leaving: its running driver must stay until the
// controller has emptied the node and moved the label (see pkg/upgrade).
type member struct {
	n       Node
	owner   string
	leaving bool
}

// buildPools groups each driver's nodes by (OS, kernel when precompiled),
// from the final owners.
func (pl *planner) buildPools() {
	pools := map[string]map[poolKey]*Pool{}
	for _, m := range pl.members() {
		pl.addMember(pools, m)
	}
	for name, byKey := range pools {
		pd := pl.out[name]
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
}

func (pl *planner) members() []member {
	members := make([]member, 0, len(pl.nodes))
	for _, n := range pl.nodes {
		owner := pl.p.Owner[n.Name]
		if owner != "" {
			members = append(members, member{n: n, owner: owner})
		}
		if cur := n.Facts.Owner; cur != "" && cur != owner && pl.byName[cur] != nil && n.Facts.GPU && n.Facts.Excluded == "" {
			members = append(members, member{n: n, owner: cur, leaving: true})
		}
	}
	return members
}

func (pl *planner) addMember(pools map[string]map[poolKey]*Pool, m member) {
	n, owner := m.n, m.owner
	d, ok := pl.byName[owner]
	if !ok {
		return
	}
	pd := pl.out[owner]
	if m.leaving {
		pd.Leaving = append(pd.Leaving, n.Name)
	} else {
		pd.SelectedNodes = append(pd.SelectedNodes, n.Name)
	}
	osTag := n.Facts.OSTag
	if osTag == "" {
		if !m.leaving {
			pd.Skipped = append(pd.Skipped, Skipped{Node: n.Name, Reason: ReasonMissingOS})
		}
		return
	}
	kernel := ""
	if d.Spec.IsPrecompiled() {
		kernel = n.Facts.Kernel
		if kernel == "" {
			if !m.leaving {
				pd.Skipped = append(pd.Skipped, Skipped{Node: n.Name, Reason: ReasonMissingKernel})
			}
			return
		}
	}
	if pools[owner] == nil {
		pools[owner] = map[poolKey]*Pool{}
	}
	key := poolKey{osTag, kernel}
	pool := pools[owner][key]
	if pool == nil {
		pool = newPool(d, pd, osTag, osSelector(n.Labels, n.Facts.osVersionKey), kernel)
		pools[owner][key] = pool
	}
	pool.Nodes = append(pool.Nodes, n.Name)
	if m.leaving {
		pool.Leaving = append(pool.Leaving, n.Name)
	}
}

// newPool resolves a pool's images, DaemonSet name and pod nodeSelector; an
// image that cannot be resolved is the driver's InvalidSpec.
func newPool(d *v1alpha1.NVIDIADriver, pd *Driver, osTag string, osSel map[string]string, kernel string) *Pool {
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
	return &Pool{
		OSTag: osTag, Kernel: kernel, Image: img, Sidecars: sidecars, Nodes: []string{}, NodeSelector: sel,
		DaemonSet: DaemonSetName(d.Spec.Type(), osTag, string(d.UID), kernel),
	}
}

// blockConflicts blocks the drivers a conflict involves (or, under NVIDIA's
// rule, every driver).
func (pl *planner) blockConflicts() {
	anyConflict := false
	for _, d := range pl.live {
		pd := pl.out[d.Name]
		if len(pd.Conflicts) == 0 {
			continue
		}
		anyConflict = true
		if pd.Error == nil || pd.Error.Reason != ReasonConflictingDefault {
			pd.Error = &Problem{Reason: ReasonConflictingNodeSelector, Message: conflictMessage(pd)}
		}
	}
	if anyConflict && pl.opts.Rules == RulesGPUOperator {
		for i := range pl.p.Drivers {
			if pl.p.Drivers[i].Error == nil {
				pl.p.Drivers[i].Error = &Problem{Reason: ReasonConflictingNodeSelector,
					Message: "NVIDIA GPU Operator blocks every NVIDIADriver while any two select the same node"}
			}
		}
	}
}

// applyNVIDIAImageRule refuses, under NVIDIA's rules, what its operator refuses.
func (pl *planner) applyNVIDIAImageRule() {
	if pl.opts.Rules != RulesGPUOperator {
		return
	}
	for _, d := range pl.live {
		if pd := pl.out[d.Name]; pd.Error == nil {
			if msg := nvidiaImageRule(&d.Spec); msg != "" {
				pd.Error = &Problem{Reason: ReasonInvalidSpec, Message: "NVIDIA's GPU Operator refuses this NVIDIADriver: " + msg}
			}
		}
	}
}

func (pl *planner) warn() {
	for _, d := range pl.live {
		pd := pl.out[d.Name]
		if !d.Spec.IsPrecompiled() && v1alpha1.IsBranch(d.Spec.Version) {
			pd.Warnings = append(pd.Warnings, fmt.Sprintf(
				"spec.version %q is a driver branch: NVIDIA publishes no driver image tagged with a bare branch unless usePrecompiled is true; use a full version such as %s.104.12", d.Spec.Version, d.Spec.Version))
		}
		if len(pd.SelectedNodes) == 0 && pd.Error == nil && len(pd.Skipped) == 0 {
			pd.Warnings = append(pd.Warnings, "selects no GPU node")
		}
	}
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
