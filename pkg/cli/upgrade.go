package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// UpgradeOptions holds the flags of `kubectl nvdriver upgrade`.
type UpgradeOptions struct {
	Flags    *genericclioptions.ConfigFlags
	Streams  streams
	NoColor  *bool
	Name     string
	To       string
	Version  string // --version, the same as --to (one name for one idea across verbs)
	Nodes    []string
	Wait     bool
	Timeout  time.Duration
	DryRun   string
	Interval time.Duration
	// CheckImages asks the registry whether the new version's images exist.
	CheckImages bool
}

// NewCmdUpgrade builds the upgrade command.
func NewCmdUpgrade(flags *genericclioptions.ConfigFlags, s streams, noColor *bool) *cobra.Command {
	o := &UpgradeOptions{Flags: flags, Streams: s, NoColor: noColor, Timeout: 30 * time.Minute, DryRun: "none", Interval: 2 * time.Second, CheckImages: true}
	cmd := &cobra.Command{
		Use:   "upgrade NAME (--to VERSION | --nodes a,b) [--wait]",
		Short: "Change an NVIDIADriver's version (or request single nodes) and follow the rollout",
		Long: `Upgrade patches spec.version of the NVIDIADriver (validated by a server dry run first);
the controller then rolls the nodes one budget at a time: cordon, wait for or evict GPU
pods, restart the driver, validate, uncordon. With --nodes it requests those nodes only
(annotation nvidia.com/gpu-driver-upgrade-requested=true, for autoUpgrade: false); a
requested node restarts its driver even when it already runs the current one.

With --wait it follows exactly what was asked: with --nodes, until those nodes run the
current driver; otherwise until every node of the NVIDIADriver does and its DaemonSets
are up to date (with autoUpgrade: false, until the DaemonSets carry the new version:
nodes then roll only when requested). It works with the nvdriver controller and with
NVIDIA's GPU Operator.

With --dry-run and --to it also prints what the change would do: per pool whether it is
disruptive (the driver's install changes: cordon, evict, restart, validate) or
restart-only, and per node the GPU pods that would be evicted and what would hold the
node (a PodDisruptionBudget allowing no disruption now, a pod the policy may not remove,
a job waitForCompletion waits for).

With --to it first asks the registry, from this machine, whether the new version's image
exists for each pool (--check-images=false skips this): a missing image is a warning (the
controller holds that pool until the image exists), and with --dry-run exit status 3.

Exit status: 0 done, 3 a node ended upgrade-failed (or, with --dry-run, an image is
missing), 1 error, timeout or interrupt (the rollout goes on in the cluster).`,
		Example: `  kubectl nvdriver upgrade demo-silver --to 525.125.06 --wait
  kubectl nvdriver upgrade demo-gold --nodes gpu-node-3 --wait --timeout 1h
  kubectl nvdriver upgrade demo-gold --to 550.90.07 --dry-run=server`,
		Args:              exactArgs(1, "NAME"),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.To, "to", "", "new driver version")
	cmd.Flags().StringVar(&o.Version, "version", "", "new driver version (the same as --to)")
	cmd.Flags().StringSliceVar(&o.Nodes, "nodes", nil, "request the upgrade of these nodes only (comma separated, repeatable)")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "follow the rollout until what was asked is done")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "give up waiting after this long (with --wait)")
	cmd.Flags().StringVar(&o.DryRun, "dry-run", o.DryRun, `"none", "client" or "server"`)
	cmd.Flags().BoolVar(&o.CheckImages, "check-images", o.CheckImages, "with --to, ask the registry whether the new version's images exist")
	cmd.Flags().Lookup("dry-run").NoOptDefVal = "client"
	_ = cmd.RegisterFlagCompletionFunc("nodes", completeNodes(flags))
	_ = cmd.RegisterFlagCompletionFunc("dry-run", fixedCompletion("none", "client", "server"))
	return cmd
}

// Complete folds --version into --to.
func (o *UpgradeOptions) Complete() error {
	if o.Version != "" {
		if o.To != "" && o.To != o.Version {
			return usageErrorf("--to %s and --version %s disagree: give one of them", o.To, o.Version)
		}
		o.To = o.Version
	}
	return nil
}

// Validate checks the flags.
func (o *UpgradeOptions) Validate() error {
	if o.To == "" && len(o.Nodes) == 0 {
		return usageErrorf("give --to VERSION, --nodes, or both")
	}
	if o.Timeout <= 0 {
		return usageErrorf("invalid --timeout %s: must be positive", o.Timeout)
	}
	if o.Wait && o.DryRun != "none" {
		return usageErrorf("--wait cannot follow a dry run")
	}
	return oneOf("--dry-run", o.DryRun, "none", "client", "server")
}

// Run patches, requests and optionally waits.
func (o *UpgradeOptions) Run(ctx context.Context) error {
	c, _, err := clientFor(o.Flags)
	if err != nil {
		return err
	}
	d := &v1alpha1.NVIDIADriver{}
	if err := c.Get(ctx, client.ObjectKey{Name: o.Name}, d); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("NVIDIADriver %q not found", o.Name)
		}
		return err
	}
	if o.To != "" {
		if err := validateVersion(o.To, d.Spec.IsPrecompiled()); err != nil {
			return err
		}
	}
	var nodes []corev1.Node
	if len(o.Nodes) > 0 {
		if nodes, err = o.requestedNodes(ctx, c); err != nil {
			return err
		}
	}
	suffix := dryRunSuffix(o.DryRun)
	versionChanged := false
	if o.To != "" {
		if o.To == d.Spec.Version {
			fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s unchanged (already at version %s)\n", o.Name, o.To)
			// Run again on a held rollout, it says again why it is held.
			if err := o.checkImages(ctx, c, d); err != nil {
				return err
			}
		} else {
			if isDowngrade(d.Spec.Version, o.To) {
				fmt.Fprintf(o.Streams.ErrOut, "warning: %s -> %s is a downgrade\n", d.Spec.Version, o.To)
			}
			if err := o.patchVersion(ctx, c, d); err != nil {
				return err
			}
			versionChanged = true
			if o.DryRun != "none" {
				// What the change would do, node by node, before it is made.
				to := d.DeepCopy()
				to.Spec.Version = o.To
				if err := whatIf(ctx, c, o.Streams.Out, namespaceFlag(o.Flags), d, to); err != nil {
					return err
				}
			}
			if err := o.checkImages(ctx, c, d); err != nil {
				return err
			}
			if !autoUpgrade(d) && len(nodes) == 0 {
				fmt.Fprintf(o.Streams.ErrOut, "warning: %s has upgradePolicy.autoUpgrade: false: nodes will not roll until requested: kubectl nvdriver upgrade %s --nodes NODE[,NODE...]\n", o.Name, o.Name)
			}
		}
	}
	for _, n := range nodes {
		if n.Annotations[upgrade.AnnotationRequested] == "true" {
			fmt.Fprintf(o.Streams.Out, "node/%s unchanged (upgrade already requested)\n", n.Name)
			continue
		}
		if o.DryRun != "client" {
			body := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, upgrade.AnnotationRequested))
			opts := []client.PatchOption{client.FieldOwner(FieldManager)}
			if o.DryRun == "server" {
				opts = append(opts, client.DryRunAll)
			}
			if err := c.Patch(ctx, &n, client.RawPatch(types.MergePatchType, body), opts...); err != nil {
				return fmt.Errorf("requesting the upgrade of node %s: %w", n.Name, err)
			}
		}
		fmt.Fprintf(o.Streams.Out, "node/%s upgrade requested%s\n", n.Name, suffix)
	}
	if !o.Wait {
		return nil
	}
	t := waitTarget{name: o.Name, version: d.Spec.Version, nodes: o.Nodes, autoUpgrade: autoUpgrade(d)}
	if o.To != "" {
		t.version = o.To
	}
	if !versionChanged && len(nodes) == 0 {
		t.alreadyThere = true
	}
	return o.wait(ctx, c, t)
}

func (o *UpgradeOptions) patchVersion(ctx context.Context, c client.Client, d *v1alpha1.NVIDIADriver) error {
	body, _ := json.Marshal(map[string]any{"spec": map[string]any{"version": o.To}})
	from := d.Spec.Version
	// Validated first (CEL rules), so a bad version changes nothing.
	if _, err := patchDriver(ctx, c, d, body, o.DryRun, fmt.Sprintf("the API server rejects version %q for %s", o.To, o.Name)); err != nil {
		return err
	}
	suffix := dryRunSuffix(o.DryRun)
	fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s version %s -> %s%s\n", o.Name, dash(from), o.To, suffix)
	return nil
}

func autoUpgrade(d *v1alpha1.NVIDIADriver) bool {
	return upgrade.PolicyFor(&d.Spec).AutoUpgrade
}

// isDowngrade compares dotted numeric versions (550.90.07); anything else
// (digests, custom tags) is not judged.
func isDowngrade(from, to string) bool {
	a, okA := numericVersion(from)
	b, okB := numericVersion(to)
	if !okA || !okB {
		return false
	}
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return b[i] < a[i]
		}
	}
	return len(b) < len(a)
}

func numericVersion(v string) ([]int, bool) {
	if v == "" {
		return nil, false
	}
	parts := strings.Split(v, ".")
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (o *UpgradeOptions) requestedNodes(ctx context.Context, c client.Client) ([]corev1.Node, error) {
	var out []corev1.Node
	for _, name := range o.Nodes {
		n := corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("node %q not found (nothing was changed)", name)
			}
			return nil, err
		}
		if owner := n.Labels[plan.LabelOwner]; owner != o.Name {
			if owner == "" {
				return nil, fmt.Errorf("node %q runs no driver of %s (no owner label; nothing was changed)", name, o.Name)
			}
			return nil, fmt.Errorf("node %q belongs to NVIDIADriver %q, not %q (nothing was changed)", name, owner, o.Name)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o *UpgradeOptions) wait(interrupted context.Context, c client.Client, t waitTarget) error {
	tty := output.IsTerminal(o.Streams.Out)
	st := output.NewStyles(o.Streams.Out, *o.NoColor)
	start := time.Now()
	last := ""
	lost := false
	heldMsg := ""
	told := map[string]bool{} // failed nodes already said
	var result error
	err := wait.PollUntilContextTimeout(interrupted, o.Interval, o.Timeout, true, func(ctx context.Context) (bool, error) {
		obs, err := readObservation(ctx, c, o.Name, namespaceFlag(o.Flags), t.nodes)
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			// The CR gone or access denied will not heal; a lost connection
			// (API server restart, network blip, watch cache reset) does: keep
			// following until the timeout, saying so once.
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				return false, err
			}
			if !lost {
				if tty {
					fmt.Fprintln(o.Streams.Out)
				}
				fmt.Fprintf(o.Streams.ErrOut, "warning: lost the API server (%v); still following, until the timeout\n", err)
				lost = true
			}
			return false, nil
		}
		if lost {
			fmt.Fprintf(o.Streams.ErrOut, "warning: API server back; following again\n")
			lost = false
		}
		heldMsg = o.sayHeld(&obs, heldMsg, tty)
		p := t.judge(obs)
		// Failures as they happen, each once, with the node's reason.
		for _, n := range p.failed {
			if told[n] {
				continue
			}
			told[n] = true
			if tty {
				fmt.Fprint(o.Streams.Out, "\r\033[K")
			}
			fmt.Fprintf(o.Streams.ErrOut, "%s\n", st.Bad(fmt.Sprintf("node %s failed: %s", n, dash(p.reasons[n]))))
		}
		line := progressLine(p, tty, st)
		if tty {
			fmt.Fprintf(o.Streams.Out, "\r\033[K%s", line)
		} else if line != last {
			fmt.Fprintf(o.Streams.Out, "%s %s\n", time.Now().Format("15:04:05"), line)
		}
		last = line
		if p.end == "" {
			return false, nil
		}
		if tty {
			fmt.Fprintln(o.Streams.Out)
		}
		result = o.finish(p, time.Since(start))
		return true, nil
	})
	switch {
	case err == nil:
		return result
	case !wait.Interrupted(err):
		return err
	}
	if tty {
		fmt.Fprintln(o.Streams.Out)
	}
	if interrupted.Err() != nil {
		return fmt.Errorf("interrupted after %s while waiting for %s (%s); nothing else was changed and the rollout goes on in the cluster: follow it with kubectl nvdriver status %s -w", time.Since(start).Round(time.Second), o.Name, last, o.Name)
	}
	return fmt.Errorf("timed out after %s waiting for %s to finish upgrading (%s); it goes on in the cluster: follow it with kubectl nvdriver status %s -w", o.Timeout, o.Name, last, o.Name)
}

// sayHeld tells, once per change, that the controller holds a pool for a
// missing image: the wait goes on (the image may be pushed), but the user
// knows why nothing moves. It returns the message said.
func (o *UpgradeOptions) sayHeld(obs *observation, said string, tty bool) string {
	c := meta.FindStatusCondition(obs.driver.Status.Conditions, v1alpha1.ConditionImageAvailable)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonImageMissing {
		return ""
	}
	if c.Message != said {
		if tty {
			fmt.Fprintln(o.Streams.Out)
		}
		fmt.Fprintf(o.Streams.ErrOut, "warning: waiting on the registry: %s\n", c.Message)
	}
	return c.Message
}

func (o *UpgradeOptions) finish(p progress, took time.Duration) error {
	took = took.Round(time.Second)
	switch p.end {
	case endFailed:
		fmt.Fprintf(o.Streams.ErrOut, "%d node(s) ended upgrade-failed (%s) after %s: see kubectl nvdriver doctor %s\n", len(p.failed), strings.Join(p.failed, ", "), took, o.Name)
		return &FindingsError{Msg: "upgrade failed"}
	case endNothing:
		fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s: nothing to do: %s\n", o.Name, p.note)
	case endHeld:
		fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s: DaemonSets carry version %s; nodes will not roll until requested (autoUpgrade: false): kubectl nvdriver upgrade %s --nodes NODE[,NODE...] --wait\n", o.Name, p.version, o.Name)
	default:
		fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s upgraded: %s in %s\n", o.Name, p.note, took)
	}
	return nil
}

func progressLine(p progress, tty bool, st *output.Styles) string {
	line := p.line
	if len(p.failed) > 0 {
		line += "; " + st.Bad(fmt.Sprintf("%d failed", len(p.failed)))
	}
	if tty && p.total > 0 {
		const width = 20
		filled := p.done * width / p.total
		line = "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] " + line
	}
	return line
}
