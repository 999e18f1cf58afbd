package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// statusEvery is how often a CR's status is rewritten when only its counts
// changed (pods ready, nodes joining): a fleet coming up moves a count with
// every pod, and writing each was most of the controller's requests. What
// may wait is narrow (docs/design.md, "Status writes"): anything else is
// written at once.
const statusEvery = 2 * time.Second

// The two writers of a CR's status, paced apart: each owns its part.
const (
	writerDriver  = "driver"  // pools, conditions, state
	writerRollout = "rollout" // status.rollout and RolloutHalted
)

// statusPacer remembers when each writer last wrote each CR's status. A nil
// pacer (hand-built reconcilers in tests) never holds a write back.
type statusPacer struct {
	mu   sync.Mutex
	last map[pacerKey]time.Time
}

type pacerKey struct {
	uid    types.UID
	writer string
}

// wait is how long a counts-only write for the CR must wait (0: write now).
func (p *statusPacer) wait(uid types.UID, writer string, now time.Time) time.Duration {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	last, ok := p.last[pacerKey{uid, writer}]
	if !ok {
		return 0
	}
	return max(0, statusEvery-now.Sub(last))
}

func (p *statusPacer) wrote(uid types.UID, writer string, now time.Time) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = map[pacerKey]time.Time{}
	}
	p.last[pacerKey{uid, writer}] = now
}

// holdBack is how long the writer's write of the CR's status from `from` to
// `to` must wait: 0 unless only counts a watcher may see late changed
// (mayWait) and the writer wrote less than statusEvery ago. A held write is
// counted.
func (p *statusPacer) holdBack(uid types.UID, writer string, from, to v1alpha1.NVIDIADriverStatus, now time.Time) time.Duration {
	if !mayWait(from, to) {
		return 0
	}
	wait := p.wait(uid, writer, now)
	if wait > 0 {
		statusWrites.WithLabelValues(writer, "paced").Inc()
	}
	return wait
}

// written records (and counts) a status write that went through.
func (p *statusPacer) written(uid types.UID, writer string, now time.Time) {
	statusWrites.WithLabelValues(writer, "written").Inc()
	p.wrote(uid, writer, now)
}

// forget drops a deleted CR's entries.
func (p *statusPacer) forget(uid types.UID) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.last {
		if k.uid == uid {
			delete(p.last, k)
		}
	}
}

// mayWait: from a to b only counts changed, and none a watcher must see at
// once. Counts are the pools' node and pod counts, condition messages
// (which carry counts), and the rollout's total, done and pending nodes —
// but only while no node is in flight before or after: a wave of a staged
// rollout (a canary, the nodes after it) can be shorter than statusEvery,
// and one held back would never be seen. Failures are never counts here.
func mayWait(a, b v1alpha1.NVIDIADriverStatus) bool {
	if inFlight(a) > 0 || inFlight(b) > 0 {
		return equality.Semantic.DeepEqual(withoutCounts(a), withoutCounts(b)) && equality.Semantic.DeepEqual(a.Rollout, b.Rollout)
	}
	return equality.Semantic.DeepEqual(withoutCounts(a), withoutCounts(b))
}

func inFlight(s v1alpha1.NVIDIADriverStatus) int32 {
	if s.Rollout == nil {
		return 0
	}
	return s.Rollout.InFlight
}

func withoutCounts(s v1alpha1.NVIDIADriverStatus) v1alpha1.NVIDIADriverStatus {
	s = *s.DeepCopy()
	for i := range s.Conditions {
		s.Conditions[i].Message = ""
	}
	for i := range s.Pools {
		p := &s.Pools[i]
		p.Nodes, p.Desired, p.Ready, p.Updated, p.Available, p.Upgrade = 0, 0, 0, 0, 0, nil
	}
	if r := s.Rollout; r != nil {
		r.Total, r.Done, r.InFlight = 0, 0, 0
		for i := range r.Pools {
			r.Pools[i].Pending = 0
		}
	}
	return s
}
