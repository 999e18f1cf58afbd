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
