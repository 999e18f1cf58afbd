package memlimit

import (
	"context"
	"testing"
	"time"
)

// The controller rests once no pass started for After: the collector's
// target drops to GCResting and the freed memory goes back to the OS, once;
// the next pass switches back to GCBusy, once.
func TestRest(t *testing.T) {
	clock := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var percents []int
	freed := 0
	r := &Rest{After: 10 * time.Second, GCBusy: 100, GCResting: 25,
		now:          func() time.Time { return clock },
		setGCPercent: func(p int) int { percents = append(percents, p); return 0 },
		freeOSMemory: func() { freed++ },
	}
	r.Busy()
	clock = clock.Add(9 * time.Second)
	r.check()
	if r.IsResting() || len(percents) != 0 || freed != 0 {
		t.Fatalf("9s after a pass: resting %v, GC percents set %v, freed %d; want busy and nothing done", r.IsResting(), percents, freed)
	}
	clock = clock.Add(time.Second)
	r.check()
	r.check()
	if !r.IsResting() || len(percents) != 1 || percents[0] != 25 || freed != 1 || r.Rests() != 1 {
		t.Fatalf("10s after a pass: resting %v, GC percents set %v, freed %d; want resting at 25, freed once", r.IsResting(), percents, freed)
	}
	r.Busy()
	r.Busy()
	if r.IsResting() || len(percents) != 2 || percents[1] != 100 {
		t.Fatalf("a pass while resting: resting %v, GC percents set %v; want busy at 100, set once", r.IsResting(), percents)
	}
	clock = clock.Add(5 * time.Second)
	r.check()
	if r.IsResting() {
		t.Error("rested 5s after a pass")
	}
	clock = clock.Add(5 * time.Second)
	r.check()
	if !r.IsResting() || freed != 2 || r.Rests() != 2 {
		t.Errorf("10s after the next pass: resting %v, freed %d, want resting again", r.IsResting(), freed)
	}
}

// The controller starts busy at GCBusy, not at Go's default, which every
// process starts with.
func TestRunStartsAtGCBusy(t *testing.T) {
	var percents []int
	r := &Rest{After: 10 * time.Second, GCBusy: BusyPercent, GCResting: RestingPercent,
		setGCPercent: func(p int) int { percents = append(percents, p); return 0 },
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.Run(ctx)
	if len(percents) != 1 || percents[0] != BusyPercent || r.IsResting() {
		t.Fatalf("Run: GC percents set %v, resting %v; want [%d], busy", percents, r.IsResting(), BusyPercent)
	}
}

// GOGC set by the admin: no rest; a nil Rest is safe to call.
func TestNoRestWithGOGC(t *testing.T) {
	t.Setenv("GOGC", "200")
	r := NewRest()
	if r != nil {
		t.Fatal("NewRest with GOGC set: want nil")
	}
	r.Busy()
	if r.IsResting() || r.Rests() != 0 {
		t.Error("a nil Rest rests")
	}
	t.Setenv("GOGC", "")
	if r := NewRest(); r == nil || r.GCBusy != BusyPercent || r.GCResting != RestingPercent || r.After != RestAfter {
		t.Errorf("NewRest without GOGC: %+v", r)
	}
}
