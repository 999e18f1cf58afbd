// Package plantest builds synthetic clusters for benchmarks of the planner
// and of what consumes its plans.
package plantest

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Fleet builds the benchmark cluster of `make bench`: n GPU nodes over 4 OS
// releases and 6 kernels, split into 25 groups; 20 CRs (10 by label, 5
// precompiled, 4 more by label, 1 default taking the last 6 groups).
func Fleet(n int) ([]plan.Node, []v1alpha1.NVIDIADriver) {
	oses := [][2]string{{"ubuntu", "20.04"}, {"ubuntu", "22.04"}, {"rhel", "9.4"}, {"rocky", "8.10"}}
	kernels := []string{"5.15.0-84-generic", "5.15.0-78-generic", "5.4.0-150-generic", "6.8.0-45-generic", "5.14.0-427.el9.x86_64", "4.18.0-553.el8.x86_64"}
	nodes := make([]plan.Node, n)
	for i := range nodes {
		o := oses[i%4]
		nodes[i] = plan.Node{Name: fmt.Sprintf("bench-node-%d", i), Labels: map[string]string{
			"kubernetes.io/hostname":                       fmt.Sprintf("bench-node-%d", i),
			"feature.node.kubernetes.io/pci-10de.present":  "true",
			plan.LabelGPUPresent:                           "true",
			plan.LabelDeployDriver:                         "true",
			plan.LabelOSID:                                 o[0],
			plan.LabelOSVersion:                            o[1],
			plan.LabelOSVersionMajor:                       o[1][:1],
			plan.LabelKernel:                               kernels[(i/4)%6],
			"bench.group":                                  fmt.Sprint(i % 25),
			"feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
		}}
	}
	var drivers []v1alpha1.NVIDIADriver
	for i := range 19 {
		d := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cr-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i)),
			CreationTimestamp: metav1.NewTime(time.Unix(int64(i), 0))}}
		d.Spec.Version = "535.104.12"
		d.Spec.NodeSelector = map[string]string{"bench.group": fmt.Sprint(i)}
		if i >= 10 && i < 15 {
			d.Spec.UsePrecompiled = ptr.To(true)
			d.Spec.Version = "535"
		}
		drivers = append(drivers, d)
	}
	def := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "uid-default"}}
	def.Spec.Default = true
	def.Spec.Version = "550.90.07"
	drivers = append(drivers, def)
	return nodes, drivers
}
