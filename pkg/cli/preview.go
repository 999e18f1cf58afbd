package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// pendingHash stands for the DaemonSet name hash of a CR not created yet:
// NVIDIA's scheme hashes the CR's UID, which the API server assigns.
const pendingHash = "<uid-hash>"

// PreviewOptions holds the flags of `kubectl nvdriver preview`.
type PreviewOptions struct {
	Flags     *genericclioptions.ConfigFlags
	Streams   streams
	NoColor   *bool
	Names     []string
	Filenames []string
	Recursive bool
	Output    string
	Rules     string
	// CheckImages asks the registries whether each pool's images exist.
	CheckImages bool
}

// NewCmdPreview builds the preview command.
func NewCmdPreview(flags *genericclioptions.ConfigFlags, s streams, noColor *bool) *cobra.Command {
	o := &PreviewOptions{Flags: flags, Streams: s, NoColor: noColor, Output: "table", Rules: "auto", CheckImages: true}
	cmd := &cobra.Command{
		Use:   "preview [NAME...] [-f FILE|DIR|-]",
		Short: "Show which nodes each NVIDIADriver selects, its DaemonSets, images and conflicts",
		Long: `Preview computes the plan the controller follows (the same code) for the NVIDIADrivers
in the cluster, with the ones in -f files added or replacing those of the same name,
so you see what a manifest will do before you apply it. It only reads.

It also asks each image's registry, from this machine (your docker credentials plus the
CR's pull Secrets when you may read them), whether the image exists: the REGISTRY column
says ok, missing or unknown, and for a precompiled driver a section lists every kernel the
GPU nodes run and whether an image exists for it. --check-images=false skips this.

Exit status: 0 nothing found, 3 a conflict or a missing image, 1 an error.`,
		Example: `  # What the cluster's NVIDIADrivers select now
  kubectl nvdriver preview

  # What applying a manifest would change, node names included
  kubectl nvdriver preview -f nvd-driver-multiple.yaml -o wide

  # One driver, as JSON for scripts
  kubectl nvdriver preview demo-gold -o json`,
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Names = args
			if err := o.Validate(); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringArrayVarP(&o.Filenames, "filename", "f", nil, "NVIDIADriver manifests to add to the plan (file, directory, URL or - for stdin; repeatable)")
	cmd.Flags().BoolVarP(&o.Recursive, "recursive", "R", false, "read the directories given with -f recursively")
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table, wide, json or yaml")
	cmd.Flags().BoolVar(&o.CheckImages, "check-images", o.CheckImages, "ask each image's registry whether the image exists (HEAD of the manifest)")
	cmd.Flags().StringVar(&o.Rules, "rules", o.Rules, "conflict rule: auto (detect NVIDIA's GPU Operator), nvdriver (conflicts block only the CRs involved) or gpu-operator (any conflict blocks all)")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion("table", "wide", "json", "yaml"))
	_ = cmd.RegisterFlagCompletionFunc("rules", fixedCompletion("auto", "nvdriver", "gpu-operator"))
	return cmd
}

// Validate rejects bad flags before anything is read.
func (o *PreviewOptions) Validate() error {
	if err := oneOf("--output", o.Output, "table", "wide", "json", "yaml"); err != nil {
		return err
	}
	return oneOf("--rules", o.Rules, "auto", plan.RulesNVDriver, plan.RulesGPUOperator)
}

// Run prints the plan.
func (o *PreviewOptions) Run(ctx context.Context) error {
	fromFiles, err := readDriverFiles(o.Flags, o.Filenames, o.Recursive, o.Streams.In)
	if err != nil {
		return err
	}
	c, in, err := connectAndRead(ctx, o.Flags)
	if err != nil {
		return err
	}
	drivers, added := mergeDrivers(in.drivers, fromFiles)
	rules := o.Rules
	if rules == "auto" {
		var why string
		rules, why, err = detectRules(ctx, c, in.drivers)
		if err != nil {
			return err
		}
		if rules == plan.RulesGPUOperator {
			fmt.Fprintf(o.Streams.ErrOut, "note: %s; applying its rule: a conflict anywhere blocks every NVIDIADriver (use --rules nvdriver to see ours)\n", why)
		}
	}
	p := plan.ComputeWith(in.nodes, drivers, plan.Options{Rules: rules})
	for name := range added {
		if d := p.DriverByName(name); d != nil {
			for i := range d.Pools {
				d.Pools[i].DaemonSet = pendingName(d.Pools[i].DaemonSet)
			}
		}
	}
	markChanges(&p, in, fromFiles, added)
	if len(o.Names) > 0 {
		if err := filterPlan(&p, o.Names); err != nil {
			return err
		}
	}
	var missing []string
	if o.CheckImages {
		missing = newPlanImages(c, namespaceFlag(o.Flags)).check(ctx, &p, drivers, in.nodes)
	}
	if err := o.print(p, in.daemonSets); err != nil {
		return err
	}
	return previewFindings(p.HasConflicts(), missing)
}

// markChanges says, for each pool of a CR given in a file that exists in
// the cluster, whether the change is disruptive or restart-only (the same
// config digest rule as the controller's).
func markChanges(p *plan.Plan, in *inputs, files []v1alpha1.NVIDIADriver, added map[string]bool) {
	stored := map[string]*v1alpha1.NVIDIADriver{}
	for i := range in.drivers {
		stored[in.drivers[i].Name] = &in.drivers[i]
	}
	for i := range files {
		f := &files[i]
		from, ok := stored[f.Name]
		if !ok || added[f.Name] {
			continue
		}
		d := p.DriverByName(f.Name)
		if d == nil {
			continue
		}
		kinds := map[string]string{}
		for _, im := range poolImpacts(in.nodes, in.drivers, from, f) {
			kinds[im.pool.OSTag+"/"+im.pool.Kernel] = im.kind
		}
		for j := range d.Pools {
			d.Pools[j].Change = kinds[d.Pools[j].OSTag+"/"+d.Pools[j].Kernel]
		}
	}
}

// previewFindings is preview's exit status 3 and its reason.
func previewFindings(conflicts bool, missing []string) error {
	var why []string
	if conflicts {
		why = append(why, "conflicts")
	}
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("%d image(s) missing from the registry: %s", len(missing), strings.Join(missing, ", ")))
	}
	if len(why) == 0 {
		return nil
	}
	return &FindingsError{Msg: strings.Join(why, "; ")}
}

// mergeDrivers adds file CRs to the cluster's, replacing same-named ones
// (keeping the cluster UID, so DaemonSet names stay exact). It returns the
// names of CRs that do not exist yet.
func mergeDrivers(cluster, files []v1alpha1.NVIDIADriver) ([]v1alpha1.NVIDIADriver, map[string]bool) {
	byName := map[string]int{}
	out := append([]v1alpha1.NVIDIADriver(nil), cluster...)
	for i := range out {
		byName[out[i].Name] = i
	}
	added := map[string]bool{}
	for _, f := range files {
		if i, ok := byName[f.Name]; ok {
			f.UID = out[i].UID
			f.CreationTimestamp = out[i].CreationTimestamp
			f.DeletionTimestamp = nil
			out[i] = f
			continue
		}
		f.UID = types.UID("")
		byName[f.Name] = len(out)
		out = append(out, f)
		added[f.Name] = true
	}
	return out, added
}

func pendingName(name string) string {
	if i := strings.LastIndex(name, "-"); i > 0 {
		return name[:i+1] + pendingHash
	}
	return name
}

// gpuOperatorManages tells whether NVIDIA's operator runs these CRs: it sets a
// status but never our finalizer or observedGeneration.
func gpuOperatorManages(drivers []v1alpha1.NVIDIADriver) bool {
	for _, d := range drivers {
		if d.Status.State == "" {
			continue
		}
		ours := d.Status.ObservedGeneration != 0
		for _, f := range d.Finalizers {
			if f == v1alpha1.Finalizer {
				ours = true
			}
		}
		if !ours {
			return true
		}
	}
	return false
}

// detectRules is the one place that chooses the conflict rule for "auto"
// (preview and doctor both call it): NVIDIA's when its operator keeps the
// CRs' status, or, before any CR has one, when a ClusterPolicy that hands
// drivers to NVIDIADrivers exists (NVIDIA's operator does nothing without
// one). It costs one LIST, only when the CRs did not already tell.
func detectRules(ctx context.Context, c client.Reader, drivers []v1alpha1.NVIDIADriver) (rules, why string, err error) {
	if gpuOperatorManages(drivers) {
		return plan.RulesGPUOperator, "NVIDIA's GPU Operator manages these NVIDIADrivers", nil
	}
	cps, err := listClusterPolicies(ctx, c)
	if err != nil {
		return "", "", err
	}
	for _, cp := range cps {
		if useCRD, _, _ := unstructured.NestedBool(cp.Object, "spec", "driver", "useNvidiaDriverCRD"); useCRD {
			return plan.RulesGPUOperator, "NVIDIA's GPU Operator is installed (ClusterPolicy " + cp.GetName() + " hands drivers to NVIDIADrivers)", nil
		}
	}
	return plan.RulesNVDriver, "", nil
}

// listClusterPolicies lists NVIDIA's ClusterPolicies; none when NVIDIA's
// operator (its CRD) is not installed or the user may not read them.
func listClusterPolicies(ctx context.Context, c client.Reader) ([]unstructured.Unstructured, error) {
	cps := &unstructured.UnstructuredList{}
	cps.SetGroupVersionKind(ClusterPolicyGVK.GroupVersion().WithKind("ClusterPolicyList"))
	if err := c.List(ctx, cps); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) || apierrors.IsForbidden(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	return cps.Items, nil
}

func filterPlan(p *plan.Plan, names []string) error {
	keep := map[string]bool{}
	for _, n := range names {
		if p.DriverByName(n) == nil {
			return fmt.Errorf("NVIDIADriver %q not found (in the cluster or the -f files)", n)
		}
		keep[n] = true
	}
	var out []plan.Driver
	for _, d := range p.Drivers {
		if keep[d.Name] {
			out = append(out, d)
		}
	}
	p.Drivers = out
	return nil
}

func (o *PreviewOptions) print(p plan.Plan, dss []appsv1.DaemonSet) error {
	w := o.Streams.Out
	switch o.Output {
	case "json":
		return output.JSON(w, p)
	case "yaml":
		return output.YAML(w, p)
	}
	return PrintPlanTable(w, p, dss, o.Output == "wide", output.NewStyles(w, *o.NoColor))
}

// PrintPlanTable renders a plan for people: one row per pool, then
// conflicts, pending moves, skipped nodes, warnings and uncovered GPU nodes.
func PrintPlanTable(w interface{ Write([]byte) (int, error) }, p plan.Plan, dss []appsv1.DaemonSet, wide bool, st *output.Styles) error {
	headers := []string{"driver", "type", "nodes", "pool", "daemonset", "image", "change"}
	checked := planChecked(p)
	if checked {
		headers = []string{"driver", "type", "nodes", "pool", "daemonset", "image", "registry", "change"}
	}
	if wide {
		headers = append(headers, "node names")
	}
	existing := liveImages(dss)
	var rows [][]string
	for _, d := range p.Drivers {
		rows = append(rows, driverRows(d, p.Owner, existing, wide, checked, st)...)
	}
	if err := output.Table(w, headers, rows); err != nil {
		return err
	}
	return printPlanSections(w, p, st)
}

// liveImages maps a DaemonSet name to the images its containers run (driver
// and sidecars), so a changed GDS or GDRCopy image shows as the roll it is.
func liveImages(dss []appsv1.DaemonSet) map[string]string {
	existing := map[string]string{}
	for _, ds := range dss {
		var imgs []string
		for _, c := range ds.Spec.Template.Spec.Containers {
			imgs = append(imgs, c.Image)
		}
		slices.Sort(imgs)
		existing[ds.Name] = strings.Join(slices.Compact(imgs), " ")
	}
	return existing
}

// driverRows are a driver's table rows: one per pool, or one saying it has none.
func driverRows(d plan.Driver, owner map[string]string, existing map[string]string, wide, checked bool, st *output.Styles) [][]string {
	name := d.Name
	if d.Default {
		name += " (default)"
	}
	if len(d.Pools) == 0 {
		state := "-"
		if d.Error != nil {
			state = st.Bad(d.Error.Reason)
		}
		row := []string{name, string(d.DriverType), nodeCount(d), "<none>", "-", "-", state}
		if checked {
			row = slices.Insert(row, 6, "-")
		}
		if wide {
			row = append(row, "-")
		}
		return [][]string{row}
	}
	var rows [][]string
	for i, pool := range d.Pools {
		poolName := pool.OSTag
		if pool.Kernel != "" {
			poolName += "/" + pool.Kernel
		}
		first := []string{name, string(d.DriverType), nodeCount(d)}
		if i > 0 {
			first = []string{"", "", ""}
		}
		row := append(first, poolName, pool.DaemonSet, pool.Image)
		if checked {
			row = append(row, poolRegistry(pool, st))
		}
		row = append(row, poolChange(d, pool, owner, existing, st))
		if wide {
			row = append(row, poolNodeNames(pool, owner))
		}
		rows = append(rows, row)
	}
	return rows
}

// poolChange is what applying the plan does to a pool's DaemonSet.
func poolChange(d plan.Driver, pool plan.Pool, owner map[string]string, existing map[string]string, st *output.Styles) string {
	if d.Error != nil {
		return st.Bad("blocked: " + d.Error.Reason)
	}
	change := "unchanged"
	switch cur, ok := existing[pool.DaemonSet]; {
	case !ok:
		change = st.OK("create")
	case cur != strings.Join(pool.Images(), " ") || pool.Change == ChangeDisruptive:
		change = st.Warn("update (rolls nodes)")
	case pool.Change == ChangeRestartOnly:
		change = st.Warn("update (restart-only: driver pods restart in place, GPU jobs stay)")
	}
	if len(pool.Leaving) > 0 {
		losing := "losing " + leavingSummary(pool.Leaving, owner)
		if change == "unchanged" {
			return st.Warn(losing)
		}
		change += "; " + st.Warn(losing)
	}
	return change
}

// printPlanSections prints what the pool table does not show, each section
// only when it has rows.
func printPlanSections(w interface{ Write([]byte) (int, error) }, p plan.Plan, st *output.Styles) error {
	var skipped, conflicts, warnings, moves [][]string
	seenConflict := map[string]bool{}
	for _, d := range p.Drivers {
		for _, s := range d.Skipped {
			skipped = append(skipped, []string{s.Node, d.Name, s.Reason, skipHint(s.Reason)})
		}
		for _, c := range d.Conflicts {
			if !seenConflict[c.Node] {
				seenConflict[c.Node] = true
				conflicts = append(conflicts, []string{c.Node, strings.Join(c.Drivers, ", ")})
			}
		}
		for _, wmsg := range d.Warnings {
			warnings = append(warnings, []string{d.Name, wmsg})
		}
		for _, n := range d.Leaving {
			to := p.Owner[n]
			if to == "" {
				to = "<none>"
			}
			moves = append(moves, []string{n, d.Name, to})
		}
	}
	sections := []planSection{
		{title: st.Bad(fmt.Sprintf("Conflicts (%d node(s)): each node must be selected by one NVIDIADriver", len(conflicts))), headers: []string{"node", "selected by"}, rows: conflicts},
		{title: st.Warn(fmt.Sprintf("Pending moves (%d node(s)): each is cordoned and emptied of GPU pods before its driver changes", len(moves))), headers: []string{"node", "from", "to"}, rows: moves},
		{title: fmt.Sprintf("Skipped nodes (%d)", len(skipped)), headers: []string{"node", "driver", "reason", "why"}, rows: skipped},
		{title: st.Warn("Warnings"), headers: []string{"driver", "warning"}, rows: warnings},
	}
	for _, sec := range append(sections, imageSections(p, st)...) {
		if err := sec.print(w); err != nil {
			return err
		}
	}
	if len(p.Uncovered) > 0 {
		fmt.Fprintf(w, "\n%s %s\n", st.Warn(fmt.Sprintf("GPU nodes no NVIDIADriver covers (%d):", len(p.Uncovered))), strings.Join(p.Uncovered, ", "))
	}
	return nil
}

// planSection is one titled table after the pool table, printed only when
// it has rows (sorted by the first column unless keepOrder).
type planSection struct {
	title     string
	headers   []string
	rows      [][]string
	keepOrder bool
}

func (sec planSection) print(w interface{ Write([]byte) (int, error) }) error {
	if len(sec.rows) == 0 {
		return nil
	}
	if !sec.keepOrder {
		sort.SliceStable(sec.rows, func(i, j int) bool { return sec.rows[i][0] < sec.rows[j][0] })
	}
	fmt.Fprintf(w, "\n%s\n", sec.title)
	return output.Table(w, sec.headers, sec.rows)
}

// nodeCount is the NODES column: the nodes the driver will own, and the
// ones it still serves on their way out.
func nodeCount(d plan.Driver) string {
	if len(d.Leaving) == 0 {
		return fmt.Sprint(len(d.SelectedNodes))
	}
	return fmt.Sprintf("%d (+%d leaving)", len(d.SelectedNodes), len(d.Leaving))
}

// leavingSummary says where leaving nodes go: "2 node(s) to default".
func leavingSummary(leaving []string, owner map[string]string) string {
	byDest := map[string]int{}
	for _, n := range leaving {
		to := owner[n]
		if to == "" {
			to = "no driver"
		}
		byDest[to]++
	}
	dests := make([]string, 0, len(byDest))
	for d := range byDest {
		dests = append(dests, d)
	}
	sort.Strings(dests)
	parts := make([]string, len(dests))
	for i, d := range dests {
		parts[i] = fmt.Sprintf("%d node(s) to %s", byDest[d], d)
	}
	return strings.Join(parts, ", ")
}

func poolNodeNames(pool plan.Pool, owner map[string]string) string {
	leaving := map[string]bool{}
	for _, n := range pool.Leaving {
		leaving[n] = true
	}
	names := make([]string, len(pool.Nodes))
	for i, n := range pool.Nodes {
		names[i] = n
		if leaving[n] {
			to := owner[n]
			if to == "" {
				to = "no driver"
			}
			names[i] = n + " (leaving to " + to + ")"
		}
	}
	return strings.Join(names, ",")
}

func skipHint(reason string) string {
	switch reason {
	case plan.ReasonPreInstalled:
		return "driver installed on the host (nvidia.com/gpu.deploy.driver=pre-installed)"
	case plan.ReasonDisabled:
		return "nvidia.com/gpu.deploy.driver=false"
	case plan.ReasonMissingOS:
		return "no NFD system-os_release labels: is node-feature-discovery running there?"
	case plan.ReasonMissingKernel:
		return "no NFD kernel-version.full label (needed for precompiled drivers)"
	}
	return ""
}

func oneOf(flag, value string, allowed ...string) error {
	for _, a := range allowed {
		if value == a {
			return nil
		}
	}
	return fmt.Errorf("invalid %s %q: use one of %s", flag, value, strings.Join(allowed, ", "))
}
