package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/print"
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
	Nodes    []string
	Wait     bool
	Timeout  time.Duration
	DryRun   string
	Interval time.Duration
}

// NewCmdUpgrade builds the upgrade command.
func NewCmdUpgrade(flags *genericclioptions.ConfigFlags, s streams, noColor *bool) *cobra.Command {
	o := &UpgradeOptions{Flags: flags, Streams: s, NoColor: noColor, Timeout: 30 * time.Minute, DryRun: "none", Interval: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "upgrade NAME (--to VERSION | --nodes a,b) [--wait]",
		Short: "Change an NVIDIADriver's version (or request single nodes) and follow the rollout",
		Long: `Upgrade patches spec.version of the NVIDIADriver (validated by a server dry run first);
the controller then rolls the nodes one budget at a time: cordon, wait for or evict GPU
pods, restart the driver, validate, uncordon. With --nodes it requests those nodes only
(annotation nvidia.com/gpu-driver-upgrade-requested=true, for autoUpgrade: false).

With --wait it shows the progress until every node is upgrade-done and the driver is
ready. Exit status: 0 done, 3 a node ended upgrade-failed, 1 error or timeout.`,
		Example: `  kubectl nvdriver upgrade demo-silver --to 525.125.06 --wait
  kubectl nvdriver upgrade demo-gold --nodes gpu-node-3 --wait --timeout 1h
  kubectl nvdriver upgrade demo-gold --to 550.90.07 --dry-run=server`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&o.To, "to", "", "new driver version")
	cmd.Flags().StringSliceVar(&o.Nodes, "nodes", nil, "request the upgrade of these nodes only (comma separated, repeatable)")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "follow the rollout until it ends")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "give up waiting after this long (with --wait)")
	cmd.Flags().StringVar(&o.DryRun, "dry-run", o.DryRun, `"none", "client" or "server"`)
	cmd.Flags().Lookup("dry-run").NoOptDefVal = "client"
	_ = cmd.RegisterFlagCompletionFunc("nodes", completeNodes(flags))
	_ = cmd.RegisterFlagCompletionFunc("dry-run", fixedCompletion("none", "client", "server"))
	return cmd
}

// Validate checks the flags.
func (o *UpgradeOptions) Validate() error {
	if o.To == "" && len(o.Nodes) == 0 {
		return fmt.Errorf("give --to VERSION, --nodes, or both")
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("invalid --timeout %s: must be positive", o.Timeout)
	}
	if o.Wait && o.DryRun != "none" {
		return fmt.Errorf("--wait cannot follow a dry run")
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
	suffix := map[string]string{"none": "", "client": " (dry run)", "server": " (server dry run)"}[o.DryRun]
	if o.To != "" {
		if o.To == d.Spec.Version {
			fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s already at version %s\n", o.Name, o.To)
		} else {
			body, _ := json.Marshal(map[string]any{"spec": map[string]any{"version": o.To}})
			patch := client.RawPatch(types.MergePatchType, body)
			if o.DryRun != "client" {
				// Validate first (CEL rules), so a bad version changes nothing.
				if err := c.Patch(ctx, d.DeepCopy(), patch, client.FieldOwner(FieldManager), client.DryRunAll); err != nil {
					return fmt.Errorf("the API server rejects version %q for %s (nothing was changed): %v", o.To, o.Name, err)
				}
			}
			from := d.Spec.Version
			if o.DryRun == "none" {
				if err := c.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
					return fmt.Errorf("patching %s: %w", o.Name, err)
				}
			}
			fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s version %s -> %s%s\n", o.Name, dash(from), o.To, suffix)
		}
	}
	for _, n := range nodes {
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
	return o.wait(ctx, c)
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

// progress is the rollout state of one driver's nodes.
type progress struct {
	total, done, failed int
	states              map[string]int
	ready               bool
}

func (p progress) finished() bool {
	return p.ready && p.failed == 0 && inFlight(p) == 0
}

func inFlight(p progress) int {
	n := 0
	for s, c := range p.states {
		if s != plan.UpgradeDone && s != plan.UpgradeFailed && s != "" {
			n += c
		}
	}
	return n
}

func (o *UpgradeOptions) readProgress(ctx context.Context, c client.Client) (progress, error) {
	d := &v1alpha1.NVIDIADriver{}
	if err := c.Get(ctx, client.ObjectKey{Name: o.Name}, d); err != nil {
		return progress{}, err
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := c.List(ctx, list, client.MatchingLabels{plan.LabelOwner: o.Name}); err != nil {
		return progress{}, err
	}
	p := progress{total: len(list.Items), states: map[string]int{},
		ready: d.Status.State == v1alpha1.Ready && d.Status.ObservedGeneration == d.Generation}
	for _, n := range list.Items {
		s := n.Labels[plan.LabelUpgradeState]
		if s == "" {
			s = "(none)"
		}
		p.states[s]++
		switch s {
		case plan.UpgradeDone:
			p.done++
		case plan.UpgradeFailed:
			p.failed++
		}
	}
	return p, nil
}

func (o *UpgradeOptions) wait(ctx context.Context, c client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	tty := print.IsTerminal(o.Streams.Out)
	st := print.NewStyles(o.Streams.Out, *o.NoColor)
	last := ""
	lost := false
	for {
		p, err := o.readProgress(ctx, c)
		if err != nil && ctx.Err() == nil {
			// The CR gone or access denied will not heal; a lost connection
			// (API server restart, network blip, watch cache reset) does: keep
			// following until the timeout, saying so once.
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				return err
			}
			if !lost {
				if tty {
					fmt.Fprintln(o.Streams.Out)
				}
				fmt.Fprintf(o.Streams.ErrOut, "warning: lost the API server (%v); still following, until the timeout\n", err)
				lost = true
			}
		}
		if err == nil && lost {
			fmt.Fprintf(o.Streams.ErrOut, "warning: API server back; following again\n")
			lost = false
		}
		if err == nil {
			line := progressLine(p, tty, st)
			if tty {
				fmt.Fprintf(o.Streams.Out, "\r\033[K%s", line)
			} else if line != last {
				fmt.Fprintf(o.Streams.Out, "%s %s\n", time.Now().Format("15:04:05"), line)
			}
			last = line
			if p.finished() || (p.failed > 0 && inFlight(p) == 0) {
				if tty {
					fmt.Fprintln(o.Streams.Out)
				}
				if p.failed > 0 {
					fmt.Fprintf(o.Streams.ErrOut, "%d node(s) ended upgrade-failed: see kubectl nvdriver doctor %s\n", p.failed, o.Name)
					return &FindingsError{Msg: "upgrade failed"}
				}
				fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s upgraded: %d node(s) done, driver ready\n", o.Name, p.total)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(o.Streams.Out)
			}
			return fmt.Errorf("timed out after %s waiting for %s to finish upgrading (%s); it goes on in the cluster: follow it with kubectl nvdriver status %s -w", o.Timeout, o.Name, last, o.Name)
		case <-time.After(o.Interval):
		}
	}
}

func progressLine(p progress, tty bool, st *print.Styles) string {
	keys := make([]string, 0, len(p.states))
	for k := range p.states {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, p.states[k])
	}
	ready := "driver notReady"
	if p.ready {
		ready = "driver ready"
	}
	line := fmt.Sprintf("%d/%d nodes upgrade-done; %s; %s", p.done, p.total, strings.Join(parts, " "), ready)
	if p.failed > 0 {
		line += "; " + st.Bad(fmt.Sprintf("%d failed", p.failed))
	}
	if tty && p.total > 0 {
		const width = 20
		filled := p.done * width / p.total
		line = "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] " + line
	}
	return line
}
