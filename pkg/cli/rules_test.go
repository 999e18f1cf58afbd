package cli

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// --rules auto: NVIDIA's rule when its operator keeps the CRs' status, or,
// before any CR has a status, when a ClusterPolicy hands drivers to
// NVIDIADrivers; ours otherwise.
func TestDetectRules(t *testing.T) {
	s := runtime.NewScheme()
	s.AddKnownTypeWithName(ClusterPolicyGVK, &unstructured.Unstructured{})
	s.AddKnownTypeWithName(ClusterPolicyGVK.GroupVersion().WithKind("ClusterPolicyList"), &unstructured.UnstructuredList{})
	policy := func(useCRD bool) client.Object {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"driver": map[string]any{"useNvidiaDriverCRD": useCRD}}}}
		u.SetGroupVersionKind(ClusterPolicyGVK)
		u.SetName("cluster-policy")
		return u
	}
	nvidiaStatus := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.Ready}}
	ours := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "a", Finalizers: []string{v1alpha1.Finalizer}}, Status: v1alpha1.NVIDIADriverStatus{State: v1alpha1.Ready, ObservedGeneration: 1}}
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		drivers []v1alpha1.NVIDIADriver
		want    string
	}{
		{"no CR, no ClusterPolicy", nil, nil, plan.RulesNVDriver},
		{"no CR yet, a ClusterPolicy using NVIDIADrivers", []client.Object{policy(true)}, nil, plan.RulesGPUOperator},
		{"a ClusterPolicy that manages the driver itself", []client.Object{policy(false)}, nil, plan.RulesNVDriver},
		{"NVIDIA-style status", nil, []v1alpha1.NVIDIADriver{nvidiaStatus}, plan.RulesGPUOperator},
		{"our status", nil, []v1alpha1.NVIDIADriver{ours}, plan.RulesNVDriver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(s).WithObjects(tc.objs...).Build()
			got, why, err := detectRules(context.Background(), c, tc.drivers)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rules %q (%s), want %q", got, why, tc.want)
			}
		})
	}
}
