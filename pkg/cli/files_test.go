package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericclioptions"
)

func TestReadDriverFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	seed := filepath.Join("..", "..", "test", "testdata", "seed", "nvd-driver-multiple.yaml")
	notYAML := write("notes.yaml", "just some words\n")
	cm := write("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
	nested := write("sub/deep/one.yaml", "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: deep}\nspec: {version: 550.90.07}\n")
	list := write("list.yaml", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: nvidia.com/v1alpha1\n  kind: NVIDIADriver\n  metadata: {name: in-list}\n  spec: {version: 550.90.07}\n")
	_ = nested
	flags := genericclioptions.NewConfigFlags(false)
	for _, tc := range []struct {
		name      string
		paths     []string
		recursive bool
		stdin     string
		want      []string // driver names
		err       string
	}{
		{name: "seed file", paths: []string{seed}, want: []string{"demo-gold", "demo-silver"}},
		{name: "stdin", paths: []string{"-"}, stdin: "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: s}\nspec: {version: \"1.0\"}\n", want: []string{"s"}},
		{name: "unquoted number", paths: []string{"-"}, stdin: "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: s}\nspec: {version: 535}\n", err: `quote it in YAML, e.g. version: "535"`},
		{name: "empty stdin", paths: []string{"-"}, stdin: "", err: "no objects passed to preview"},
		{name: "not YAML", paths: []string{notYAML}, err: "notes.yaml is not a Kubernetes manifest"},
		{name: "another kind", paths: []string{cm}, err: "ConfigMap/x is not an NVIDIADriver"},
		{name: "a List is flattened", paths: []string{list}, want: []string{"in-list"}},
		{name: "recursive directory", paths: []string{filepath.Join(dir, "sub")}, recursive: true, want: []string{"deep"}},
		{name: "missing file", paths: []string{filepath.Join(dir, "nope.yaml")}, err: "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readDriverFiles(flags, tc.paths, tc.recursive, strings.NewReader(tc.stdin))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range got {
				names = append(names, d.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("read %v, want %v", names, tc.want)
			}
		})
	}
}
