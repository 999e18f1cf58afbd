package controller

import (
	"testing"
	"time"
)

// The real clock: a busy loop's CPU is seen, a blocked wait's is not.
func TestOnThread(t *testing.T) {
	cpu, ok := onThread(func() { <-time.After(50 * time.Millisecond) }) // blocked, not running: what is measured
	if !ok {
		t.Fatal("the thread's CPU clock could not be read")
	}
	if cpu > 20*time.Millisecond {
		t.Errorf("a 50ms sleep cost %v of CPU", cpu)
	}
	busy, _ := onThread(func() {
		for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
		}
	})
	if busy < 10*time.Millisecond {
		t.Errorf("30ms of busy loop cost %v of CPU", busy)
	}
}
