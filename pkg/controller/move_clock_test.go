package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func moveCount(t *testing.T) (uint64, float64) {
	t.Helper()
	h := metricNow(t, moveSeconds).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// movePart is the sum observed so far of one part of the moves.
func movePart(t *testing.T, part string) float64 {
	t.Helper()
	return metricNow(t, moveParts.WithLabelValues(part).(prometheus.Metric)).GetHistogram().GetSampleSum()
}

// A move is timed from the first event that woke the labeller for its node
// to its patch answered in the pass that wrote it; a node the pass held or failed to patch is
// timed by the pass that writes it, still from that first event; a node
// the pass had nothing to move on is not timed.
func TestMoveClockTimesFromTheFirstEvent(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &NodeLabeler{}
	r.moves.now = func() time.Time { return now }

	r.moves.woke("moved")
	r.moves.woke("held")
	r.moves.woke("untouched")
	now = now.Add(100 * time.Millisecond)
	r.moves.woke("moved") // a second event: the first counts

	woken := r.moves.take()
	if len(woken) != 3 {
		t.Fatalf("took %v, want the three nodes", woken)
	}
	now = now.Add(200 * time.Millisecond)
	n0, s0 := moveCount(t)
	a0, o0 := movePart(t, "answer"), movePart(t, "own")
	c := newNodeChanges()
	c.moves["moved"], c.moves["held"] = true, true
	c.patched["moved"] = nodePatched{at: now, answer: 120 * time.Millisecond}
	// The pass ends later, with other nodes' patches: the move ended with its own.
	now = now.Add(400 * time.Millisecond)
	r.timeMoves(c, woken)
	n1, s1 := moveCount(t)
	if n1-n0 != 1 || s1-s0 < 0.299 || s1-s0 > 0.301 {
		t.Errorf("one move of 300 ms: got %d observed, %.3f s", n1-n0, s1-s0)
	}
	// Of its 300 ms the patch's answer took 120: the rest is the labeller's.
	if a, o := movePart(t, "answer")-a0, movePart(t, "own")-o0; a < 0.119 || a > 0.121 || o < 0.179 || o > 0.181 {
		t.Errorf("the move's parts: answer %.3f s, own %.3f s; want 0.120 and 0.180", a, o)
	}

	// The next pass writes the held node, 1 s after its event.
	now = now.Add(300 * time.Millisecond)
	r.moves.woke("held") // a later event does not restart its clock
	woken = r.moves.take()
	if _, ok := woken["untouched"]; ok {
		t.Error("a node the pass had no move for was kept for the next")
	}
	c = newNodeChanges()
	c.moves["held"], c.patched["held"] = true, nodePatched{at: now, answer: 50 * time.Millisecond}
	r.timeMoves(c, woken)
	n2, s2 := moveCount(t)
	if n2-n1 != 1 || s2-s1 < 0.999 || s2-s1 > 1.001 {
		t.Errorf("the held move, 1 s after its event: got %d observed, %.3f s", n2-n1, s2-s1)
	}
	if w := r.moves.take(); len(w) != 0 {
		t.Errorf("left after every move was written: %v", w)
	}
}
