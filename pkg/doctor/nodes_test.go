package doctor

import (
	"strings"
	"testing"
	"time"

	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// A failed node's stored reason is quoted, and a PodDisruptionBudget that
// blocked its eviction is named with the command that shows it.
func TestFailedNodesNameTheirReasonAndTheBudget(t *testing.T) {
	pdb := gpuNode("n1", plan.LabelUpgradeState, plan.UpgradeFailed)
	pdb.Annotations = map[string]string{upgrade.AnnotationFailure: "1 GPU pod(s) still on the node after 1m0s of eviction (eviction of ml/job-0 refused: " +
		"The disruption budget job-pdb needs 1 healthy pods and has 1 currently (PodDisruptionBudget in namespace ml))"}
	other := gpuNode("n2", plan.LabelUpgradeState, plan.UpgradeFailed)
	other.Annotations = map[string]string{upgrade.AnnotationFailure: "the new driver pod p did not become Ready within 10m0s"}
	s := &Snapshot{Now: time.Now(), Namespace: "gpu-operator"}

	s.Nodes = append(s.Nodes, pdb, other)
	fs := checkUpgrades(s, nil)
	if len(fs) != 1 {
		t.Fatalf("%+v", fs)
	}
	f := fs[0]
	for _, want := range []string{"2 node(s) ended upgrade-failed: n1, n2", "n1: 1 GPU pod(s) still on the node", "n2: the new driver pod p did not become Ready",
		"PodDisruptionBudget ml/job-pdb allows no eviction"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message %q lacks %q", f.Message, want)
		}
	}
	if f.Fix != "kubectl -n ml get pdb job-pdb -o wide; kubectl label node n1 nvidia.com/gpu-driver-upgrade-state=upgrade-required --overwrite" {
		t.Errorf("fix %q", f.Fix)
	}

	// Without a budget in the reason: the driver pod is what to look at.
	s.Nodes = s.Nodes[1:]
	if f := checkUpgrades(s, nil)[0]; !strings.HasPrefix(f.Fix, "kubectl -n gpu-operator get pods -o wide --field-selector spec.nodeName=n2;") {
		t.Errorf("fix %q", f.Fix)
	}
}
