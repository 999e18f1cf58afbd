package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// A node's label change leaves the plan of every CR driversTouched does not
// name exactly as it was, so those CRs need no pass: checked against
// plan.Compute on random clusters (overlapping selectors, an empty one, a
// default, a CR being deleted, excluded and non-GPU nodes, owners naming
// any CR) and random changes of one node, its creation and its deletion.
func TestDriversTouchedCoversThePlan(t *testing.T) {
	now := metav1.Now()
	cr := func(name string, sel map[string]string) v1alpha1.NVIDIADriver {
		d := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name, UID: k8stypes.UID("uid-" + name)}}
		d.Spec.Version = "535.104.12"
		d.Spec.NodeSelector = sel
		return d
	}
	names := []string{"a", "b", "ax", "all", "def", "gone"}
	drivers := []v1alpha1.NVIDIADriver{
		cr("a", map[string]string{"grp": "a"}),
		cr("b", map[string]string{"grp": "b"}),
		cr("ax", map[string]string{"grp": "a", "tier": "x"}), // overlaps a: conflicts
		cr("def", map[string]string{"grp": "none"}),          // a default: its nodeSelector counts for nothing
		cr("gone", map[string]string{"grp": "c"}),
	}
	drivers[3].Spec.Default = true
	drivers[4].DeletionTimestamp = &now
	withEmpty := append(slices.Clone(drivers), cr("all", map[string]string{})) // selects every GPU node

	pick := func(r *rand.Rand, vals ...string) string { return vals[r.IntN(len(vals))] }
	randomLabels := func(r *rand.Rand) map[string]string {
		l := map[string]string{}
		if v := pick(r, "a", "b", "c", ""); v != "" {
			l["grp"] = v
		}
		if v := pick(r, "x", "y", ""); v != "" {
			l["tier"] = v
		}
		if r.IntN(6) > 0 {
			l[plan.LabelGPUPresent] = "true"
		}
		if r.IntN(8) == 0 {
			l[plan.LabelDeployDriver] = "false"
		}
		l[plan.LabelOSID], l[plan.LabelOSVersion] = pick(r, "ubuntu", "rhel"), pick(r, "22.04", "9.4")
		l[plan.LabelKernel] = pick(r, "5.15.0-1", "6.8.0-2")
		if owner := pick(r, append(slices.Clone(names), "", "")...); owner != "" {
			l[plan.LabelOwner] = owner
		}
		return l
	}

	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		crs := drivers
		if iter%2 == 1 {
			crs = withEmpty
		}
		nodes := make([]plan.Node, 12)
		for i := range nodes {
			nodes[i] = plan.Node{Name: fmt.Sprint("n", i), Labels: randomLabels(r)}
		}
		i := r.IntN(len(nodes))
		old := nodes[i].Labels
		after := slices.Clone(nodes)
		var o, n map[string]string
		switch r.IntN(4) {
		case 0: // deleted
			after = slices.Delete(after, i, i+1)
			o = old
		case 1: // created
			nodes = slices.Delete(nodes, i, i+1)
			n = old
		default: // one or two labels changed
			n = maps.Clone(old)
			for range 1 + r.IntN(2) {
				k := pick(r, "grp", "tier", plan.LabelGPUPresent, plan.LabelDeployDriver, plan.LabelOSID, plan.LabelKernel)
				if v := pick(r, "a", "b", "x", "true", "false", "rhel", ""); v == "" {
					delete(n, k)
				} else {
					n[k] = v
				}
			}
			after[i] = plan.Node{Name: after[i].Name, Labels: n}
			o = old
		}
		before, now := plan.Compute(nodes, crs), plan.Compute(after, crs)
		touched := driversTouched(crs, o, n)
		for _, d := range crs {
			if slices.Contains(touched, d.Name) {
				continue
			}
			b, a := before.DriverByName(d.Name), now.DriverByName(d.Name)
			if !reflect.DeepEqual(b, a) {
				t.Fatalf("iteration %d: node %s %v -> %v changed the plan of %s, which driversTouched (%v) leaves out:\nbefore %+v\nafter  %+v",
					iter, nodes[min(i, len(nodes)-1)].Name, o, n, d.Name, touched, b, a)
			}
		}
	}
}
