package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"
)

// The version patterns. The CRD's CEL rules on NVIDIADriverSpec use the same
// expressions (a test compares them with the generated CRD), so the plugin's
// early check and admission never disagree. See docs/design.md, "Versions".
const (
	// VersionTagPattern is an OCI tag: what spec.version must be for a
	// non-precompiled driver (the OS tag is appended to it).
	VersionTagPattern = `^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`
	// VersionDigestPattern pins an image by digest (no OS tag appended).
	VersionDigestPattern = `^sha256:[a-f0-9]{64}$`
	// VersionBranchPattern is a driver branch: the only version a precompiled
	// driver takes (the kernel and OS tag are appended).
	VersionBranchPattern = `^[0-9]+$`
)

var (
	versionTag    = regexp.MustCompile(VersionTagPattern)
	versionDigest = regexp.MustCompile(VersionDigestPattern)
	versionBranch = regexp.MustCompile(VersionBranchPattern)
	// osSuffix catches a version that already carries the OS tag the
	// controller appends (550.90.07-ubuntu22.04 would become
	// 550.90.07-ubuntu22.04-ubuntu22.04).
	osSuffix = regexp.MustCompile(`-(ubuntu|rhel|rhcos|rocky|ol|sles|centos|debian|amzn|azurelinux)[0-9][0-9.]*$`)
)

// IsBranch reports whether v is a driver branch such as 535.
func IsBranch(v string) bool { return versionBranch.MatchString(v) }

// ValidateVersion is admission's rule for spec.version (the CRD's CEL rules
// say the same): a branch when precompiled, else an image tag or a digest.
func ValidateVersion(v string, precompiled bool) error {
	switch {
	case v == "":
		return fmt.Errorf("invalid version \"\": give a driver version such as 550.90.07 (a branch such as 535 for precompiled drivers)")
	case precompiled:
		if !versionBranch.MatchString(v) {
			return fmt.Errorf("invalid version %q: with precompiled drivers the version is a branch such as 535 (digits only), not a full version or a digest", v)
		}
	case strings.HasPrefix(v, "sha256:"):
		if !versionDigest.MatchString(v) {
			return fmt.Errorf("invalid version %q: a digest is sha256: and 64 lower-case hex digits", v)
		}
	case !versionTag.MatchString(v):
		return fmt.Errorf("invalid version %q: use an image tag such as 550.90.07 (letters, digits, '.', '_', '-'; at most 128 characters)", v)
	}
	return nil
}

// CheckVersionIntent goes beyond admission: it refuses versions that are
// valid tags but cannot be what the user meant, because the image the
// controller builds from them does not exist in NVIDIA's registry. The CRD
// still accepts them (NVIDIA's does), so manifests stay portable; the plugin
// refuses to write them and the plan warns about them.
func CheckVersionIntent(v string, precompiled bool) error {
	if err := ValidateVersion(v, precompiled); err != nil {
		return err
	}
	if precompiled || strings.HasPrefix(v, "sha256:") {
		return nil
	}
	if m := osSuffix.FindString(v); m != "" {
		return fmt.Errorf("invalid version %q: it already ends in the OS tag %q, which the controller appends per node pool (the image would be ...:%s%s); give the driver version alone, e.g. %s",
			v, m[1:], v, m, strings.TrimSuffix(v, m))
	}
	if len(v) > 1 && (v[0] == 'v' || v[0] == 'V') && v[1] >= '0' && v[1] <= '9' {
		return fmt.Errorf("invalid version %q: NVIDIA's driver images are tagged without a leading v; use %s", v, v[1:])
	}
	if IsBranch(v) {
		return fmt.Errorf("invalid version %q: that is a driver branch, and only precompiled drivers are published per branch; give a full version such as %s.104.12 (or create the NVIDIADriver with --precompiled)", v, v)
	}
	return nil
}
