package controller

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// onThread runs f with its goroutine locked to one OS thread and returns
// the CPU time that thread spent meanwhile: what f cost this process,
// without the time it waited for a core (docs/design.md, "What wakes a
// pass"). Work f hands to other goroutines (its concurrent API calls) is
// not in it; ok is false when the clock cannot be read.
func onThread(f func()) (cpu time.Duration, ok bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var t0, t1 unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t0) != nil {
		f()
		return 0, false
	}
	f()
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t1) != nil {
		return 0, false
	}
	return time.Duration(t1.Nano() - t0.Nano()), true
}
