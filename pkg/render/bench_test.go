package render

import (
	"fmt"
	"testing"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/plan/plantest"
)

// Rendering every pool's DaemonSet of the benchmark fleet: what one full
// reconcile of all CRs costs on top of the plan.
func BenchmarkRenderAllPools(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		nodes, drivers := plantest.Fleet(n)
		p := plan.Compute(nodes, drivers)
		pools := 0
		for _, d := range p.Drivers {
			pools += len(d.Pools)
		}
		b.Run(fmt.Sprintf("nodes=%d/crs=%d/pools=%d", n, len(drivers), pools), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for i := range p.Drivers {
					for _, pool := range p.Drivers[i].Pools {
						if ds := DaemonSet(&drivers[i], pool, Options{Namespace: "gpu-operator"}); ds.Name != pool.DaemonSet {
							b.Fatalf("rendered %s for pool %s", ds.Name, pool.DaemonSet)
						}
					}
				}
			}
		})
	}
}
