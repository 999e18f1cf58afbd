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
	"github.com/nvdriver/nvdriver/pkg/upgrade"
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
	annChanges := make(map[string]map[string]*string, 0)
	for i := range nodes {
		for k, v := range plan.GPULabels(nodes[i].Labels) {
			set(changes, nodes[i].Name, k, v)
		}
	}
	p := plan.Compute(nodes, snap.drivers)
	uncordon := map[string]bool{}
	for i := range snap.nodes {
		n := &snap.nodes[i]
		state, ok := n.Labels[upgrade.LabelState]
		if !ok || p.Owner[n.Name] != "" {
			continue
		}
		// The node left every driver (its CR was deleted, or it was relabelled
		// to nothing) while the upgrade machine held it: hand it back as it was.
		setNull(changes, n.Name, upgrade.LabelState)
		if upgrade.InProgress(state) && n.Spec.Unschedulable && n.Annotations[upgrade.AnnotationInitialUnsched] != "true" {
			uncordon[n.Name] = true
		}
		for _, k := range upgradeAnnotations {
			if _, ok := n.Annotations[k]; ok {
				setAnnotationNull(annChanges, n.Name, k)
			}
		}
	}
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
	for name := range annChanges {
		if changes[name] == nil {
			changes[name] = map[string]*string{}
		}
	}
	for name, labels := range changes {
		patch := map[string]any{"metadata": map[string]any{"labels": labels}}
		if a := annChanges[name]; len(a) > 0 {
			patch["metadata"].(map[string]any)["annotations"] = a
		}
		if uncordon[name] {
			patch["spec"] = map[string]any{"unschedulable": false}
		}
		body, _ := json.Marshal(patch)
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

// upgradeAnnotations are the per-node annotations of the upgrade machine.
var upgradeAnnotations = []string{upgrade.AnnotationRequested, upgrade.AnnotationInitialUnsched, upgrade.AnnotationWaitStart,
	upgrade.AnnotationValidationStart, upgrade.AnnotationDeletionStart}

func setAnnotationNull(changes map[string]map[string]*string, node, key string) {
	if changes[node] == nil {
		changes[node] = map[string]*string{}
	}
	changes[node][key] = nil
}
