package plan_test

import (
	"fmt"
	"testing"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/plan/plantest"
)

// go test -run '^$' -bench Compute -benchmem ./pkg/plan: allocations should
// grow at most linearly with nodes (compare the 1,000 and 5,000 lines).
func BenchmarkCompute(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		nodes, drivers := plantest.Fleet(n)
		b.Run(fmt.Sprintf("nodes=%d/crs=%d", n, len(drivers)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p := plan.Compute(nodes, drivers)
				if len(p.Owner) != n {
					b.Fatalf("%d owners, want %d", len(p.Owner), n)
				}
			}
		})
	}
}

// BenchmarkComputeWithFacts is Compute as the controller calls it: each
// node's Facts worked out once, ahead (it keeps them per node version).
func BenchmarkComputeWithFacts(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		nodes, drivers := plantest.Fleet(n)
		facts := make([]plan.Facts, len(nodes))
		for i := range nodes {
			facts[i] = plan.FactsOf(nodes[i].Labels)
			nodes[i].Facts = &facts[i]
		}
		b.Run(fmt.Sprintf("nodes=%d/crs=%d", n, len(drivers)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if p := plan.Compute(nodes, drivers); len(p.Owner) != n {
					b.Fatalf("%d owners, want %d", len(p.Owner), n)
				}
			}
		})
	}
}
