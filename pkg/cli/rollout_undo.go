package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// RolloutUndoOptions holds the flags of `rollout undo`.
type RolloutUndoOptions struct {
	Flags      *genericclioptions.ConfigFlags
	Streams    streams
	Name       string
	ToRevision int64
	DryRun     string
}

// NewCmdRolloutUndo builds `rollout undo`.
func NewCmdRolloutUndo(flags *genericclioptions.ConfigFlags, s streams) *cobra.Command {
	o := &RolloutUndoOptions{Flags: flags, Streams: s, DryRun: "none"}
	cmd := &cobra.Command{
		Use:   "undo NAME [--to-revision N]",
		Short: "Put an earlier fully rolled-out revision back on an NVIDIADriver",
		Long: `Undo puts back the driver fields of a recorded revision (everything but nodeSelector,
default and upgradePolicy, as kubectl rollout undo restores a Deployment's pod template),
by default the newest revision that differs from the current spec: the last known good
one while a rollout is halted. The change rolls through the same machine as any other
(canary, budget, validation); nodes that never left that revision are not restarted, and
failed nodes are retried on it.`,
		Example: `  kubectl nvdriver rollout undo demo-gold
  kubectl nvdriver rollout undo demo-gold --to-revision 2 --dry-run=server`,
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
	cmd.Flags().Int64Var(&o.ToRevision, "to-revision", 0, "the revision to go back to (default: the newest that differs from the current spec)")
	cmd.Flags().StringVar(&o.DryRun, "dry-run", o.DryRun, `"none", "client" or "server"`)
	cmd.Flags().Lookup("dry-run").NoOptDefVal = "client"
	_ = cmd.RegisterFlagCompletionFunc("dry-run", fixedCompletion("none", "client", "server"))
	return cmd
}

// Validate checks the flags.
func (o *RolloutUndoOptions) Validate() error {
	if o.ToRevision < 0 {
		return usageErrorf("invalid --to-revision %d: revisions count from 1", o.ToRevision)
	}
	return oneOf("--dry-run", o.DryRun, "none", "client", "server")
}

// Run puts the revision back (a server dry run first: nothing changes on a refusal).
func (o *RolloutUndoOptions) Run(ctx context.Context) error {
	c, _, err := clientFor(o.Flags)
	if err != nil {
		return err
	}
	d, err := getDriverForRollout(ctx, c, o.Name)
	if err != nil {
		return err
	}
	revs, err := listRevisions(ctx, c, d, driverNamespace(o.Flags, d))
	if err != nil {
		return err
	}
	target, err := o.choose(d, revs)
	if err != nil {
		return err
	}
	if target.Current {
		fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s unchanged (already at revision %d, version %s)\n", o.Name, target.Revision, target.Version)
		return nil
	}
	body, err := undoPatch(d, target.Spec)
	if err != nil {
		return err
	}
	from := d.Spec.Version
	if _, err := patchDriver(ctx, c, d, body, o.DryRun, fmt.Sprintf("the API server refuses revision %d for %s", target.Revision, o.Name)); err != nil {
		return err
	}
	suffix := dryRunSuffix(o.DryRun)
	fmt.Fprintf(o.Streams.Out, "nvidiadriver.nvidia.com/%s rolled back to revision %d%s (version %s -> %s)\n", o.Name, target.Revision, suffix, dash(from), dash(target.Version))
	return nil
}

// choose is --to-revision, or the newest revision unlike the current spec.
func (o *RolloutUndoOptions) choose(d *v1alpha1.NVIDIADriver, revs []Revision) (Revision, error) {
	if o.ToRevision > 0 {
		for _, r := range revs {
			if r.Revision == o.ToRevision {
				return r, nil
			}
		}
		return Revision{}, fmt.Errorf("%s has no revision %d (%s); kubectl nvdriver rollout history %s lists them", o.Name, o.ToRevision, revisionNumbers(revs), o.Name)
	}
	for i := len(revs) - 1; i >= 0; i-- {
		if !revs[i].Current {
			return revs[i], nil
		}
	}
	return Revision{}, fmt.Errorf("%s has no earlier revision to go back to (%s): a revision is recorded when a spec has reached every node", o.Name, revisionNumbers(revs))
}

// undoPatch is upgrade.UndoPatch for the CR as read.
func undoPatch(d *v1alpha1.NVIDIADriver, rev map[string]any) ([]byte, error) {
	return upgrade.UndoPatch(&d.Spec, rev, d.ResourceVersion)
}
