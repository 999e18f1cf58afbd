package controller

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// moveSeconds is the controller's part of what an admin's relabelled node
// waits for: from the node event that woke the labeller to the labeller's
// patch that starts the node's move answered (docs/design.md, "Move
// latency"); moveParts splits out that patch's answer. The rest of the wait
// is the cluster's: the admin's write reaching our watch, and our write's
// event reaching whoever watches.
var moveSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "nvdriver_move_seconds",
	Help:    "Controller time from a node event that woke the node labeller to the labeller's patch that starts the node's move (owner label or move-to annotation written).",
	Buckets: latencyBuckets,
})

// moveParts splits nvdriver_move_seconds by whose time it was: the API
// server answering the labeller's patch (answer), and the rest (own: the
// labeller's wait for its turn, its pass, the patch's wait for one of its
// workers, its client).
var moveParts = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "nvdriver_move_part_seconds",
	Help:    "nvdriver_move_seconds by part: answer (the API server answering the labeller's patch) and own (the rest: the labeller's turn, its pass, the patch's wait for a worker).",
	Buckets: latencyBuckets,
}, []string{"part"})

func init() { metrics.Registry.MustRegister(moveSeconds, moveParts) }

// moveClock holds, per node, when an event first woke the labeller for it
// since the labeller's last pass took the nodes it was woken for.
type moveClock struct {
	mu    sync.Mutex
	woken map[string]time.Time
	now   func() time.Time
}

func (m *moveClock) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
}

// woke records an event for node; of several before a pass the first is
// kept: the move waited from then.
func (m *moveClock) woke(node string) {
	t := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.woken == nil {
		m.woken = map[string]time.Time{}
	}
	if _, ok := m.woken[node]; !ok {
		m.woken[node] = t
	}
}

// take hands a pass the nodes woken so far. It is called before the pass
// reads the cache: the informer updates its store before it calls the
// handlers, so each event taken is in what the pass reads, and the map
// stays as small as the events between two passes.
func (m *moveClock) take() map[string]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.woken
	m.woken = nil
	return w
}

// giveBack returns to the next pass a node this pass did not write (held
// behind our own write, or its patch failed), with its first event's time
// unless a later event is already waiting.
func (m *moveClock) giveBack(node string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.woken == nil {
		m.woken = map[string]time.Time{}
	}
	if t, ok := m.woken[node]; !ok || at.Before(t) {
		m.woken[node] = at
	}
}

// nodePatched is a node's patch answered: when, and how long the API server
// took to answer it.
type nodePatched struct {
	at     time.Time
	answer time.Duration
}

// moved observes a move whose first event came at at, written by p: until
// its own patch was answered, not the pass's last (a pass patches many
// nodes at once).
func (m *moveClock) moved(at time.Time, p nodePatched) {
	total := p.at.Sub(at)
	moveSeconds.Observe(total.Seconds())
	moveParts.WithLabelValues("answer").Observe(p.answer.Seconds())
	moveParts.WithLabelValues("own").Observe(max(total-p.answer, 0).Seconds())
}
