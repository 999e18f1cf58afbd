package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// defaultSpec is the plugin's copy of the CRD's defaults (for CRs read from
// files, which the API server has not defaulted). The CRD is the source: an
// empty spec defaulted here must hold exactly the CRD's top-level defaults,
// so a default added to or changed in the CRD fails this test until
// defaultSpec follows.
func TestDefaultSpecIsTheCRDs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "charts", "nvdriver", "crds", "nvidia.com_nvidiadrivers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties map[string]struct {
									Default any `json:"default"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{}
	for name, p := range crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties {
		if p.Default != nil {
			want[name] = p.Default
		}
	}
	var s v1alpha1.NVIDIADriverSpec
	defaultSpec(&s)
	raw, _ := json.Marshal(s)
	got := map[string]any{}
	_ = json.Unmarshal(raw, &got)
	delete(got, "manager") // a struct, never omitted; empty
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaultSpec gives %v; the CRD defaults %v", got, want)
	}
}
