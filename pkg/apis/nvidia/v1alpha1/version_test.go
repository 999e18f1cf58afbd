package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The plugin's early check and admission share one rule: the generated CRD's
// CEL rules must quote exactly the patterns ValidateVersion uses.
func TestCRDUsesTheVersionPatterns(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "charts", "nvdriver", "crds", "nvidia.com_nvidiadrivers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	var rules []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["rule"].(string); ok {
				rules = append(rules, r)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(crd)
	all := strings.Join(rules, "\n")
	for _, p := range []string{VersionTagPattern, VersionDigestPattern, VersionBranchPattern} {
		if !strings.Contains(all, "self.version.matches('"+p+"')") {
			t.Errorf("the CRD's CEL rules do not use the pattern %s: change the marker in nvidiadriver_types.go and run make manifests", p)
		}
	}
}

func TestValidateVersion(t *testing.T) {
	for _, tc := range []struct {
		v           string
		precompiled bool
		admit       bool // ValidateVersion
		intent      bool // CheckVersionIntent
		want        string
	}{
		{"550.90.07", false, true, true, ""},
		{"535", true, true, true, ""},
		{"sha256:" + strings.Repeat("a", 64), false, true, true, ""},
		{"", false, false, false, `invalid version ""`},
		{"535.104.12", true, false, false, "branch such as 535"},
		{"sha256:abc", false, false, false, "64 lower-case hex"},
		{"5 3 5", false, false, false, "image tag"},
		{"-1", false, false, false, "image tag"},
		{strings.Repeat("9", 129), false, false, false, "at most 128"},
		{"550.90.07-ubuntu22.04", false, true, false, `ends in the OS tag "ubuntu22.04"`},
		{"550.90.07-rhel9.4", false, true, false, "give the driver version alone, e.g. 550.90.07"},
		{"v550.90.07", false, true, false, "use 550.90.07"},
		{"535", false, true, false, "--precompiled"},
		{"550.90.07-grid", false, true, true, ""},
	} {
		t.Run(tc.v, func(t *testing.T) {
			err := ValidateVersion(tc.v, tc.precompiled)
			if (err == nil) != tc.admit {
				t.Errorf("ValidateVersion(%q, %v) = %v, want admitted=%v", tc.v, tc.precompiled, err, tc.admit)
			}
			err = CheckVersionIntent(tc.v, tc.precompiled)
			if (err == nil) != tc.intent {
				t.Fatalf("CheckVersionIntent(%q, %v) = %v, want ok=%v", tc.v, tc.precompiled, err, tc.intent)
			}
			if err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
		})
	}
}
