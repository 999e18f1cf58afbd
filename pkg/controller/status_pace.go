package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// statusEvery is how often a CR's status is rewritten when only its counts
// changed (pods ready, nodes done): a fleet coming up moves a count with
// every pod, and writing each was most of the controller's requests. A
// change of meaning (state, a condition's status or reason, the pools, the
// rollout's phase, canaries or failures) is written at once (docs/design.md,
// "Status writes").
const statusEvery = 2 * time.Second

// statusPacer remembers when each CR's status was last written, per writer.
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

// onlyCountsDiffer: a and b differ in counts and condition messages only.
func onlyCountsDiffer(a, b v1alpha1.NVIDIADriverStatus) bool {
	return equality.Semantic.DeepEqual(withoutCounts(a), withoutCounts(b))
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
