// Package compat checks wire compatibility with NVIDIA's GPU Operator.
package compat

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

func root() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "..")
}

func loadSchema(t *testing.T, path string) *apiextv1.JSONSchemaProps {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1alpha1" {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s has no v1alpha1", path)
	return nil
}

// typeOf names a schema node's type, treating int-or-string as its own type.
func typeOf(s *apiextv1.JSONSchemaProps) string {
	if s.XIntOrString {
		return "int-or-string"
	}
	return s.Type
}

// walk records every property path with its type.
func walk(path string, s *apiextv1.JSONSchemaProps, out map[string]string) {
	out[path] = typeOf(s)
	for name, p := range s.Properties {
		p := p
		walk(path+"."+name, &p, out)
	}
	if s.Items != nil && s.Items.Schema != nil {
		walk(path+"[]", s.Items.Schema, out)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		walk(path+"{}", s.AdditionalProperties.Schema, out)
	}
}

// Every property of NVIDIA's schema exists in ours with the same type, so a
// manifest written for NVIDIA's operator never breaks on ours.
func TestSchemaIsSupersetOfNVIDIAs(t *testing.T) {
	theirs, ours := map[string]string{}, map[string]string{}
	walk("", loadSchema(t, filepath.Join(root(), "test", "testdata", "nvidia", "nvidia.com_nvidiadrivers.yaml")), theirs)
	walk("", loadSchema(t, filepath.Join(root(), "charts", "nvdriver", "crds", "nvidia.com_nvidiadrivers.yaml")), ours)
	if len(theirs) < 200 {
		t.Fatalf("NVIDIA's schema parsed to only %d paths; the walk is broken", len(theirs))
	}
	var missing, mismatched []string
	for p, typ := range theirs {
		got, ok := ours[p]
		switch {
		case !ok:
			missing = append(missing, p)
		case got != typ:
			mismatched = append(mismatched, p+": theirs "+typ+", ours "+got)
		}
	}
	sort.Strings(missing)
	sort.Strings(mismatched)
	for _, p := range missing {
		t.Errorf("missing in our CRD: %s", p)
	}
	for _, p := range mismatched {
		t.Errorf("type differs: %s", p)
	}
	t.Logf("%d NVIDIA property paths checked", len(theirs))
}
