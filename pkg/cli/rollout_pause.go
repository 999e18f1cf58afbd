package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// NewCmdRollout groups the rollout verbs, as `kubectl rollout` does.
func NewCmdRollout(flags *genericclioptions.ConfigFlags, s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout SUBCOMMAND",
		Short: "Pause, resume, look back on and undo an NVIDIADriver's rollout",
		Long: `Rollout controls how a driver change reaches the nodes (nvdriver controller only;
docs in README, "Rollouts"):

  pause    no further node starts its upgrade; nodes already in it finish
  resume   unpause, promote a canary that waits, go on past a halt
  history  the revisions that were fully rolled out
  undo     go back to an earlier revision (through the same safe machine)`,
	}
	cmd.AddCommand(newCmdRolloutPause(flags, s, true), newCmdRolloutPause(flags, s, false), NewCmdRolloutHistory(flags, s), NewCmdRolloutUndo(flags, s))
	return cmd
}

// RolloutPauseOptions holds the flags of `rollout pause` and `rollout resume`.
type RolloutPauseOptions struct {
	Flags   *genericclioptions.ConfigFlags
	Streams streams
	Name    string
	Pause   bool // pause, else resume
	DryRun  string
	Now     func() time.Time
}

func newCmdRolloutPause(flags *genericclioptions.ConfigFlags, s streams, pause bool) *cobra.Command {
	o := &RolloutPauseOptions{Flags: flags, Streams: s, Pause: pause, DryRun: "none", Now: time.Now}
	cmd := &cobra.Command{
		Use:   "pause NAME",
		Short: "Stop an NVIDIADriver's rollout: no further node starts, nodes in flight finish",
		Long: `Pause sets spec.upgradePolicy.paused: true. No further node starts its upgrade;
nodes already in it go on to the end (validated, uncordoned), so none is left
cordoned. status and kubectl get nvd -o wide show it paused. Unlike autoUpgrade: false
it also holds requested nodes, and resume goes on where the rollout stopped.`,
		Example: `  kubectl nvdriver rollout pause demo-gold
  kubectl nvdriver rollout resume demo-gold`,
		Args:              exactArgs(1, "NAME"),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := o.Validate(); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	if !pause {
		cmd.Use = "resume NAME"
		cmd.Short = "Go on with an NVIDIADriver's rollout: unpause, promote a waiting canary, go on past a halt"
		cmd.Long = `Resume sets spec.upgradePolicy.paused: false and marks the CR with the
nvdriver.io/rollout-resumed-at annotation, which the controller acts on once:
a canary that waits for a person (or is still running) is promoted, and a rollout
halted by its failure budget goes on, the nodes that failed so far no longer counted
(they stay upgrade-failed until retried or undone).`
		cmd.Example = `  kubectl nvdriver rollout resume demo-gold`
	}
	cmd.Flags().StringVar(&o.DryRun, "dry-run", o.DryRun, `"none", "client" or "server"`)
	cmd.Flags().Lookup("dry-run").NoOptDefVal = "client"
	_ = cmd.RegisterFlagCompletionFunc("dry-run", fixedCompletion("none", "client", "server"))
	return cmd
}

// Validate checks the flags.
func (o *RolloutPauseOptions) Validate() error {
	return oneOf("--dry-run", o.DryRun, "none", "client", "server")
}

// Run patches the CR (a server dry run first, so nothing changes on a refusal).
func (o *RolloutPauseOptions) Run(ctx context.Context) error {
	c, _, err := clientFor(o.Flags)
	if err != nil {
		return err
	}
	d, err := getDriverForRollout(ctx, c, o.Name)
	if err != nil {
		return err
	}
	paused := d.Spec.UpgradePolicy != nil && d.Spec.UpgradePolicy.Paused
	verb := map[bool]string{true: "paused", false: "resumed"}[o.Pause]
	suffix := dryRunSuffix(o.DryRun)

	spec := map[string]any{}
	meta := map[string]any{}
	var what []string
	if o.Pause {
		if paused {
			fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s already paused\n", o.Name)
			return nil
		}
		spec["upgradePolicy"] = map[string]any{"paused": true}
	} else {
		if paused {
			spec["upgradePolicy"] = map[string]any{"paused": false}
			what = append(what, "unpaused")
		}
		what = append(what, resumeEffect(d)...)
		if len(what) == 0 {
			fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s not paused, and its rollout waits for nothing (%s): nothing to resume\n", o.Name, rolloutPhase(d))
			return nil
		}
		meta["annotations"] = map[string]any{upgrade.AnnotationResumedAt: o.Now().UTC().Format(time.RFC3339Nano)}
	}
	body := map[string]any{}
	if len(spec) > 0 {
		body["spec"] = spec
	}
	if len(meta) > 0 {
		body["metadata"] = meta
	}
	raw, _ := json.Marshal(body)
	probe, err := patchDriver(ctx, c, d, raw, o.DryRun, fmt.Sprintf("the API server refuses to %s %s", strings.TrimSuffix(verb, "d"), o.Name))
	if err != nil {
		return err
	}
	if o.Pause && probe != nil && (probe.Spec.UpgradePolicy == nil || !probe.Spec.UpgradePolicy.Paused) {
		// Checked on the dry run's answer, so the real write never happens.
		return fmt.Errorf("the installed NVIDIADriver CRD has no spec.upgradePolicy.paused (NVIDIA's CRD drops it): install nvdriver's CRD (charts/nvdriver/crds), or hold nodes with spec.upgradePolicy.autoUpgrade: false")
	}
	if o.Pause {
		inFlight := int32(0)
		if r := d.Status.Rollout; r != nil {
			inFlight = r.InFlight
		}
		fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s paused%s: no further node starts; %d node(s) in flight finish\n", o.Name, suffix, inFlight)
		return nil
	}
	fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s resumed%s: %s\n", o.Name, suffix, strings.Join(what, "; "))
	return nil
}

// resumeEffect says what a resume does to the rollout status shows.
func resumeEffect(d *v1alpha1.NVIDIADriver) []string {
	r := d.Status.Rollout
	if r == nil {
		return nil
	}
	left := r.Total - r.Done - r.InFlight - r.Failed
	switch r.Phase {
	case v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking:
		return []string{fmt.Sprintf("canary promoted, the other %d node(s) go on", left)}
	case v1alpha1.RolloutCanary:
		return []string{fmt.Sprintf("canary promoted before it finished (%s); every node may now start", strings.Join(r.CanaryNodes, ", "))}
	case v1alpha1.RolloutHalted:
		var names []string
		for _, f := range r.FailedNodes {
			names = append(names, f.Node)
		}
		return []string{fmt.Sprintf("going on past %d failed node(s) (%s); they stay upgrade-failed until retried or undone", r.Failed, strings.Join(names, ", "))}
	}
	return nil
}

func rolloutPhase(d *v1alpha1.NVIDIADriver) string {
	if d.Status.Rollout == nil || d.Status.Rollout.Phase == "" {
		return "no rollout recorded"
	}
	return "rollout " + d.Status.Rollout.Phase
}

// getDriverForRollout reads the CR and refuses NVIDIA's backend, which has
// no rollout control: a pause it would drop silently.
func getDriverForRollout(ctx context.Context, c client.Client, name string) (*v1alpha1.NVIDIADriver, error) {
	d := &v1alpha1.NVIDIADriver{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("NVIDIADriver %q not found", name)
		}
		return nil, err
	}
	if gpuOperatorManages([]v1alpha1.NVIDIADriver{*d}) {
		return nil, fmt.Errorf("NVIDIA's GPU Operator manages %s: it has no rollout pause, canary, history or undo (the nvdriver controller does); the nearest is spec.upgradePolicy.autoUpgrade: false, and kubectl nvdriver upgrade %s --to VERSION to go back", name, name)
	}
	return d, nil
}
