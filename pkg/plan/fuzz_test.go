package plan

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// fuzzCluster turns fuzz bytes into a small cluster: every byte picks labels
// from a vocabulary wide enough to hit every branch (NFD and gpu.present,
// deploy.driver values, OS labels or their absence, kernels, the owner label,
// user selector labels) and CRs with random selectors, default flags,
// precompiled flags and versions.
func fuzzCluster(data []byte) ([]Node, []v1alpha1.NVIDIADriver) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	keys := []string{LabelGPUPresent, LabelDeployDriver, LabelOSID, LabelOSVersion, LabelOSVersionMajor, LabelKernel,
		"feature.node.kubernetes.io/pci-10de.present", LabelOwner, "driver.config", "zone"}
	values := []string{"true", "false", "pre-installed", "", "ubuntu", "rhel", "22.04", "9.4", "9", "5.15.0-84-generic", "a", "b", "c"}
	var nodes []Node
	for i := range int(next() % 12) {
		l := map[string]string{}
		for range int(next() % 8) {
			l[keys[int(next())%len(keys)]] = values[int(next())%len(values)]
		}
		nodes = append(nodes, Node{Name: fmt.Sprintf("n%d", i), Labels: l})
	}
	var drivers []v1alpha1.NVIDIADriver
	for i := range int(next() % 6) {
		d := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("d%d", i), UID: types.UID(fmt.Sprintf("uid-%d", next())),
			CreationTimestamp: metav1.Unix(int64(next()%3), 0)}}
		b := next()
		d.Spec.Default = b&1 != 0
		if b&2 != 0 {
			d.Spec.UsePrecompiled = ptr.To(true)
		}
		d.Spec.Version = []string{"535.104.12", "535", "sha256:" + strings.Repeat("a", 64), ""}[int(b>>2)%4]
		if !d.Spec.Default {
			for range int(next() % 3) {
				if d.Spec.NodeSelector == nil {
					d.Spec.NodeSelector = map[string]string{}
				}
				d.Spec.NodeSelector[keys[int(next())%len(keys)]] = values[int(next())%len(values)]
			}
		}
		if b&64 != 0 {
			now := metav1.Unix(9, 0)
			d.DeletionTimestamp = &now
		}
		drivers = append(drivers, d)
	}
	return nodes, drivers
}

// FuzzCompute: never panics, is deterministic, plans the same with each
// node's Facts given ahead (as the controller calls it) as without, and gives
// every node at most one owner, which is a live CR that has the node in
// exactly one pool.
// `make fuzz` runs it; the corpus in testdata/fuzz runs in every `go test`.
func FuzzCompute(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 4, 0, 1, 2, 4, 3, 5, 9, 6, 1, 2, 0, 7, 4, 1, 1, 1, 2, 8, 10, 3, 2, 9, 11})
	f.Add([]byte{11, 7, 6, 0, 7, 0, 2, 4, 1, 5, 3, 6, 8, 7, 9, 5, 5, 9, 1, 0, 3, 8, 10, 2, 8, 11})
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes, drivers := fuzzCluster(data)
		for _, rules := range []string{RulesNVDriver, RulesGPUOperator} {
			p := ComputeWith(nodes, drivers, Options{Rules: rules})
			again := ComputeWith(nodes, drivers, Options{Rules: rules})
			if !reflect.DeepEqual(p, again) {
				t.Fatalf("%s: the plan is not deterministic", rules)
			}
			withFacts := make([]Node, len(nodes))
			for i, n := range nodes {
				f := FactsOf(n.Labels)
				withFacts[i] = Node{Name: n.Name, Labels: n.Labels, Facts: &f}
			}
			if given := ComputeWith(withFacts, drivers, Options{Rules: rules}); !reflect.DeepEqual(p, given) {
				t.Fatalf("%s: the plan with Facts given differs:\n%+v\nwithout:\n%+v", rules, given, p)
			}
			// A node sits in the pools of the CR that owns it, and, while it
			// moves, also of the CR it is leaving (listed in Leaving): never more.
			staying, leaving := map[string][]string{}, map[string][]string{}
			for _, d := range p.Drivers {
				isLeaving := map[string]bool{}
				for _, n := range d.Leaving {
					isLeaving[n] = true
				}
				for _, pool := range d.Pools {
					for _, n := range pool.Nodes {
						if isLeaving[n] {
							leaving[n] = append(leaving[n], d.Name)
						} else {
							staying[n] = append(staying[n], d.Name)
						}
					}
				}
			}
			for n, ds := range staying {
				if len(ds) > 1 || p.Owner[n] != ds[0] {
					t.Fatalf("%s: node %s is in pools of %v, owner %q", rules, n, ds, p.Owner[n])
				}
			}
			for n, ds := range leaving {
				if len(ds) > 1 {
					t.Fatalf("%s: node %s is leaving %v at once", rules, n, ds)
				}
			}
			for n, owner := range p.Owner {
				// NVIDIA's rules freeze every label while any conflict exists.
				frozen := rules == RulesGPUOperator && owner == labelsOf(nodes, n)[LabelOwner]
				if owner != "" && p.DriverByName(owner) == nil && !frozen {
					t.Fatalf("%s: node %s owned by %s, which is not a live CR", rules, n, owner)
				}
			}
		}
	})
}

// FuzzImage: image resolution never panics, and what it returns carries the
// version as a tag or a digest.
func FuzzImage(f *testing.F) {
	f.Add("535.104.12", "", "", "ubuntu22.04", "", false)
	f.Add("535", "nvcr.io/nvidia", "driver", "rhel9", "5.14.0-427.el9.x86_64", true)
	f.Add("sha256:"+strings.Repeat("0", 64), "", "nvcr.io/nvidia/driver", "ubuntu20.04", "", false)
	f.Fuzz(func(t *testing.T, version, repository, image, osTag, kernel string, precompiled bool) {
		spec := v1alpha1.NVIDIADriverSpec{Version: version, Repository: repository, Image: image}
		if precompiled {
			spec.UsePrecompiled = ptr.To(true)
		}
		img, err := Image(&spec, osTag, kernel)
		if err != nil {
			return
		}
		switch {
		case strings.HasPrefix(version, "sha256:"):
			if !strings.HasSuffix(img, "@"+version) {
				t.Fatalf("digest image %q does not end in @%s", img, version)
			}
		case !strings.Contains(img, ":"+version+"-"):
			t.Fatalf("image %q does not carry version %q as its tag", img, version)
		}
	})
}

func labelsOf(nodes []Node, name string) map[string]string {
	for _, n := range nodes {
		if n.Name == name {
			return n.Labels
		}
	}
	return nil
}
