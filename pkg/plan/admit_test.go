package plan

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

func TestAdmit(t *testing.T) {
	nodes := []Node{
		gpu("n1", "ubuntu22.04", "k", "driver.config", "gold", "precompiled", "yes"),
		gpu("n2", "ubuntu22.04", "k", "driver.config", "gold", "precompiled", "yes"),
		gpu("n3", "ubuntu22.04", "k", "driver.config", "silver"),
		gpu("n4", "ubuntu22.04", "k", "driver.config", "gold", "precompiled", "yes", LabelDeployDriver, DeployPreInstalled),
		{Name: "cpu", Labels: map[string]string{"driver.config": "silver", "precompiled": "yes"}},
	}
	gold := drv("gold", sel("driver.config", "gold"))
	silver := drv("silver", sel("driver.config", "silver"))
	pre := drv("precompiled", sel("precompiled", "yes"))
	def := drv("default", isDefault)
	deleting := func(d v1alpha1.NVIDIADriver) v1alpha1.NVIDIADriver {
		now := metav1.Now()
		d.DeletionTimestamp = &now
		return d
	}
	withVersion := func(d v1alpha1.NVIDIADriver, v string) v1alpha1.NVIDIADriver { d.Spec.Version = v; return d }
	withSel := func(d v1alpha1.NVIDIADriver, kv ...string) v1alpha1.NVIDIADriver { sel(kv...)(&d); return d }
	withDefault := func(d v1alpha1.NVIDIADriver) v1alpha1.NVIDIADriver {
		d.Spec.Default = true
		d.Spec.NodeSelector = nil
		return d
	}
	ptr := func(d v1alpha1.NVIDIADriver) *v1alpha1.NVIDIADriver { return &d }

	cases := []struct {
		name    string
		stored  []v1alpha1.NVIDIADriver
		old     *v1alpha1.NVIDIADriver
		obj     v1alpha1.NVIDIADriver
		reason  string   // "" = admitted
		message []string // substrings of the denial
	}{
		{name: "create, disjoint", stored: []v1alpha1.NVIDIADriver{gold, def}, obj: silver},
		{name: "create, label overlap", stored: []v1alpha1.NVIDIADriver{gold, def}, obj: pre, reason: ReasonConflictingNodeSelector,
			message: []string{`NVIDIADriver "precompiled" would select 2 node(s) that NVIDIADriver "gold" already selects: n1, n2;`, `narrow spec.nodeSelector here or in "gold"`}},
		{name: "create, overlap only on a pre-installed and a CPU node", stored: []v1alpha1.NVIDIADriver{silver},
			obj: withSel(drv("other"), "driver.config", "gold", LabelDeployDriver, DeployPreInstalled)},
		{name: "create, empty selector overlaps everyone", stored: []v1alpha1.NVIDIADriver{gold, silver}, obj: withSel(drv("all")),
			reason: ReasonConflictingNodeSelector, message: []string{`3 node(s) that NVIDIADrivers "gold", "silver" already select: n1, n2, n3`}},
		{name: "create, joining a conflict two others already have", stored: []v1alpha1.NVIDIADriver{gold, pre}, obj: withSel(drv("third"), "driver.config", "gold"),
			reason: ReasonConflictingNodeSelector, message: []string{`NVIDIADrivers "gold", "precompiled" already select: n1, n2`}},
		{name: "create, a second default", stored: []v1alpha1.NVIDIADriver{def, gold}, obj: drv("another-default", isDefault),
			reason: ReasonConflictingDefault, message: []string{`NVIDIADriver "default" is already the default`, `set spec.default: false here`}},
		{name: "create, a default while the old one is being deleted", stored: []v1alpha1.NVIDIADriver{deleting(def)}, obj: drv("another-default", isDefault)},
		{name: "create, being deleted", stored: []v1alpha1.NVIDIADriver{gold}, obj: deleting(pre)},
		{name: "update widens the selector", stored: []v1alpha1.NVIDIADriver{gold, silver}, old: &silver, obj: withSel(silver),
			reason: ReasonConflictingNodeSelector, message: []string{`NVIDIADriver "silver" would select 2 node(s) that NVIDIADriver "gold" already selects: n1, n2`}},
		{name: "update of the version of an already conflicting CR", stored: []v1alpha1.NVIDIADriver{gold, pre}, old: &pre, obj: withVersion(pre, "550.54.15")},
		{name: "update narrowing an already conflicting CR", stored: []v1alpha1.NVIDIADriver{gold, pre}, old: &pre,
			obj: withSel(pre, "precompiled", "yes", "driver.config", "gold")},
		{name: "update of a conflicting CR that reaches one more node", stored: []v1alpha1.NVIDIADriver{gold, pre, silver}, old: &pre,
			obj: withSel(pre), reason: ReasonConflictingNodeSelector, message: []string{`would select 1 node(s) that NVIDIADriver "silver" already selects: n3;`}},
		{name: "update to default while another is", stored: []v1alpha1.NVIDIADriver{def, gold}, old: &gold, obj: withDefault(gold), reason: ReasonConflictingDefault},
		{name: "update of a second default that exists already", stored: []v1alpha1.NVIDIADriver{def, drv("d2", isDefault)}, old: ptr(drv("d2", isDefault)),
			obj: withVersion(drv("d2", isDefault), "550.54.15")},
		{name: "update setting a finalizer-only change while deleting", stored: []v1alpha1.NVIDIADriver{gold, pre}, old: ptr(deleting(pre)), obj: withSel(deleting(pre))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Admit(nodes, c.stored, c.old, &c.obj)
			switch {
			case c.reason == "" && got != nil:
				t.Fatalf("refused (%s): %s", got.Reason, got.Message)
			case c.reason == "":
				return
			case got == nil:
				t.Fatalf("admitted, want %s", c.reason)
			case got.Reason != c.reason:
				t.Fatalf("reason %s, want %s: %s", got.Reason, c.reason, got.Message)
			}
			for _, m := range c.message {
				if !strings.Contains(got.Message, m) {
					t.Errorf("message %q\nlacks %q", got.Message, m)
				}
			}
		})
	}
}

func TestOverlapMessageNamesAtMostTenNodes(t *testing.T) {
	var cs []Conflict
	for i := range 13 {
		cs = append(cs, Conflict{Node: fmt.Sprintf("n%02d", i), Drivers: []string{"a", "b"}})
	}
	msg := OverlapMessage("a", cs)
	if !strings.Contains(msg, "select 13 node(s) that NVIDIADriver \"b\" already selects: n00, n01, n02, n03, n04, n05, n06, n07, n08, n09 and 3 more;") || strings.Contains(msg, "n10") {
		t.Fatal(msg)
	}
}
