package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

func TestStatusPacer(t *testing.T) {
	var p statusPacer
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	if w := p.wait("a", writerDriver, t0); w != 0 {
		t.Fatalf("never written: wait %v, want 0", w)
	}
	p.wrote("a", writerDriver, t0)
	if w := p.wait("a", writerDriver, t0.Add(500*time.Millisecond)); w != statusEvery-500*time.Millisecond {
		t.Errorf("0.5s after a write: wait %v, want %v", w, statusEvery-500*time.Millisecond)
	}
	if w := p.wait("a", writerRollout, t0); w != 0 {
		t.Errorf("the other writer is paced apart: wait %v, want 0", w)
	}
	if w := p.wait("b", writerDriver, t0); w != 0 {
		t.Errorf("another CR is paced apart: wait %v, want 0", w)
	}
	if w := p.wait("a", writerDriver, t0.Add(statusEvery)); w != 0 {
		t.Errorf("statusEvery after a write: wait %v, want 0", w)
	}
	p.wrote("a", writerRollout, t0)
	p.forget("a")
	if w := p.wait("a", writerDriver, t0); w != 0 {
		t.Errorf("after forget: wait %v, want 0", w)
	}
	if len(p.last) != 0 {
		t.Errorf("forget left %d entries", len(p.last))
	}
	var nilPacer *statusPacer // hand-built reconcilers have none: always write
	nilPacer.wrote("a", writerDriver, t0)
	if w := nilPacer.wait("a", writerDriver, t0); w != 0 {
		t.Errorf("nil pacer: wait %v, want 0", w)
	}
}

func TestOnlyCountsDiffer(t *testing.T) {
	base := func() v1alpha1.NVIDIADriverStatus {
		return v1alpha1.NVIDIADriverStatus{
			State:              v1alpha1.State("notReady"),
			ObservedGeneration: 2,
			Conditions: []metav1.Condition{
				{Type: "Ready", Status: metav1.ConditionFalse, Reason: "PodsNotReady", Message: "3 of 10 driver pods are ready"},
			},
			Pools: []v1alpha1.PoolStatus{
				{OSTag: "ubuntu22.04", DaemonSet: "nvidia-gpu-driver-ubuntu22.04-abc", Image: "nvcr.io/nvidia/driver:570-ubuntu22.04",
					Nodes: 10, Desired: 10, Ready: 3, Updated: 10, Available: 3, Upgrade: map[string]int32{"upgrade-done": 3}},
			},
			Rollout: &v1alpha1.RolloutStatus{Revision: "r2", Phase: "Progressing", Total: 10, Done: 3,
				Pools: []v1alpha1.RolloutPool{{DaemonSet: "nvidia-gpu-driver-ubuntu22.04-abc", Change: "version", Pending: 5}}},
		}
	}
	cases := []struct {
		name   string
		edit   func(*v1alpha1.NVIDIADriverStatus)
		counts bool
	}{
		{"same", func(*v1alpha1.NVIDIADriverStatus) {}, true},
		{"pool counts", func(s *v1alpha1.NVIDIADriverStatus) {
			s.Pools[0].Ready, s.Pools[0].Available, s.Pools[0].Upgrade = 4, 4, map[string]int32{"upgrade-done": 4}
		}, true},
		{"condition message", func(s *v1alpha1.NVIDIADriverStatus) { s.Conditions[0].Message = "4 of 10 driver pods are ready" }, true},
		{"rollout counts, nothing in flight", func(s *v1alpha1.NVIDIADriverStatus) {
			s.Rollout.Total, s.Rollout.Done, s.Rollout.Pools[0].Pending = 11, 4, 4
		}, true},
		// A wave can be shorter than the pace: never held.
		{"a node takes flight", func(s *v1alpha1.NVIDIADriverStatus) { s.Rollout.InFlight = 1 }, false},
		{"failed", func(s *v1alpha1.NVIDIADriverStatus) { s.Rollout.Failed = 1 }, false},
		{"state", func(s *v1alpha1.NVIDIADriverStatus) { s.State = v1alpha1.State("ready") }, false},
		{"observed generation", func(s *v1alpha1.NVIDIADriverStatus) { s.ObservedGeneration = 3 }, false},
		{"condition status", func(s *v1alpha1.NVIDIADriverStatus) { s.Conditions[0].Status = metav1.ConditionTrue }, false},
		{"condition reason", func(s *v1alpha1.NVIDIADriverStatus) { s.Conditions[0].Reason = "ImagePullFailed" }, false},
		{"new pool", func(s *v1alpha1.NVIDIADriverStatus) {
			s.Pools = append(s.Pools, v1alpha1.PoolStatus{OSTag: "rhel9.4", DaemonSet: "nvidia-gpu-driver-rhel9.4-def"})
		}, false},
		{"pool image", func(s *v1alpha1.NVIDIADriverStatus) { s.Pools[0].Image = "nvcr.io/nvidia/driver:580-ubuntu22.04" }, false},
		{"rollout phase", func(s *v1alpha1.NVIDIADriverStatus) { s.Rollout.Phase = "Halted" }, false},
		{"rollout gone", func(s *v1alpha1.NVIDIADriverStatus) { s.Rollout = nil }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := base(), base()
			tc.edit(&b)
			if got := mayWait(a, b); got != tc.counts {
				t.Errorf("mayWait = %v, want %v", got, tc.counts)
			}
			if a.Pools[0].Ready != 3 || a.Conditions[0].Message == "" || a.Rollout.Done != 3 {
				t.Error("mayWait changed its argument")
			}
		})
	}
}

// While nodes are in flight the pools' counts may still wait, the rollout's
// may not: they show the wave moving.
func TestMayWaitInFlight(t *testing.T) {
	flying := func() v1alpha1.NVIDIADriverStatus {
		return v1alpha1.NVIDIADriverStatus{
			Pools:   []v1alpha1.PoolStatus{{OSTag: "ubuntu22.04", DaemonSet: "ds", Ready: 3}},
			Rollout: &v1alpha1.RolloutStatus{Revision: "r2", Total: 10, Done: 3, InFlight: 2},
		}
	}
	a, b := flying(), flying()
	b.Pools[0].Ready = 4
	if !mayWait(a, b) {
		t.Error("pool count with the rollout unchanged: want it to wait")
	}
	b = flying()
	b.Rollout.Done, b.Rollout.InFlight = 4, 1
	if mayWait(a, b) {
		t.Error("a node finished mid-wave: want it written at once")
	}
	b = flying()
	b.Rollout.Done = 4 // a node outside the machine counted done (one joined)
	if mayWait(a, b) {
		t.Error("rollout count mid-wave: want it written at once")
	}
}
