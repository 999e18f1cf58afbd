package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/nvdriver/nvdriver/pkg/render"
)

// A cache that has not seen an object the controller just created (the
// first start: one ensure's create, the next ensure's read) is no error:
// the create event brings the reconcile back. Seen in a user trial as
// `configmaps "nvidia-driver-startup-probe" already exists`.
func TestEnsureToleratesACacheBehindItsOwnCreate(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	existing := &corev1.ConfigMap{}
	existing.Namespace, existing.Name = "gpu-operator", render.StartupProbeConfigMap
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(existing).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.ConfigMap); ok {
				return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name) // the stale cache
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	if err := EnsureDriverPodObjects(context.Background(), c, "gpu-operator"); err != nil {
		t.Fatalf("want no error when the create races the cache, got %v", err)
	}
	sa := &corev1.ServiceAccount{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "gpu-operator", Name: render.ServiceAccount}, sa); err != nil {
		t.Fatalf("the other objects were still ensured: %v", err)
	}
}
