//go:build !linux

package controller

import "time"

// onThread runs f; without a per-thread CPU clock the gate falls back to
// the pass's wall time.
func onThread(f func()) (time.Duration, bool) {
	f()
	return 0, false
}
