package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// RolloutHistoryOptions holds the flags of `rollout history`.
type RolloutHistoryOptions struct {
	Flags    *genericclioptions.ConfigFlags
	Streams  streams
	Name     string
	Revision int64
	Output   string
}

// NewCmdRolloutHistory builds `rollout history`.
func NewCmdRolloutHistory(flags *genericclioptions.ConfigFlags, s streams) *cobra.Command {
	o := &RolloutHistoryOptions{Flags: flags, Streams: s, Output: "table"}
	cmd := &cobra.Command{
		Use:   "history NAME [--revision N]",
		Short: "List the revisions of an NVIDIADriver that were fully rolled out",
		Long: `History lists the revisions the controller recorded (ControllerRevisions owned by
the NVIDIADriver, in the driver namespace): each spec that reached every node, with its
version, images, node count, when it started and finished. With --revision N it prints
that revision's driver fields, what rollout undo --to-revision N puts back.`,
		Example: `  kubectl nvdriver rollout history demo-gold
  kubectl nvdriver rollout history demo-gold --revision 2`,
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
	cmd.Flags().Int64Var(&o.Revision, "revision", 0, "print this revision's driver fields")
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion("table", "json", "yaml"))
	return cmd
}

// Validate checks the flags.
func (o *RolloutHistoryOptions) Validate() error {
	if o.Revision < 0 {
		return usageErrorf("invalid --revision %d: revisions count from 1", o.Revision)
	}
	return oneOf("--output", o.Output, "table", "json", "yaml")
}

// Revision is one entry of `rollout history -o json`.
type Revision struct {
	Revision        int64    `json:"revision"`
	Hash            string   `json:"hash"`
	Version         string   `json:"version"`
	Images          []string `json:"images"`
	Nodes           int      `json:"nodes"`
	StartedAt       string   `json:"startedAt,omitempty"`
	CompletedAt     string   `json:"completedAt,omitempty"`
	DurationSeconds int64    `json:"durationSeconds,omitempty"`
	// Current: the CR's spec is this revision now.
	Current bool `json:"current"`
	// Spec is the revision's driver fields (with --revision).
	Spec map[string]any `json:"spec,omitempty"`
}

// Run lists the revisions.
func (o *RolloutHistoryOptions) Run(ctx context.Context) error {
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
	if o.Revision > 0 {
		for _, r := range revs {
			if r.Revision == o.Revision {
				return o.print([]Revision{r}, true)
			}
		}
		return fmt.Errorf("%s has no revision %d (%s)", o.Name, o.Revision, revisionNumbers(revs))
	}
	if len(revs) == 0 && o.Output == "table" {
		fmt.Fprintf(o.Streams.Out, "%s has no recorded revision yet: one is recorded when a spec has reached every node (%s)\n", o.Name, rolloutPhase(d))
		return nil
	}
	return o.print(revs, false)
}

func (o *RolloutHistoryOptions) print(revs []Revision, detail bool) error {
	switch o.Output {
	case "json":
		return output.JSON(o.Streams.Out, map[string]any{"revisions": revs})
	case "yaml":
		return output.YAML(o.Streams.Out, map[string]any{"revisions": revs})
	}
	rows := make([][]string, 0, len(revs))
	for _, r := range revs {
		rev := strconv.FormatInt(r.Revision, 10)
		if r.Current {
			rev += " (current)"
		}
		dur := "-"
		if r.DurationSeconds > 0 {
			dur = (time.Duration(r.DurationSeconds) * time.Second).String()
		}
		rows = append(rows, []string{rev, r.Version, strings.Join(r.Images, ","), strconv.Itoa(r.Nodes), dash(r.CompletedAt), dur})
	}
	if err := output.Table(o.Streams.Out, []string{"REVISION", "VERSION", "IMAGES", "NODES", "ROLLED OUT", "TOOK"}, rows); err != nil {
		return err
	}
	if detail {
		fmt.Fprintln(o.Streams.Out)
		b, err := yaml.Marshal(map[string]any{"spec": revs[0].Spec})
		if err != nil {
			return err
		}
		fmt.Fprint(o.Streams.Out, string(b))
	}
	return nil
}

// driverNamespace is where the CR's DaemonSets and revisions live: what its
// status says, else -n, else the default.
func driverNamespace(flags *genericclioptions.ConfigFlags, d *v1alpha1.NVIDIADriver) string {
	if d.Status.Namespace != "" {
		return d.Status.Namespace
	}
	if ns := namespaceFlag(flags); ns != "" {
		return ns
	}
	return DefaultNamespace
}

// listRevisions reads a CR's recorded revisions, oldest first.
func listRevisions(ctx context.Context, c client.Reader, d *v1alpha1.NVIDIADriver, namespace string) ([]Revision, error) {
	list := &appsv1.ControllerRevisionList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{v1alpha1.RevisionLabel: d.Name}); err != nil {
		return nil, fmt.Errorf("listing the revisions of %s in %s: %w", d.Name, namespace, err)
	}
	_, current := upgrade.RevisionOf(&d.Spec)
	var out []Revision
	for i := range list.Items {
		cr := &list.Items[i]
		if ref := metav1.GetControllerOf(cr); ref == nil || ref.UID != d.UID {
			continue
		}
		r := Revision{Revision: cr.Revision, Hash: revisionHash(d.Name, cr.Name), StartedAt: cr.Annotations[v1alpha1.RevisionStartedAnnotation],
			CompletedAt: cr.Annotations[v1alpha1.RevisionCompletedAnnotation]}
		r.Current = r.Hash == current
		if imgs := cr.Annotations[v1alpha1.RevisionImagesAnnotation]; imgs != "" {
			r.Images = strings.Split(imgs, ",")
		}
		r.Nodes, _ = strconv.Atoi(cr.Annotations[v1alpha1.RevisionNodesAnnotation])
		start, err1 := time.Parse(time.RFC3339, r.StartedAt)
		end, err2 := time.Parse(time.RFC3339, r.CompletedAt)
		if err1 == nil && err2 == nil && !end.Before(start) {
			r.DurationSeconds = int64(end.Sub(start).Seconds())
		}
		if err := json.Unmarshal(cr.Data.Raw, &r.Spec); err != nil {
			return nil, fmt.Errorf("revision %s is not a spec: %w", cr.Name, err)
		}
		r.Version, _ = r.Spec["version"].(string)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out, nil
}

// revisionHash is the hash part of a revision's name (RevisionName).
func revisionHash(driver, name string) string {
	return name[strings.LastIndex(name, "-")+1:]
}

func revisionNumbers(revs []Revision) string {
	if len(revs) == 0 {
		return "none recorded"
	}
	var n []string
	for _, r := range revs {
		n = append(n, strconv.FormatInt(r.Revision, 10))
	}
	return "revisions: " + strings.Join(n, ", ")
}
