package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// A pool is skipped only while both what is rendered and what drifted reads
// of the live DaemonSet are as they were when it was found intact; a status
// update (a new resourceVersion) does not count.
func TestIntactPools(t *testing.T) {
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold", UID: "u1", Generation: 3}}
	pool := plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "nvidia-gpu-driver-ubuntu22.04-abc", Image: "nvcr.io/nvidia/driver:550-ubuntu22.04",
		NodeSelector: map[string]string{plan.LabelOwner: "gold"}, Nodes: []string{"n1"}}
	live := func() *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: pool.DaemonSet, UID: "ds1", Generation: 1, ResourceVersion: "10",
			Labels: map[string]string{"app": pool.DaemonSet}, Annotations: map[string]string{AppliedHashAnnotation: "123"}}}
	}
	cases := []struct {
		name  string
		d     func() *v1alpha1.NVIDIADriver
		pool  func() plan.Pool
		live  func() *appsv1.DaemonSet
		still bool
	}{
		{"nothing changed", nil, nil, nil, true},
		{"a status update of the DaemonSet", nil, nil, func() *appsv1.DaemonSet { l := live(); l.ResourceVersion = "11"; l.Status.NumberReady = 4; return l }, true},
		{"more nodes in the pool", nil, func() plan.Pool { p := pool; p.Nodes = []string{"n1", "n2"}; return p }, nil, true},
		{"the DaemonSet's spec edited", nil, nil, func() *appsv1.DaemonSet { l := live(); l.Generation = 2; return l }, false},
		{"a label of the DaemonSet edited", nil, nil, func() *appsv1.DaemonSet { l := live(); l.Labels["app"] = "x"; return l }, false},
		{"the hash annotation removed", nil, nil, func() *appsv1.DaemonSet { l := live(); l.Annotations = nil; return l }, false},
		{"the DaemonSet recreated", nil, nil, func() *appsv1.DaemonSet { l := live(); l.UID = "ds2"; return l }, false},
		{"the DaemonSet gone", nil, nil, func() *appsv1.DaemonSet { return nil }, false},
		{"the CR's spec changed", func() *v1alpha1.NVIDIADriver { c := d.DeepCopy(); c.Generation = 4; return c }, nil, nil, false},
		{"the CR recreated", func() *v1alpha1.NVIDIADriver { c := d.DeepCopy(); c.UID = "u2"; return c }, nil, nil, false},
		{"another image", nil, func() plan.Pool { p := pool; p.Image = "nvcr.io/nvidia/driver:560-ubuntu22.04"; return p }, nil, false},
		{"another pool selector", nil, func() plan.Pool {
			p := pool
			p.NodeSelector = map[string]string{plan.LabelOwner: "gold", plan.LabelKernel: "5.15"}
			return p
		}, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var seen intactPools
			seen.found(pool.DaemonSet, poolRenderKey(d, pool), live())
			dd, pp, ll := d, pool, live()
			if tc.d != nil {
				dd = tc.d()
			}
			if tc.pool != nil {
				pp = tc.pool()
			}
			if tc.live != nil {
				ll = tc.live()
			}
			if got := seen.still(pp.DaemonSet, poolRenderKey(dd, pp), ll); got != tc.still {
				t.Errorf("still intact: %v, want %v", got, tc.still)
			}
		})
	}
}
