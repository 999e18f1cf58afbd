package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// Change kinds of a pool or node under a spec change (docs/design.md, "Rollouts").
const (
	ChangeDisruptive  = upgrade.ChangeDisruptive
	ChangeRestartOnly = upgrade.ChangeRestartOnly
	ChangeNone        = "none"
)

// poolImpact is what a spec change does to one pool: disruptive when the
// driver's config digest changes (cordon, evict, restart), restart-only when
// only what the install ignores changes (the pods restart, the GPU jobs stay).
type poolImpact struct {
	pool plan.Pool
	kind string
}

// poolChanges compares the pools of the stored and the changed CR.
func poolImpacts(nodes []plan.Node, drivers []v1alpha1.NVIDIADriver, from, to *v1alpha1.NVIDIADriver) []poolImpact {
	before := planFor(nodes, drivers, from.Name)
	others := make([]v1alpha1.NVIDIADriver, 0, len(drivers))
	for _, d := range drivers {
		if d.Name != to.Name {
			others = append(others, d)
		}
	}
	after := planFor(nodes, append(others, *to), to.Name)
	if after == nil {
		return nil
	}
	old := map[string]plan.Pool{}
	if before != nil {
		for _, p := range before.Pools {
			old[p.OSTag+"/"+p.Kernel] = p
		}
	}
	_, revFrom := upgrade.RevisionOf(&from.Spec)
	_, revTo := upgrade.RevisionOf(&to.Spec)
	var out []poolImpact
	for _, p := range after.Pools {
		kind := ChangeDisruptive
		if o, ok := old[p.OSTag+"/"+p.Kernel]; ok && render.ConfigDigest(from, o, render.Options{}) == render.ConfigDigest(to, p, render.Options{}) {
			kind = ChangeRestartOnly
			if revFrom == revTo {
				kind = ChangeNone
			}
		}
		out = append(out, poolImpact{pool: p, kind: kind})
	}
	return out
}

// nodeWhatIf is what one node would go through.
type nodeWhatIf struct {
	node, pool, kind string
	evict            []string // GPU pods the upgrade would evict
	blocked          []string // what would hold the node, and why
}

// whatIf prints, for a change not made (a dry run), per pool whether it is
// disruptive or restart-only and per node the GPU pods that would be evicted
// and what would block them: a PodDisruptionBudget allowing no disruption
// now, a pod the policy may not remove, a job waitForCompletion waits for.
func whatIf(ctx context.Context, c client.Client, w io.Writer, namespace string, from, to *v1alpha1.NVIDIADriver) error {
	in, err := readInputs(ctx, c, namespace)
	if err != nil {
		return err
	}
	changes := poolImpacts(in.nodes, in.drivers, from, to)
	if len(changes) == 0 {
		fmt.Fprintf(w, "%s selects no node: nothing would roll\n", to.Name)
		return nil
	}
	policy := upgrade.PolicyFor(&to.Spec)
	var all []nodeWhatIf
	for _, ch := range changes {
		what := map[string]string{
			ChangeDisruptive:  "the driver's install changes: each node is cordoned, its GPU pods evicted, the driver restarted and validated",
			ChangeRestartOnly: "the install is the same (DRIVER_CONFIG_DIGEST unchanged): the driver pods restart in place, no cordon, GPU pods stay",
			ChangeNone:        "the driver pods do not change",
		}[ch.kind]
		fmt.Fprintf(w, "pool %s (%s): %s, %d node(s): %s\n", ch.pool.DaemonSet, ch.pool.Image, ch.kind, len(ch.pool.Nodes), what)
		for _, n := range ch.pool.Nodes {
			all = append(all, nodeWhatIf{node: n, pool: ch.pool.DaemonSet, kind: ch.kind})
		}
	}
	var pdbs []policyv1.PodDisruptionBudget
	list := &policyv1.PodDisruptionBudgetList{}
	if err := c.List(ctx, list); err == nil {
		pdbs = list.Items
	} else if !apierrors.IsForbidden(err) {
		return fmt.Errorf("listing PodDisruptionBudgets: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range all {
		if all[i].kind != ChangeDisruptive {
			continue
		}
		g.Go(func() error {
			pods := &corev1.PodList{}
			if err := c.List(gctx, pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", all[i].node)}); err != nil {
				return fmt.Errorf("listing the pods on %s: %w", all[i].node, err)
			}
			all[i].evict, all[i].blocked = blockers(pods.Items, policy, pdbs)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].node < all[j].node })
	rows := make([][]string, 0, len(all))
	for _, n := range all {
		rows = append(rows, []string{n.node, n.kind, dash(strings.Join(n.evict, ", ")), dash(strings.Join(n.blocked, "; "))})
	}
	fmt.Fprintln(w)
	return output.Table(w, []string{"node", "change", "gpu pods to evict", "would wait for"}, rows)
}

// blockers are a node's GPU pods the upgrade would evict and what would hold
// it: the same rules as the controller's (pkg/upgrade Refusal and UsesGPU).
func blockers(pods []corev1.Pod, p upgrade.Policy, pdbs []policyv1.PodDisruptionBudget) (evict, blocked []string) {
	jobs := labels.Nothing()
	if p.WaitForJobsSelector != "" {
		if sel, err := labels.Parse(p.WaitForJobsSelector); err == nil {
			jobs = sel
		}
	}
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		if jobs.Matches(labels.Set(pod.Labels)) {
			wait := "until it ends"
			if p.WaitForJobsTimeout > 0 {
				wait = "up to " + p.WaitForJobsTimeout.String()
			}
			blocked = append(blocked, fmt.Sprintf("job %s (waitForCompletion, %s)", key, wait))
		}
		if !upgrade.UsesGPU(pod) {
			continue
		}
		if why := upgrade.Refusal(pod, p.PodDeletion, "podDeletion"); why != "" {
			if p.DrainEnabled {
				why += " (the drain would then try)"
			}
			blocked = append(blocked, fmt.Sprintf("%s may not be removed: %s", key, why))
			continue
		}
		evict = append(evict, key)
		for _, pdb := range doctor.BlockingPDBs(pod, pdbs) {
			blocked = append(blocked, fmt.Sprintf("PodDisruptionBudget %s/%s allows no disruption now (%d healthy, %d desired) for %s", pdb.Namespace, pdb.Name, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy, key))
		}
	}
	return evict, blocked
}

func planFor(nodes []plan.Node, drivers []v1alpha1.NVIDIADriver, name string) *plan.Driver {
	p := plan.Compute(nodes, drivers)
	return p.DriverByName(name)
}
