//go:build tools

// Package tools pins krew and its manifest validator for the packaging tests.
package tools

import (
	_ "sigs.k8s.io/krew/cmd/krew"
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
