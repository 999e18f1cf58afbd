package controller

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/plan"
)

// nodeLabelsKey is the single work item of the node labeller: labels depend on
// every CR and every node, so one pass plans once and patches what differs.
var nodeLabelsKey = ctrl.Request{NamespacedName: types.NamespacedName{Name: "node-labels"}}

// NodeLabeler keeps the GPU and owner labels on nodes in line with the plan:
// gpu.present on NFD GPU nodes, deploy.driver=true only where absent or empty,
// and the owner label routing each GPU node to exactly one CR.
type NodeLabeler struct {
	Client client.Client
}

// Reconcile implements reconcile.Reconciler.
func (r *NodeLabeler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	snap, err := takeSnapshot(ctx, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	// GPU labels first, so a node NFD just found is planned as a GPU node.
	nodes := snap.planNodes()
	changes := make(map[string]map[string]*string, 0)
	for i := range nodes {
		for k, v := range plan.GPULabels(nodes[i].Labels) {
			set(changes, nodes[i].Name, k, v)
		}
	}
	p := plan.Compute(nodes, snap.drivers)
	for _, n := range nodes {
		want, have := p.Owner[n.Name], n.Labels[plan.LabelOwner]
		if want == have {
			continue
		}
		if want == "" {
			if _, ok := n.Labels[plan.LabelOwner]; ok {
				setNull(changes, n.Name, plan.LabelOwner)
			}
			continue
		}
		set(changes, n.Name, plan.LabelOwner, want)
	}
	var firstErr error
	for name, labels := range changes {
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		node := &corev1.Node{}
		node.Name = name
		if err := r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager)); err != nil {
			log.FromContext(ctx).Error(err, "labelling node", "node", name)
			if firstErr == nil {
				firstErr = fmt.Errorf("labelling node %s: %w", name, err)
			}
		}
	}
	return ctrl.Result{}, firstErr
}

func set(changes map[string]map[string]*string, node, key, value string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	v := value
	changes[node][key] = &v
}

func setNull(changes map[string]map[string]*string, node, key string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	changes[node][key] = nil
}
