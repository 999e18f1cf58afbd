package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// NodeView is one node of `status --nodes` (in -o json, a driver's "nodes").
type NodeView struct {
	Node string `json:"node"`
	// Pool is the DaemonSet of the driver pod on the node ("" when none).
	Pool  string `json:"pool"`
	Image string `json:"image"`
	// PodAgeSeconds is the driver pod's age; InStateSeconds how long the node
	// has been in its upgrade state (0 when the controller did not record it).
	PodAgeSeconds  int64  `json:"podAgeSeconds"`
	State          string `json:"state"`
	InStateSeconds int64  `json:"inStateSeconds"`
	// Cordoned is "", "nvdriver" (the upgrade machine) or "admin".
	Cordoned string `json:"cordoned"`
	Canary   bool   `json:"canary,omitempty"`
	// Waiting says what the node waits for, Fix the command that moves it on.
	Waiting string `json:"waiting,omitempty"`
	Fix     string `json:"fix,omitempty"`
}

// readNodeViews adds each driver's nodes to the report: one LIST of the
// nodes that carry an owner label and one of the driver pods.
func readNodeViews(ctx context.Context, c client.Reader, r *StatusReport, drivers []v1alpha1.NVIDIADriver, namespace string, now time.Time) error {
	owned, _ := labels.NewRequirement(plan.LabelOwner, selection.Exists, nil)
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes, client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*owned)}); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	sel, _ := metav1.LabelSelectorAsSelector(&doctor.DriverPodSelector)
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing driver pods: %w", err)
	}
	podOn := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if cur, ok := podOn[p.Spec.NodeName]; p.Spec.NodeName != "" && (!ok || (cur.DeletionTimestamp != nil && p.DeletionTimestamp == nil)) {
			podOn[p.Spec.NodeName] = p
		}
	}
	byName := map[string]*v1alpha1.NVIDIADriver{}
	for i := range drivers {
		byName[drivers[i].Name] = &drivers[i]
	}
	for i := range r.Drivers {
		ds := &r.Drivers[i]
		d := byName[ds.Name]
		ds.Nodes = []NodeView{}
		for j := range nodes.Items {
			n := &nodes.Items[j]
			if n.Labels[plan.LabelOwner] != ds.Name {
				continue
			}
			ds.Nodes = append(ds.Nodes, nodeView(n, d, podOn[n.Name], now))
		}
		sort.Slice(ds.Nodes, func(a, b int) bool { return ds.Nodes[a].Node < ds.Nodes[b].Node })
	}
	return nil
}

func nodeView(n *corev1.Node, d *v1alpha1.NVIDIADriver, pod *corev1.Pod, now time.Time) NodeView {
	v := NodeView{Node: n.Name, State: n.Labels[plan.LabelUpgradeState], Cordoned: doctor.CordonedBy(n),
		InStateSeconds: int64(doctor.InState(n, now).Seconds()), Image: doctor.PodImage(pod)}
	if pod != nil {
		if ref := metav1.GetControllerOf(pod); ref != nil {
			v.Pool = ref.Name
		}
		v.PodAgeSeconds = int64(now.Sub(pod.CreationTimestamp.Time).Seconds())
	}
	if d != nil && d.Status.Rollout != nil {
		for _, c := range d.Status.Rollout.CanaryNodes {
			v.Canary = v.Canary || c == n.Name
		}
	}
	v.Waiting, v.Fix = doctor.NodeWaiting(n, d, pod)
	return v
}

// printNodeTables prints one table of nodes per driver that has them.
func printNodeTables(w io.Writer, r *StatusReport) error {
	for _, d := range r.Drivers {
		if d.Nodes == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d node(s)\n", d.Name, len(d.Nodes))
		rows := make([][]string, 0, len(d.Nodes))
		for _, n := range d.Nodes {
			name := n.Node
			if n.Canary {
				name += " (canary)"
			}
			rows = append(rows, []string{name, dash(n.Pool), dash(n.Image), doctor.ShortAge(time.Duration(n.PodAgeSeconds) * time.Second),
				dash(n.State), doctor.ShortAge(time.Duration(n.InStateSeconds) * time.Second), dash(n.Cordoned), dash(n.Waiting)})
		}
		if err := output.Table(w, []string{"node", "pool", "image", "pod age", "upgrade state", "in state", "cordoned by", "waiting for"}, rows); err != nil {
			return err
		}
	}
	return nil
}
