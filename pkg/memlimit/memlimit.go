// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit (docs/design.md, "Memory").
package memlimit

import (
	"fmt"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"
)

// EnvContainerLimit carries the container's memory limit, in bytes or as a
// quantity ("256Mi"); the Helm chart sets it from the pod's own
// resources.limits.memory.
const EnvContainerLimit = "NVDRIVER_MEMORY_LIMIT"

// Fraction of the container limit the runtime aims to stay under. Half, not
// the usual nine tenths: the other half is room for what the runtime does
// not bound (a relist after an API server restart holds a second copy of the
// cache while it is decoded), so a peak is absorbed rather than OOM-killed,
// and a cluster with thousands of nodes does not settle at twice its live
// heap.
const Fraction = 0.5

// Soft is the soft limit for a container limit (0: none).
func Soft(containerLimit int64) int64 {
	if containerLimit <= 0 {
		return 0
	}
	return int64(float64(containerLimit) * Fraction)
}

// Apply sets the soft limit from EnvContainerLimit, unless GOMEMLIMIT is set
// (the admin's word wins) or the container has no limit. It returns the
// limit set (0: none) and an error for a limit it cannot read.
func Apply() (int64, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	v := os.Getenv(EnvContainerLimit)
	if v == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a memory quantity (bytes, or e.g. 256Mi): %w", EnvContainerLimit, v, err)
	}
	soft := Soft(q.Value())
	if soft > 0 {
		debug.SetMemoryLimit(soft)
	}
	return soft, nil
}
