package controller

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/nvdriver/nvdriver/pkg/render"
)

// startupProbeScript is the driver container's startup probe: the driver is up
// when the kernel module is loaded, the daemons report ready and nvidia-smi
// answers; it then marks the node's driver as ready for the validator.
const startupProbeScript = `#!/bin/sh
if [ -f /sys/module/nvidia/refcnt ] && [ -f /run/nvidia/validations/.driver-daemons-status ] && nvidia-smi >/dev/null 2>&1; then
  touch /run/nvidia/validations/.driver-ctr-ready
  exit 0
fi
rm -f /run/nvidia/validations/.driver-ctr-ready
exit 1
`

// driverPodObjects are what the driver pods need and the controller keeps in
// place itself, so it works without the chart (docs/design.md, "Driver pod objects"): the ServiceAccount,
// exactly the RBAC k8s-driver-manager uses, and the startup probe script.
func driverPodObjects(namespace string) []client.Object {
	labels := map[string]string{"app.kubernetes.io/managed-by": FieldManager, render.LabelState: render.StateDriver}
	meta := func(name, ns string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
	}
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: meta(render.ServiceAccount, namespace)},
		&rbacv1.ClusterRole{ObjectMeta: meta(render.ServiceAccount, ""), Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: meta(render.ServiceAccount, ""),
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: render.ServiceAccount},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: render.ServiceAccount, Namespace: namespace}}},
		&corev1.ConfigMap{ObjectMeta: meta(render.StartupProbeConfigMap, namespace), Data: map[string]string{"startup-probe.sh": startupProbeScript}},
	}
}

// EnsureDriverPodObjects creates what is missing and repairs what drifted
// (controllerutil.CreateOrPatch: read, set our intent, patch only a real
// difference); it writes nothing when everything is in place. The controller
// runs it on every change to the four objects (watched by name, see
// CacheOptions), and an error is retried with backoff.
func EnsureDriverPodObjects(ctx context.Context, c client.Client, namespace string) error {
	c = client.WithFieldOwner(c, FieldManager)
	for _, want := range driverPodObjects(namespace) {
		obj := want.DeepCopyObject().(client.Object)
		if _, err := controllerutil.CreateOrPatch(ctx, c, obj, func() error { return setIntent(obj, want) }); err != nil {
			// Created since the cache was read (a concurrent ensure on the
			// first start): its create event brings us back to check it.
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return fmt.Errorf("ensuring %T %s: %w", want, want.GetName(), err)
		}
	}
	return nil
}

// setIntent writes what we own of want into obj: our labels (others' stay)
// and the content.
func setIntent(obj, want client.Object) error {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, want.GetLabels())
	obj.SetLabels(labels)
	switch w := want.(type) {
	case *corev1.ServiceAccount:
	case *rbacv1.ClusterRole:
		obj.(*rbacv1.ClusterRole).Rules = w.Rules
	case *rbacv1.ClusterRoleBinding:
		o := obj.(*rbacv1.ClusterRoleBinding)
		o.RoleRef, o.Subjects = w.RoleRef, w.Subjects
	case *corev1.ConfigMap:
		obj.(*corev1.ConfigMap).Data = w.Data
	default:
		return fmt.Errorf("no intent for %T", want)
	}
	return nil
}

// driverPodObjectsReconciler keeps the driver pods' objects in place: one
// key for all four, reconciled on start and whenever one of them changes or
// is deleted.
type driverPodObjectsReconciler struct {
	client    client.Client
	namespace string
}

func (r *driverPodObjectsReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	return reconcile.Result{}, EnsureDriverPodObjects(ctx, r.client, r.namespace)
}

func setupDriverPodObjects(mgr ctrl.Manager, namespace string) error {
	key := []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "driver-pod-objects"}}}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return key })
	// The informers only report objects that exist: a fresh cluster has none,
	// so a single event at start runs the first pass.
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: &corev1.ConfigMap{}}
	b := ctrl.NewControllerManagedBy(mgr).Named("driverpodobjects").
		WatchesRawSource(source.Channel(start, one))
	for _, obj := range driverPodObjects(namespace) {
		b = b.Watches(obj.DeepCopyObject().(client.Object), one)
	}
	return b.Complete(&driverPodObjectsReconciler{client: mgr.GetClient(), namespace: namespace})
}

// driverPodObjectsCache is the cache scope of the four objects: by name (and
// namespace), so the controller needs no right to list any other
// ServiceAccount, ConfigMap or ClusterRole.
func driverPodObjectsCache(namespace string) map[client.Object]cache.ByObject {
	out := map[client.Object]cache.ByObject{}
	for _, obj := range driverPodObjects(namespace) {
		by := cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", obj.GetName())}
		if obj.GetNamespace() != "" {
			by.Namespaces = map[string]cache.Config{namespace: {}}
		}
		out[obj.DeepCopyObject().(client.Object)] = by
	}
	return out
}
