package cli

import (
	"regexp"
	"strings"
	"testing"
)

// An OCI tag, as the distribution spec writes it.
var ociTag = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)

// FuzzValidateVersion: the plugin's early version check never panics, and
// whatever it accepts makes a valid image tag (or digest, or branch).
func FuzzValidateVersion(f *testing.F) {
	for _, v := range []string{"", "535", "550.90.07", "sha256:" + strings.Repeat("a", 64), "-1", "a b", strings.Repeat("9", 129)} {
		f.Add(v, false)
		f.Add(v, true)
	}
	f.Fuzz(func(t *testing.T, v string, precompiled bool) {
		if err := validateVersion(v, precompiled); err != nil {
			return
		}
		switch {
		case precompiled:
			if v == "" || strings.Trim(v, "0123456789") != "" {
				t.Fatalf("precompiled version %q accepted: a branch is digits only", v)
			}
		case strings.HasPrefix(v, "sha256:"):
			if len(v) != len("sha256:")+64 {
				t.Fatalf("digest %q accepted", v)
			}
		default:
			if !ociTag.MatchString(v) {
				t.Fatalf("version %q accepted but is not an image tag", v)
			}
		}
	})
}
