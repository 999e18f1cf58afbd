package controller

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/plan/plantest"
)

// benchSnapshot is a fleet as the cache holds it: every node its own
// object, most unchanged since the last pass.
func benchSnapshot(n int) *snapshot {
	nodes, drivers := plantest.Fleet(n)
	s := &snapshot{}
	for i, pn := range nodes {
		labels := map[string]string{corev1.LabelArchStable: "amd64", corev1.LabelOSStable: "linux"}
		for k, v := range pn.Labels {
			labels[k] = v
		}
		s.nodes = append(s.nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pn.Name, ResourceVersion: fmt.Sprint(1000 + i), Labels: labels}})
	}
	for _, d := range drivers {
		s.drivers = append(s.drivers, *d.DeepCopy())
	}
	return s
}

// go test -run '^$' -bench Pass -benchmem ./pkg/controller: the per-pass
// work on the whole cluster that a driver pass repeats while nothing
// changed: the plan key over the remembered node facts, and the image
// check's node platforms (shared per key where the plan cache gives one).
func BenchmarkPassReads(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		s := benchSnapshot(n)
		memo := &nodeMemo{}
		snapshotKeyWith(s, memo)
		b.Run(fmt.Sprintf("key/nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				snap := &snapshot{nodes: s.nodes, drivers: s.drivers}
				snapshotKeyWith(snap, memo)
			}
		})
		shared := &planShared{}
		facts := memo.facts(s.nodes, true) // as the key left them
		pool := plan.Pool{DaemonSet: "ds"}
		for _, n := range s.nodes {
			pool.Nodes = append(pool.Nodes, n.Name)
		}
		b.Run(fmt.Sprintf("platforms/nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				snap := &snapshot{nodes: s.nodes, drivers: s.drivers, facts: facts, shared: shared}
				if p := snap.platformsOf()(pool); len(p) != 1 || p[0] != "linux/amd64" {
					b.Fatalf("platforms %q", p)
				}
			}
		})
	}
}

// go test -run '^$' -bench StatusCounts -benchmem ./pkg/controller: a
// driver pass's status of one CR holding every node (a fleet coming up),
// its plan a cache hit.
func BenchmarkStatusCounts(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		s := benchSnapshot(n)
		d := v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "all", UID: "uid-all"}}
		d.Spec.Version = "535.104.12"
		s.drivers = []v1alpha1.NVIDIADriver{d}
		for i, node := range s.nodes {
			c := node.DeepCopy()
			c.Labels[plan.LabelOwner], c.Labels[plan.LabelUpgradeState] = d.Name, plan.UpgradeDone
			s.nodes[i] = c
		}
		p := plan.Compute(s.planNodes(), s.drivers)
		pd := p.DriverByName(d.Name)
		shared := &planShared{plan: &p, owners: s.nodeOwners()}
		memo := &nodeMemo{}
		facts := memo.facts(s.nodes, true)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				snap := &snapshot{nodes: s.nodes, drivers: s.drivers, facts: facts, shared: shared, memo: memo, key: 1, owners: shared.owners}
				st := computeStatus(statusInput{Driver: &d, Plan: pd, Nodes: snap.poolNodesOf(pd, d.Name)})
				done := int32(0)
				for _, p := range st.Pools {
					done += p.Upgrade[plan.UpgradeDone]
				}
				if done != int32(n) {
					b.Fatalf("%d nodes upgrade-done, want %d", done, n)
				}
			}
		})
	}
}

// go test -run '^$' -bench TrimPod -benchmem ./pkg/controller: what the
// cache keeps of one driver pod, as bytes allocated by the transform (all of
// them kept but the interned strings already pooled): a driver pod as
// kube-controller-manager makes it, with its init and driver containers'
// statuses, decoded from protobuf as the informer hands it over.
func BenchmarkTrimPod(b *testing.B) {
	raw := rawDriverPod()
	raw.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "k8s-driver-manager", Ready: true}}
	raw.Labels["app.kubernetes.io/component"] = "nvidia-driver"
	pod := decoded(b, raw)
	if _, err := trimPod(pod); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = trimPod(pod)
	}
}
