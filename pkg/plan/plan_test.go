package plan

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// gpu builds a labelled GPU node: os like "ubuntu22.04", "rhel9.4" or "" for none.
func gpu(name, os, kernel string, extra ...string) Node {
	l := map[string]string{LabelGPUPresent: "true", LabelDeployDriver: "true"}
	if os != "" {
		id := strings.TrimRight(os, "0123456789.")
		ver := strings.TrimPrefix(os, id)
		l[LabelOSID] = id
		l[LabelOSVersion] = ver
		l[LabelOSVersionMajor] = strings.Split(ver, ".")[0]
	}
	if kernel != "" {
		l[LabelKernel] = kernel
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "-" {
			delete(l, extra[i])
			continue
		}
		l[extra[i]] = extra[i+1]
	}
	return Node{Name: name, Labels: l}
}

func drv(name string, mut ...func(*v1alpha1.NVIDIADriver)) v1alpha1.NVIDIADriver {
	d := v1alpha1.NVIDIADriver{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))},
		Spec: v1alpha1.NVIDIADriverSpec{DriverType: v1alpha1.GPU, Repository: "nvcr.io/nvidia", Image: "driver", Version: "535.104.12"},
	}
	for _, m := range mut {
		m(&d)
	}
	return d
}

func sel(kv ...string) func(*v1alpha1.NVIDIADriver) {
	return func(d *v1alpha1.NVIDIADriver) {
		d.Spec.NodeSelector = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Spec.NodeSelector[kv[i]] = kv[i+1]
		}
	}
}

func isDefault(d *v1alpha1.NVIDIADriver) { d.Spec.Default = true }
func precompiled(d *v1alpha1.NVIDIADriver) {
	d.Spec.UsePrecompiled = ptr.To(true)
	d.Spec.Version = "535"
}
func created(t time.Time) func(*v1alpha1.NVIDIADriver) {
	return func(d *v1alpha1.NVIDIADriver) { d.CreationTimestamp = metav1.NewTime(t) }
}

// summary flattens a plan into comparable strings.
type summary struct {
	owner     map[string]string
	pools     map[string][]string // driver -> "osTag/kernel=node,node"
	skipped   map[string][]string // driver -> "node:reason"
	conflicts map[string][]string // driver -> "node:a+b"
	errs      map[string]string   // driver -> reason
	uncovered []string
}

func summarize(p Plan) summary {
	s := summary{owner: map[string]string{}, pools: map[string][]string{}, skipped: map[string][]string{},
		conflicts: map[string][]string{}, errs: map[string]string{}, uncovered: p.Uncovered}
	for n, o := range p.Owner {
		if o != "" {
			s.owner[n] = o
		}
	}
	for _, d := range p.Drivers {
		for _, pl := range d.Pools {
			key := pl.OSTag
			if pl.Kernel != "" {
				key += "/" + pl.Kernel
			}
			s.pools[d.Name] = append(s.pools[d.Name], key+"="+strings.Join(pl.Nodes, ","))
		}
		for _, sk := range d.Skipped {
			s.skipped[d.Name] = append(s.skipped[d.Name], sk.Node+":"+sk.Reason)
		}
		for _, c := range d.Conflicts {
			s.conflicts[d.Name] = append(s.conflicts[d.Name], c.Node+":"+strings.Join(c.Drivers, "+"))
		}
		if d.Error != nil {
			s.errs[d.Name] = d.Error.Reason
		}
	}
	return s
}

func TestCompute(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		nodes   []Node
		drivers []v1alpha1.NVIDIADriver
		opts    Options
		want    summary
	}{
		{
			name:    "seed: one CR, two OS releases give two pools",
			nodes:   []Node{gpu("a", "ubuntu20.04", ""), gpu("b", "ubuntu22.04", ""), gpu("c", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("demo-all")},
			want: summary{
				owner: map[string]string{"a": "demo-all", "b": "demo-all", "c": "demo-all"},
				pools: map[string][]string{"demo-all": {"ubuntu20.04=a", "ubuntu22.04=b,c"}},
			},
		},
		{
			name: "seed: precompiled, two kernels give two pools",
			nodes: []Node{gpu("a", "ubuntu22.04", "5.15.0-84-generic"), gpu("b", "ubuntu22.04", "5.15.0-78-generic"),
				gpu("c", "ubuntu22.04", "5.15.0-84-generic")},
			drivers: []v1alpha1.NVIDIADriver{drv("demo-precomp-all", precompiled, sel())},
			want: summary{
				owner: map[string]string{"a": "demo-precomp-all", "b": "demo-precomp-all", "c": "demo-precomp-all"},
				pools: map[string][]string{"demo-precomp-all": {"ubuntu22.04/5.15.0-78-generic=b", "ubuntu22.04/5.15.0-84-generic=a,c"}},
			},
		},
		{
			name: "seed: gold and silver selectors split the nodes",
			nodes: []Node{gpu("g1", "ubuntu22.04", "", "driver.config", "gold"), gpu("g2", "ubuntu22.04", "", "driver.config", "gold"),
				gpu("s1", "ubuntu20.04", "", "driver.config", "silver"), gpu("x", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("demo-gold", sel("driver.config", "gold")), drv("demo-silver", sel("driver.config", "silver"))},
			want: summary{
				owner:     map[string]string{"g1": "demo-gold", "g2": "demo-gold", "s1": "demo-silver"},
				pools:     map[string][]string{"demo-gold": {"ubuntu22.04=g1,g2"}, "demo-silver": {"ubuntu20.04=s1"}},
				uncovered: []string{"x"},
			},
		},
		{
			name:    "seed: precompiled on some nodes by two labels",
			nodes:   []Node{gpu("p", "ubuntu22.04", "5.15.0-84-generic", "driver.precompiled", "true", "driver.version", "535"), gpu("q", "ubuntu22.04", "5.15.0-84-generic", "driver.precompiled", "true")},
			drivers: []v1alpha1.NVIDIADriver{drv("demo-precomp", precompiled, sel("driver.precompiled", "true", "driver.version", "535"))},
			want: summary{
				owner:     map[string]string{"p": "demo-precomp"},
				pools:     map[string][]string{"demo-precomp": {"ubuntu22.04/5.15.0-84-generic=p"}},
				uncovered: []string{"q"},
			},
		},
		{
			name:    "non-GPU nodes are ignored, NFD-only GPU nodes count",
			nodes:   []Node{{Name: "cpu", Labels: map[string]string{LabelOSID: "ubuntu", LabelOSVersion: "22.04"}}, {Name: "nfd", Labels: map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", LabelOSID: "ubuntu", LabelOSVersion: "22.04"}}, gpu("off", "ubuntu22.04", "", LabelGPUPresent, "false", "feature.node.kubernetes.io/pci-10de.present", "true")},
			drivers: []v1alpha1.NVIDIADriver{drv("all")},
			want: summary{
				owner: map[string]string{"nfd": "all"},
				pools: map[string][]string{"all": {"ubuntu22.04=nfd"}},
			},
		},
		{
			name:    "pre-installed and disabled nodes are skipped with reasons",
			nodes:   []Node{gpu("pre", "ubuntu22.04", "", LabelDeployDriver, "pre-installed"), gpu("off", "ubuntu22.04", "", LabelDeployDriver, "false"), gpu("on", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("all")},
			want: summary{
				owner:   map[string]string{"on": "all"},
				pools:   map[string][]string{"all": {"ubuntu22.04=on"}},
				skipped: map[string][]string{"all": {"off:" + ReasonDisabled, "pre:" + ReasonPreInstalled}},
			},
		},
		{
			name:    "missing OS labels and missing kernel label are skipped",
			nodes:   []Node{gpu("noos", "", "5.15.0-84-generic"), gpu("nover", "ubuntu22.04", "5.15.0-84-generic", LabelOSVersion, "-"), gpu("nokernel", "ubuntu22.04", ""), gpu("ok", "ubuntu22.04", "5.15.0-84-generic")},
			drivers: []v1alpha1.NVIDIADriver{drv("pc", precompiled)},
			want: summary{
				owner:   map[string]string{"noos": "pc", "nover": "pc", "nokernel": "pc", "ok": "pc"},
				pools:   map[string][]string{"pc": {"ubuntu22.04/5.15.0-84-generic=ok"}},
				skipped: map[string][]string{"pc": {"nokernel:" + ReasonMissingKernel, "noos:" + ReasonMissingOS, "nover:" + ReasonMissingOS}},
			},
		},
		{
			name:    "rhel family pools by major version only",
			nodes:   []Node{gpu("r1", "rhel9.4", ""), gpu("r2", "rhel9.2", ""), gpu("k", "rocky8.9", ""), gpu("o", "ol9.3", ""), gpu("nomajor", "rhel9.4", "", LabelOSVersionMajor, "-")},
			drivers: []v1alpha1.NVIDIADriver{drv("all")},
			want: summary{
				owner:   map[string]string{"r1": "all", "r2": "all", "k": "all", "o": "all", "nomajor": "all"},
				pools:   map[string][]string{"all": {"ol9=o", "rhel9=r1,r2", "rocky8=k"}},
				skipped: map[string][]string{"all": {"nomajor:" + ReasonMissingOS}},
			},
		},
		{
			name:    "default CR takes the nodes no other CR selects",
			nodes:   []Node{gpu("g", "ubuntu22.04", "", "driver.config", "gold"), gpu("x", "ubuntu22.04", ""), gpu("y", "ubuntu20.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("default", isDefault), drv("gold", sel("driver.config", "gold"))},
			want: summary{
				owner: map[string]string{"g": "gold", "x": "default", "y": "default"},
				pools: map[string][]string{"default": {"ubuntu20.04=y", "ubuntu22.04=x"}, "gold": {"ubuntu22.04=g"}},
			},
		},
		{
			name: "conflict is scoped to the CRs involved; the node keeps its previous owner",
			nodes: []Node{gpu("both", "ubuntu22.04", "", "driver.config", "gold", "tier", "a", LabelOwner, "gold"),
				gpu("g", "ubuntu22.04", "", "driver.config", "gold"), gpu("t", "ubuntu22.04", "", "tier", "a"),
				gpu("b", "ubuntu22.04", "", "driver.config", "bronze")},
			drivers: []v1alpha1.NVIDIADriver{drv("gold", sel("driver.config", "gold")), drv("tier", sel("tier", "a")), drv("bronze", sel("driver.config", "bronze"))},
			want: summary{
				owner:     map[string]string{"both": "gold", "g": "gold", "t": "tier", "b": "bronze"},
				pools:     map[string][]string{"gold": {"ubuntu22.04=both,g"}, "tier": {"ubuntu22.04=t"}, "bronze": {"ubuntu22.04=b"}},
				conflicts: map[string][]string{"gold": {"both:gold+tier"}, "tier": {"both:gold+tier"}},
				errs:      map[string]string{"gold": ReasonConflictingNodeSelector, "tier": ReasonConflictingNodeSelector},
			},
		},
		{
			name:    "an empty-selector CR conflicts with a targeted CR (NVIDIA's nil selector selects all)",
			nodes:   []Node{gpu("g", "ubuntu22.04", "", "driver.config", "gold"), gpu("x", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("all"), drv("gold", sel("driver.config", "gold"))},
			want: summary{
				owner:     map[string]string{"x": "all"},
				pools:     map[string][]string{"all": {"ubuntu22.04=x"}},
				conflicts: map[string][]string{"all": {"g:all+gold"}, "gold": {"g:all+gold"}},
				errs:      map[string]string{"all": ReasonConflictingNodeSelector, "gold": ReasonConflictingNodeSelector},
			},
		},
		{
			name:    "gpu-operator rules: any conflict blocks every CR and no owner changes",
			nodes:   []Node{gpu("both", "ubuntu22.04", "", "a", "1", "b", "1"), gpu("c", "ubuntu22.04", "", "c", "1", LabelOwner, "old")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1")), drv("b", sel("b", "1")), drv("c", sel("c", "1"))},
			opts:    Options{Rules: RulesGPUOperator},
			want: summary{
				owner:     map[string]string{"c": "old"},
				conflicts: map[string][]string{"a": {"both:a+b"}, "b": {"both:a+b"}},
				errs:      map[string]string{"a": ReasonConflictingNodeSelector, "b": ReasonConflictingNodeSelector, "c": ReasonConflictingNodeSelector},
			},
		},
		{
			name:    "gpu-operator rules: a CR without a repository is refused, as NVIDIA's operator refuses it",
			nodes:   []Node{gpu("x", "ubuntu22.04", "", "a", "1")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1"), func(d *v1alpha1.NVIDIADriver) { d.Spec.Repository = "" })},
			opts:    Options{Rules: RulesGPUOperator},
			want: summary{
				owner: map[string]string{"x": "a"},
				pools: map[string][]string{"a": {"ubuntu22.04=x"}},
				errs:  map[string]string{"a": ReasonInvalidSpec},
			},
		},
		{
			name:    "nvdriver rules: the same CR resolves with the default repository",
			nodes:   []Node{gpu("x", "ubuntu22.04", "", "a", "1")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1"), func(d *v1alpha1.NVIDIADriver) { d.Spec.Repository = "" })},
			want: summary{
				owner: map[string]string{"x": "a"},
				pools: map[string][]string{"a": {"ubuntu22.04=x"}},
			},
		},
		{
			name:  "gpu-operator rules: GDS with only a version is refused, as NVIDIA has no default for its image",
			nodes: []Node{gpu("x", "ubuntu22.04", "", "a", "1")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1"), func(d *v1alpha1.NVIDIADriver) {
				d.Spec.GPUDirectStorage = &v1alpha1.GPUDirectStorageSpec{Enabled: ptr.To(true), Version: "2.20.5"}
			})},
			opts: Options{Rules: RulesGPUOperator},
			want: summary{
				owner: map[string]string{"x": "a"},
				pools: map[string][]string{"a": {"ubuntu22.04=x"}},
				errs:  map[string]string{"a": ReasonInvalidSpec},
			},
		},
		{
			name:  "gpu-operator rules: a manager with only a version is refused",
			nodes: []Node{gpu("x", "ubuntu22.04", "", "a", "1")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1"), func(d *v1alpha1.NVIDIADriver) {
				d.Spec.Manager = v1alpha1.DriverManagerSpec{Version: "v0.8.2"}
			})},
			opts: Options{Rules: RulesGPUOperator},
			want: summary{
				owner: map[string]string{"x": "a"},
				pools: map[string][]string{"a": {"ubuntu22.04=x"}},
				errs:  map[string]string{"a": ReasonInvalidSpec},
			},
		},
		{
			name:  "nvdriver rules: an enabled GDS without a version is an invalid spec, not a wrong image",
			nodes: []Node{gpu("x", "ubuntu22.04", "", "a", "1")},
			drivers: []v1alpha1.NVIDIADriver{drv("a", sel("a", "1"), func(d *v1alpha1.NVIDIADriver) {
				d.Spec.GPUDirectStorage = &v1alpha1.GPUDirectStorageSpec{Enabled: ptr.To(true)}
			})},
			want: summary{
				owner: map[string]string{"x": "a"},
				pools: map[string][]string{"a": {"ubuntu22.04=x"}},
				errs:  map[string]string{"a": ReasonInvalidSpec},
			},
		},
		{
			name:    "two defaults: the oldest works, the other gets ConflictingDefault",
			nodes:   []Node{gpu("x", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("newer", isDefault, created(t0.Add(time.Hour))), drv("older", isDefault, created(t0))},
			want: summary{
				owner: map[string]string{"x": "older"},
				pools: map[string][]string{"older": {"ubuntu22.04=x"}},
				errs:  map[string]string{"newer": ReasonConflictingDefault},
			},
		},
		{
			name:    "two defaults created together: the name breaks the tie",
			nodes:   []Node{gpu("x", "ubuntu22.04", "")},
			drivers: []v1alpha1.NVIDIADriver{drv("b-default", isDefault), drv("a-default", isDefault)},
			want: summary{
				owner: map[string]string{"x": "a-default"},
				pools: map[string][]string{"a-default": {"ubuntu22.04=x"}},
				errs:  map[string]string{"b-default": ReasonConflictingDefault},
			},
		},
		{
			name:  "a CR being deleted selects nothing; the default takes over",
			nodes: []Node{gpu("g", "ubuntu22.04", "", "driver.config", "gold")},
			drivers: []v1alpha1.NVIDIADriver{drv("default", isDefault), drv("gold", sel("driver.config", "gold"), func(d *v1alpha1.NVIDIADriver) {
				now := metav1.Now()
				d.DeletionTimestamp = &now
			})},
			want: summary{
				owner: map[string]string{"g": "default"},
				pools: map[string][]string{"default": {"ubuntu22.04=g"}},
			},
		},
		{
			name:    "owner label on a node no CR selects any more is removed",
			nodes:   []Node{gpu("x", "ubuntu22.04", "", LabelOwner, "gone"), {Name: "cpu", Labels: map[string]string{LabelOwner: "gone"}}},
			drivers: []v1alpha1.NVIDIADriver{drv("gold", sel("driver.config", "gold"))},
			want:    summary{uncovered: []string{"x"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := summarize(ComputeWith(tc.nodes, tc.drivers, tc.opts))
			want := tc.want
			for _, m := range []*map[string]string{&want.owner, &want.errs} {
				if *m == nil {
					*m = map[string]string{}
				}
			}
			for _, m := range []*map[string][]string{&want.pools, &want.skipped, &want.conflicts} {
				if *m == nil {
					*m = map[string][]string{}
				}
			}
			if want.uncovered == nil {
				want.uncovered = []string{}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("plan mismatch\n got: %+v\nwant: %+v", got, want)
			}
		})
	}
}

func TestPoolDetails(t *testing.T) {
	d := drv("gold", sel("driver.config", "gold", LabelOwner, "sneaky"))
	d.UID = "3fa85f64-5717-4562-b3fc-2c963f66afa6"
	p := Compute([]Node{gpu("n", "ubuntu22.04", "", "driver.config", "gold", LabelOwner, "sneaky")}, []v1alpha1.NVIDIADriver{d})
	pd := p.DriverByName("gold")
	if pd == nil || len(pd.Pools) != 1 {
		t.Fatalf("want one pool, got %+v", pd)
	}
	pool := pd.Pools[0]
	if pool.DaemonSet != "nvidia-gpu-driver-ubuntu22.04-554c55d4cd" {
		t.Errorf("DaemonSet = %q", pool.DaemonSet)
	}
	if pool.Image != "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04" {
		t.Errorf("Image = %q", pool.Image)
	}
	// The user's driver.config selector is carried by the owner label alone, so
	// relabelling a node never removes its driver pod before the move drains it.
	want := map[string]string{LabelGPUPresent: "true", LabelOwner: "gold",
		LabelOSID: "ubuntu", LabelOSVersion: "22.04"}
	if !reflect.DeepEqual(pool.NodeSelector, want) {
		t.Errorf("NodeSelector = %v, want %v", pool.NodeSelector, want)
	}
}

func TestConflictMessageNamesCRsAndAtMostTenNodes(t *testing.T) {
	var nodes []Node
	for i := 0; i < 12; i++ {
		nodes = append(nodes, gpu(string(rune('a'+i)), "ubuntu22.04", "", "x", "1"))
	}
	p := Compute(nodes, []v1alpha1.NVIDIADriver{drv("one", sel("x", "1")), drv("two", sel())})
	msg := p.DriverByName("one").Error.Message
	for _, want := range []string{`"two"`, "12 node(s)", "a, b, c, d, e, f, g, h, i, j and 2 more"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "k,") || strings.Contains(msg, ", l") {
		t.Errorf("message names more than 10 nodes: %q", msg)
	}
	if !p.HasConflicts() {
		t.Error("HasConflicts = false")
	}
}

func TestWarnings(t *testing.T) {
	p := Compute([]Node{gpu("n", "ubuntu22.04", "")}, []v1alpha1.NVIDIADriver{
		drv("branch", func(d *v1alpha1.NVIDIADriver) { d.Spec.Version = "535" }),
		drv("nothing", sel("no", "match")),
	})
	if w := p.DriverByName("branch").Warnings; len(w) != 1 || !strings.Contains(w[0], "bare branch") {
		t.Errorf("branch warnings = %v", w)
	}
	if w := p.DriverByName("nothing").Warnings; len(w) != 1 || w[0] != "selects no GPU node" {
		t.Errorf("nothing warnings = %v", w)
	}
}

func TestGPULabels(t *testing.T) {
	nfd := "feature.node.kubernetes.io/pci-0302_10de.present"
	cases := []struct {
		name   string
		labels map[string]string
		want   map[string]string
	}{
		{"not a GPU node", map[string]string{"x": "y"}, nil},
		{"fresh NFD GPU node", map[string]string{nfd: "true"}, map[string]string{LabelGPUPresent: "true", LabelDeployDriver: "true"}},
		{"empty deploy label is filled", map[string]string{nfd: "true", LabelGPUPresent: "true", LabelDeployDriver: ""}, map[string]string{LabelDeployDriver: "true"}},
		{"pre-installed is kept", map[string]string{nfd: "true", LabelDeployDriver: "pre-installed"}, map[string]string{LabelGPUPresent: "true"}},
		{"false is kept", map[string]string{nfd: "true", LabelGPUPresent: "true", LabelDeployDriver: "false"}, nil},
		{"already labelled", map[string]string{nfd: "true", LabelGPUPresent: "true", LabelDeployDriver: "true"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := GPULabels(tc.labels); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GPULabels = %v, want %v", got, tc.want)
			}
		})
	}
}

// A node relabelled from gold to silver stays in gold's pool (leaving) until
// the controller moves its owner label, so gold's running driver is not deleted
// under its GPU jobs; silver already plans it.
func TestLeavingNodeStaysInItsPoolUntilMoved(t *testing.T) {
	nodes := []Node{gpu("n", "ubuntu22.04", "", "driver.config", "silver", LabelOwner, "gold"), gpu("m", "ubuntu22.04", "", "driver.config", "gold", LabelOwner, "gold")}
	p := Compute(nodes, []v1alpha1.NVIDIADriver{drv("gold", sel("driver.config", "gold")), drv("silver", sel("driver.config", "silver"))})
	gold, silver := p.DriverByName("gold"), p.DriverByName("silver")
	if p.Owner["n"] != "silver" {
		t.Errorf("planned owner of n = %q", p.Owner["n"])
	}
	if len(gold.Pools) != 1 || strings.Join(gold.Pools[0].Nodes, ",") != "m,n" || strings.Join(gold.Leaving, ",") != "n" {
		t.Errorf("gold pools %+v leaving %v", gold.Pools, gold.Leaving)
	}
	if strings.Join(gold.SelectedNodes, ",") != "m" || strings.Join(silver.SelectedNodes, ",") != "n" {
		t.Errorf("selected: gold %v silver %v", gold.SelectedNodes, silver.SelectedNodes)
	}
}
