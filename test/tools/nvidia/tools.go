//go:build tools

// Package tools pins NVIDIA's GPU Operator, built from its Go module by
// test/tools/build.sh for the opt-in compatibility suite (make test-nvidia).
package tools

import _ "github.com/NVIDIA/gpu-operator/cmd/gpu-operator"
