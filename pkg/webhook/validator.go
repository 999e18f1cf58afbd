// Package webhook is the controller's validating admission webhook: it refuses
// an NVIDIADriver that would make a node selected by two drivers, or add a
// second default, with the rule the controller and assign use (plan.Admit).
// It also keeps its own serving certificate (certs.go). docs/design.md,
// "Admission", says why it fails open.
package webhook

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Validator judges NVIDIADrivers from the informer cache: an admission costs
// no API request, and every replica (leader or not) answers alike.
type Validator struct {
	Cache cache.Cache
}

var _ admission.Validator[*v1alpha1.NVIDIADriver] = &Validator{}

// ValidateCreate refuses a new NVIDIADriver that overlaps another or is a
// second default.
func (v *Validator) ValidateCreate(ctx context.Context, obj *v1alpha1.NVIDIADriver) (admission.Warnings, error) {
	return v.judge(ctx, nil, obj)
}

// ValidateUpdate refuses a change of nodeSelector or default that adds an
// overlap or a second default; any other change is admitted.
func (v *Validator) ValidateUpdate(ctx context.Context, old, obj *v1alpha1.NVIDIADriver) (admission.Warnings, error) {
	return v.judge(ctx, old, obj)
}

// ValidateDelete admits every deletion: removing a driver never adds an
// overlap (its nodes fall to the default or to nobody).
func (v *Validator) ValidateDelete(context.Context, *v1alpha1.NVIDIADriver) (admission.Warnings, error) {
	return nil, nil
}

func (v *Validator) judge(ctx context.Context, old, obj *v1alpha1.NVIDIADriver) (admission.Warnings, error) {
	nodes, drivers, err := v.read(ctx)
	if err != nil {
		// Fail open, as the webhook configuration does: the controller still
		// reports a conflict once the object is stored.
		return admission.Warnings{fmt.Sprintf("nvdriver: overlap not checked (%v); the controller reports conflicts after the fact", err)}, nil
	}
	if p := plan.Admit(nodes, drivers, old, obj); p != nil {
		return nil, fmt.Errorf("%s (%s)", p.Message, p.Reason)
	}
	return nil, nil
}

// read lists nodes and NVIDIADrivers from the cache, without waiting: an
// admission must answer within its timeout, so a cache still syncing (a
// replica just started) is reported instead of waited for.
func (v *Validator) read(ctx context.Context) ([]plan.Node, []v1alpha1.NVIDIADriver, error) {
	for _, obj := range []client.Object{&corev1.Node{}, &v1alpha1.NVIDIADriver{}} {
		inf, err := v.Cache.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil {
			return nil, nil, err
		}
		if !inf.HasSynced() {
			return nil, nil, fmt.Errorf("the controller's cache is still syncing")
		}
	}
	nodes := &corev1.NodeList{}
	if err := v.Cache.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := v.Cache.List(ctx, drivers); err != nil {
		return nil, nil, err
	}
	out := make([]plan.Node, len(nodes.Items))
	for i := range nodes.Items {
		out[i] = plan.Node{Name: nodes.Items[i].Name, Labels: nodes.Items[i].Labels}
	}
	return out, drivers.Items, nil
}
