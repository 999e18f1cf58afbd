package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// AssignOptions holds the flags of `kubectl nvdriver assign`.
type AssignOptions struct {
	Flags       *genericclioptions.ConfigFlags
	Streams     streams
	Name        string
	Nodes       []string
	Selector    string
	Version     string
	Type        string
	Precompiled bool
	Repository  string
	Image       string
	LabelKey    string
	DryRun      string
	// PrintFlags are kubectl's -o (json, yaml, name, jsonpath=, go-template=…):
	// with one, stdout holds the resulting object alone.
	PrintFlags *genericclioptions.PrintFlags

	createOnlySet []string // create-only flags the user gave
}

// NewCmdAssign builds the assign command.
func NewCmdAssign(flags *genericclioptions.ConfigFlags, s streams) *cobra.Command {
	o := &AssignOptions{Flags: flags, Streams: s, LabelKey: "driver.config", DryRun: "none", Type: string(v1alpha1.GPU),
		PrintFlags: genericclioptions.NewPrintFlags("").WithTypeSetter(scheme)}
	cmd := &cobra.Command{
		Use:   "assign NAME (--nodes a,b | -l SELECTOR) [--version V]",
		Short: "Label nodes and create or update the NVIDIADriver that selects them, in one safe step",
		Long: `Assign labels the nodes <label-key>=NAME (driver.config by default, as in NVIDIA's
documentation) and creates or updates the NVIDIADriver NAME so that it selects that label.

It plans the change first and refuses, writing nothing, when it would make two
NVIDIADrivers select the same node (exit 3). It validates the NVIDIADriver with a server
dry run before touching any node, and puts the node labels back if writing the
NVIDIADriver fails. A node whose label had another value moves to NAME's driver.`,
		Example: `  # Run driver 550.90.07 on two nodes
  kubectl nvdriver assign gold --nodes gpu-node-1,gpu-node-3 --version 550.90.07

  # Precompiled drivers on every node of a pool, checked but not written
  kubectl nvdriver assign pc-535 -l pool=a100 --version 535 --precompiled --dry-run=server

  # Move one more node to an existing driver
  kubectl nvdriver assign gold --nodes gpu-node-5`,
		Args:              exactArgs(1, "NAME"),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			for _, f := range []string{"type", "precompiled", "repository", "image"} {
				if cmd.Flags().Changed(f) {
					o.createOnlySet = append(o.createOnlySet, "--"+f)
				}
			}
			if err := o.Validate(); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringSliceVar(&o.Nodes, "nodes", nil, "nodes to assign, comma separated (repeatable)")
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "label selector picking the nodes to assign")
	cmd.Flags().StringVar(&o.Version, "version", "", "driver version (required to create; a branch such as 535 with --precompiled)")
	cmd.Flags().StringVar(&o.Type, "type", o.Type, "driver type on create: gpu, vgpu or vgpu-host-manager")
	cmd.Flags().BoolVar(&o.Precompiled, "precompiled", false, "use precompiled driver images (on create)")
	cmd.Flags().StringVar(&o.Repository, "repository", "", "image repository on create (default nvcr.io/nvidia)")
	cmd.Flags().StringVar(&o.Image, "image", "", "image name on create (default driver)")
	cmd.Flags().StringVar(&o.LabelKey, "label-key", o.LabelKey, "node label that routes nodes to NAME")
	cmd.Flags().StringVar(&o.DryRun, "dry-run", o.DryRun, `"none", "client" (print what would change) or "server" (also validate every write on the server)`)
	cmd.Flags().Lookup("dry-run").NoOptDefVal = "client"
	o.PrintFlags.AddFlags(cmd)
	_ = cmd.RegisterFlagCompletionFunc("nodes", completeNodes(flags))
	_ = cmd.RegisterFlagCompletionFunc("type", fixedCompletion("gpu", "vgpu", "vgpu-host-manager"))
	_ = cmd.RegisterFlagCompletionFunc("dry-run", fixedCompletion("none", "client", "server"))
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion("yaml", "json"))
	return cmd
}

// Validate checks everything that needs no cluster.
func (o *AssignOptions) Validate() error {
	if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
		return fmt.Errorf("invalid NVIDIADriver name %q: %s", o.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(o.Name); len(errs) > 0 {
		return fmt.Errorf("NAME %q cannot be a node label value (%s): choose a name of at most 63 characters", o.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsQualifiedName(o.LabelKey); len(errs) > 0 {
		return fmt.Errorf("invalid --label-key %q: %s", o.LabelKey, strings.Join(errs, "; "))
	}
	if o.LabelKey == plan.LabelOwner || strings.HasPrefix(o.LabelKey, "nvidia.com/gpu") || strings.HasPrefix(o.LabelKey, "feature.node.kubernetes.io/") {
		return fmt.Errorf("--label-key %q is managed by the controller or NFD: use your own key, such as driver.config", o.LabelKey)
	}
	if (len(o.Nodes) == 0) == (o.Selector == "") {
		return fmt.Errorf("give exactly one of --nodes or -l/--selector")
	}
	for _, n := range o.Nodes {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return fmt.Errorf("invalid node name %q in --nodes", n)
		}
	}
	if o.Selector != "" {
		if _, err := labels.Parse(o.Selector); err != nil {
			return fmt.Errorf("invalid --selector: %v", err)
		}
	}
	if err := oneOf("--type", o.Type, "gpu", "vgpu", "vgpu-host-manager"); err != nil {
		return err
	}
	if err := oneOf("--dry-run", o.DryRun, "none", "client", "server"); err != nil {
		return err
	}
	if o.output() != "" {
		if _, err := o.PrintFlags.ToPrinter(); err != nil {
			return err
		}
	}
	if o.Version != "" {
		if err := validateVersion(o.Version, o.Precompiled); err != nil {
			return err
		}
	}
	return nil
}

// validateVersion is the version check the plugin makes before any request:
// admission's rule (v1alpha1.ValidateVersion, the same as the CRD's CEL rule)
// plus the versions that are valid tags but name no image NVIDIA publishes.
func validateVersion(v string, precompiled bool) error {
	return v1alpha1.CheckVersionIntent(v, precompiled)
}

type nodeChange struct {
	name     string
	previous *string // previous value of the label key, nil if absent
}

// Run plans, validates, then writes: labels first, the CR second, labels
// restored if the CR write fails. A run that would change nothing writes
// nothing and says "unchanged".
func (o *AssignOptions) Run(ctx context.Context) error {
	c, in, err := connectAndRead(ctx, o.Flags)
	if err != nil {
		return err
	}
	var existing *v1alpha1.NVIDIADriver
	for i := range in.drivers {
		if in.drivers[i].Name == o.Name {
			existing = &in.drivers[i]
		}
	}
	desired, err := o.desiredDriver(existing)
	if err != nil {
		return err
	}
	targets, err := o.targetNodes(in.nodes)
	if err != nil {
		return err
	}
	if err := o.refuseConflicts(in, targets, desired); err != nil {
		return err
	}

	changes := o.labelChanges(targets)
	specChanged := existing == nil || !apiequality.Semantic.DeepEqual(existing.Spec, desired.Spec)
	labelsChanged := false
	for _, ch := range changes {
		labelsChanged = labelsChanged || ch.previous == nil || *ch.previous != o.Name
	}
	if !specChanged && !labelsChanged {
		o.report(changes, "unchanged", "")
		return o.printDriver(existing)
	}

	body, err := o.applyBody(desired, existing)
	if err != nil {
		return err
	}
	// Server-side validation of the CR before any node is touched.
	if o.DryRun != "client" && specChanged {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(body.DeepCopy()), client.FieldOwner(FieldManager), client.ForceOwnership, client.DryRunAll); err != nil {
			return fmt.Errorf("the API server rejects NVIDIADriver %q (nothing was changed): %v", o.Name, err)
		}
	}
	action := map[bool]string{true: "configured", false: "created"}[existing != nil]
	if !specChanged {
		action = "unchanged"
	}
	verb := map[bool]string{true: "would be ", false: ""}[o.DryRun != "none" && specChanged]
	suffix := dryRunSuffix(o.DryRun)
	if o.DryRun == "client" {
		o.report(changes, verb+action, suffix)
		return o.printDriver(desired)
	}
	done, err := o.applyLabels(ctx, c, changes, o.DryRun == "server")
	if err != nil {
		o.rollback(ctx, c, done)
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted while labelling nodes; labels restored, nothing was changed")
		}
		return fmt.Errorf("labelling nodes failed, labels restored: %w", err)
	}
	result := existing
	if specChanged {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(body), applyOpts(o.DryRun)...); err != nil {
			o.rollback(ctx, c, done)
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted before NVIDIADriver %q was written; node labels restored", o.Name)
			}
			return fmt.Errorf("writing NVIDIADriver %q failed, node labels restored: %w", o.Name, err)
		}
		result = &v1alpha1.NVIDIADriver{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(body.Object, result); err != nil {
			return err
		}
	}
	o.report(changes, verb+action, suffix)
	return o.printDriver(result)
}

// refuseConflicts plans the cluster before and after the change and refuses
// one that makes a node selected by two NVIDIADrivers; it warns about target
// nodes that will be labelled but get no driver from NAME.
func (o *AssignOptions) refuseConflicts(in *inputs, targets []plan.Node, desired *v1alpha1.NVIDIADriver) error {
	before := plan.Compute(in.nodes, in.drivers)
	after := plan.Compute(withLabel(in.nodes, targets, o.LabelKey, o.Name), replaceDriver(in.drivers, *desired))
	if newC := plan.NewConflicts(before, after); len(newC) > 0 {
		// The webhook's denial in the same words (plan.OverlapMessage), then
		// every node with the drivers that would select it.
		fmt.Fprintf(o.Streams.ErrOut, "error: %s; nothing was changed:\n", plan.OverlapMessage(o.Name, newC))
		for _, c := range newC {
			fmt.Fprintf(o.Streams.ErrOut, "  %s: selected by %s\n", c.Node, strings.Join(c.Drivers, ", "))
		}
		return &FindingsError{Msg: "conflict"}
	}
	owned := map[string]bool{}
	if afterDriver := after.DriverByName(o.Name); afterDriver != nil {
		for _, n := range afterDriver.SelectedNodes {
			owned[n] = true
		}
		for _, s := range afterDriver.Skipped {
			fmt.Fprintf(o.Streams.ErrOut, "warning: node %s will not run this driver: %s (%s)\n", s.Node, s.Reason, skipHint(s.Reason))
			owned[s.Node] = true
		}
	}
	for _, t := range targets {
		switch {
		case owned[t.Name]:
		case !plan.IsGPUNode(t.Labels):
			fmt.Fprintf(o.Streams.ErrOut, "warning: node %s is not a GPU node (no nvidia.com/gpu.present=true nor NFD NVIDIA PCI label); it is labelled but gets no driver\n", t.Name)
		default:
			fmt.Fprintf(o.Streams.ErrOut, "warning: node %s does not match the rest of NVIDIADriver %q's nodeSelector; it is labelled but gets no driver from it\n", t.Name, o.Name)
		}
	}
	return nil
}

// applyOpts are the options of the plugin's server-side apply: our field
// manager, forced (assign's fields are the plugin's), and the dry run asked for.
func applyOpts(dryRun string) []client.ApplyOption {
	opts := []client.ApplyOption{client.FieldOwner(FieldManager), client.ForceOwnership}
	if dryRun == "server" {
		opts = append(opts, client.DryRunAll)
	}
	return opts
}

// desiredDriver is the NVIDIADriver as it will be after the command: the
// client dry run prints it, and the server's answer must equal it.
func (o *AssignOptions) desiredDriver(existing *v1alpha1.NVIDIADriver) (*v1alpha1.NVIDIADriver, error) {
	if existing == nil {
		if o.Version == "" {
			return nil, fmt.Errorf("NVIDIADriver %q does not exist: --version is required to create it", o.Name)
		}
		repository, image := createImage(o.Repository, o.Image)
		d := &v1alpha1.NVIDIADriver{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NVIDIADriver"},
			ObjectMeta: metav1.ObjectMeta{Name: o.Name},
			Spec: v1alpha1.NVIDIADriverSpec{DriverType: v1alpha1.DriverType(o.Type), Version: o.Version,
				Repository: repository, Image: image, NodeSelector: map[string]string{o.LabelKey: o.Name}},
		}
		if o.Precompiled {
			t := true
			d.Spec.UsePrecompiled = &t
		}
		defaultSpec(&d.Spec)
		return d, nil
	}
	if len(o.createOnlySet) > 0 {
		return nil, fmt.Errorf("NVIDIADriver %q exists: %s apply only when creating (driverType and usePrecompiled are immutable); edit the CR or create another one", o.Name, strings.Join(o.createOnlySet, ", "))
	}
	if existing.Spec.Default {
		return nil, fmt.Errorf("NVIDIADriver %q is the default (it covers the nodes no other driver selects) and takes no nodeSelector: assign nodes to a non-default NVIDIADriver", o.Name)
	}
	if !existing.DeletionTimestamp.IsZero() {
		return nil, fmt.Errorf("NVIDIADriver %q is being deleted", o.Name)
	}
	if o.Version != "" {
		if err := validateVersion(o.Version, existing.Spec.IsPrecompiled()); err != nil {
			return nil, err
		}
	}
	d := existing.DeepCopy()
	d.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "NVIDIADriver"}
	if d.Spec.NodeSelector == nil {
		d.Spec.NodeSelector = map[string]string{}
	}
	for k, v := range d.Spec.NodeSelector {
		if k != o.LabelKey {
			fmt.Fprintf(o.Streams.ErrOut, "warning: NVIDIADriver %q also selects %s=%s; assigned nodes need that label too\n", o.Name, k, v)
		}
	}
	d.Spec.NodeSelector[o.LabelKey] = o.Name
	if o.Version != "" {
		d.Spec.Version = o.Version
	}
	return d, nil
}

// createImage spells out the repository and image a new NVIDIADriver gets.
// NVIDIA's operator refuses a CR with a version but no repository ("repository,
// image and version must all be set"), so both are always written, and a
// full-path --image is split into the two.
func createImage(repository, image string) (string, string) {
	if image == "" {
		image = plan.DefaultImage
	}
	if repository == "" {
		if i := strings.LastIndex(image, "/"); i > 0 {
			return image[:i], image[i+1:]
		}
		repository = plan.DefaultRepository
	}
	return repository, image
}

func (o *AssignOptions) targetNodes(nodes []plan.Node) ([]plan.Node, error) {
	var out []plan.Node
	if o.Selector != "" {
		sel, _ := labels.Parse(o.Selector)
		for _, n := range nodes {
			if sel.Matches(labels.Set(n.Labels)) {
				out = append(out, n)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no node matches --selector %q", o.Selector)
		}
		return out, nil
	}
	byName := map[string]plan.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	var missing []string
	seen := map[string]bool{}
	for _, name := range o.Nodes {
		if seen[name] {
			continue
		}
		seen[name] = true
		n, ok := byName[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		out = append(out, n)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("node(s) not found: %s (nothing was changed)", strings.Join(missing, ", "))
	}
	return out, nil
}

func withLabel(nodes []plan.Node, targets []plan.Node, key, value string) []plan.Node {
	t := map[string]bool{}
	for _, n := range targets {
		t[n.Name] = true
	}
	out := make([]plan.Node, len(nodes))
	for i, n := range nodes {
		out[i] = n
		if t[n.Name] {
			l := make(map[string]string, len(n.Labels)+1)
			for k, v := range n.Labels {
				l[k] = v
			}
			l[key] = value
			out[i].Labels = l
		}
	}
	return out
}

func replaceDriver(drivers []v1alpha1.NVIDIADriver, d v1alpha1.NVIDIADriver) []v1alpha1.NVIDIADriver {
	out := make([]v1alpha1.NVIDIADriver, 0, len(drivers)+1)
	found := false
	for _, x := range drivers {
		if x.Name == d.Name {
			out = append(out, d)
			found = true
			continue
		}
		out = append(out, x)
	}
	if !found {
		out = append(out, d)
	}
	return out
}

// report says what happened. With -o the object alone goes to stdout (as
// kubectl apply -o json does), so progress goes to stderr.
func (o *AssignOptions) report(changes []nodeChange, action, suffix string) {
	w := o.Streams.Out
	if o.output() != "" {
		w = o.Streams.ErrOut
	}
	verb := ""
	if o.DryRun != "none" {
		verb = "would be "
	}
	for _, ch := range changes {
		switch {
		case ch.previous == nil:
			fmt.Fprintf(w, "node/%s %slabelled %s=%s%s\n", ch.name, verb, o.LabelKey, o.Name, suffix)
		case *ch.previous == o.Name:
			fmt.Fprintf(w, "node/%s unchanged (already %s=%s)\n", ch.name, o.LabelKey, o.Name)
		default:
			fmt.Fprintf(w, "node/%s %smoved from %s=%s to %s=%s%s\n", ch.name, verb, o.LabelKey, *ch.previous, o.LabelKey, o.Name, suffix)
		}
	}
	if action == "unchanged" {
		suffix = ""
	}
	fmt.Fprintf(w, "nvidiadriver.nvidia.com/%s %s%s\n", o.Name, action, suffix)
}

func (o *AssignOptions) printDriver(d *v1alpha1.NVIDIADriver) error {
	if o.output() == "" {
		return nil
	}
	d = d.DeepCopy()
	d.ManagedFields = nil
	p, err := o.PrintFlags.ToPrinter()
	if err != nil {
		return err
	}
	return p.PrintObj(d, o.Streams.Out)
}

// output is the -o format, "" for the human report.
func (o *AssignOptions) output() string {
	if o.PrintFlags.OutputFormat == nil {
		return ""
	}
	return *o.PrintFlags.OutputFormat
}

// completeNodes completes the names of GPU nodes (the only ones a driver
// can be assigned to or upgraded on).
func completeNodes(flags *genericclioptions.ConfigFlags) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		c, _, err := clientFor(flags)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
		if err := c.List(cmd.Context(), list); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range list.Items {
			if strings.HasPrefix(n.Name, prefix) && plan.IsGPUNode(n.Labels) {
				out = append(out, n.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
