package memlimit

import (
	"context"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Rest gives the controller's freed memory back to the OS when it starts
// resting, after a while with nothing to do, and sets the garbage
// collector's target of each state (docs/design.md, "Memory"). Busy, the
// collector runs at half of Go's default (the heap may grow by half of
// what is live before a collection), which keeps a fleet's convergence
// cheap in CPU and bounds what a burst leaves behind; the heap a burst left
// behind is not held for hours. The resting target is the busy one by
// default: what the controller allocates at rest (the nodes' status
// heartbeats) made a smaller one cost CPU for each heartbeat.
type Rest struct {
	// After is how long without a pass makes the controller rest.
	After time.Duration
	// GCBusy and GCResting are the GC percents (GOGC) of the two states.
	GCBusy, GCResting int

	now          func() time.Time
	setGCPercent func(int) int
	freeOSMemory func()

	last    atomic.Int64 // UnixNano of the last Busy call
	resting atomic.Bool
	mu      sync.Mutex // orders the switches between the two states
	rests   atomic.Int64
}

// Defaults of NewRest: rest after RestAfter without a pass (the longest
// interval between two passes of one object is 2 s while anything is
// happening), at GOGC RestingPercent; busy, at GOGC BusyPercent, half of
// Go's default (docs/design.md, "Memory": what a burst leaves behind is
// bounded by it, and it costs the convergence little CPU). Resting at 25
// until session 43 cost 12 % more CPU per heartbeat at 1,000 nodes, and
// saved no memory that showed at 5,000.
const (
	RestAfter      = 10 * time.Second
	RestingPercent = 50
	BusyPercent    = 50
)

// NewRest returns the controller's Rest, or nil when GOGC is set: the
// admin's word on the collector wins, as with GOMEMLIMIT.
func NewRest() *Rest {
	if os.Getenv("GOGC") != "" {
		return nil
	}
	return &Rest{After: RestAfter, GCBusy: BusyPercent, GCResting: RestingPercent}
}

func (r *Rest) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

func (r *Rest) gcPercent(p int) {
	if r.setGCPercent != nil {
		r.setGCPercent(p)
		return
	}
	debug.SetGCPercent(p)
}

// Busy says the controller is working (a pass starts). It is cheap: two
// atomic operations unless the controller was resting.
func (r *Rest) Busy() {
	if r == nil {
		return
	}
	r.last.Store(r.clock().UnixNano())
	if r.resting.Load() {
		r.mu.Lock()
		if r.resting.Load() {
			r.gcPercent(r.GCBusy)
			r.resting.Store(false)
		}
		r.mu.Unlock()
	}
}

// IsResting says whether the controller rests now.
func (r *Rest) IsResting() bool { return r != nil && r.resting.Load() }

// Rests is how many times the controller started resting.
func (r *Rest) Rests() int64 {
	if r == nil {
		return 0
	}
	return r.rests.Load()
}

// check starts resting when no pass started for After.
func (r *Rest) check() {
	if !r.startResting() {
		return
	}
	// Outside the lock: a pass that starts meanwhile switches back at once.
	free := debug.FreeOSMemory
	if r.freeOSMemory != nil {
		free = r.freeOSMemory
	}
	free()
}

func (r *Rest) startResting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resting.Load() || r.clock().Sub(time.Unix(0, r.last.Load())) < r.After {
		return false
	}
	// Said before the last pass is read again: a pass that starts meanwhile
	// either sees it (and switches back) or is seen here.
	r.resting.Store(true)
	if r.clock().Sub(time.Unix(0, r.last.Load())) < r.After {
		r.resting.Store(false)
		return false
	}
	r.gcPercent(r.GCResting)
	r.rests.Add(1)
	return true
}

// Run checks every After/4 until ctx ends. The controller counts as busy
// when it starts, at GCBusy: Go starts every process at its default.
func (r *Rest) Run(ctx context.Context) {
	if r == nil {
		return
	}
	r.gcPercent(r.GCBusy)
	r.Busy()
	t := time.NewTicker(r.After / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.check()
		}
	}
}

// Metrics are the rest's state and count, for the controller's /metrics.
func (r *Rest) Metrics() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nvdriver_memory_resting",
			Help: "1 while the controller rests: no pass for a while, the garbage collector's target lowered.",
		}, func() float64 {
			if r.IsResting() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nvdriver_memory_rests_total",
			Help: "Times the controller started resting and gave the memory it had freed back to the OS.",
		}, func() float64 { return float64(r.Rests()) }),
	}
}
