package nvidia

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func driverDaemonSets(t *testing.T, owner string) []appsv1.DaemonSet {
	t.Helper()
	out := kubectl(t, "get", "ds", "-n", "gpu-operator", "-l", "app.kubernetes.io/component=nvidia-driver", "-o", "json")
	var list appsv1.DaemonSetList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	var mine []appsv1.DaemonSet
	for _, ds := range list.Items {
		for _, ref := range ds.OwnerReferences {
			if ref.Kind == "NVIDIADriver" && ref.Name == owner {
				mine = append(mine, ds)
			}
		}
	}
	return mine
}

func statusOf(t *testing.T, name string) cli.DriverStatus {
	t.Helper()
	code, out, errOut := nvdriver(t, "status", name, "-o", "json")
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
	}
	var r cli.StatusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Drivers) != 1 {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	return r.Drivers[0]
}

// Every verb, with NVIDIA's operator reconciling: assign creates a CR it
// accepts, preview predicts its DaemonSets and images, status reads its
// status, doctor recognises it, assign again keeps the spec, and
// upgrade --wait ends when its rollout does.
func TestVerbsAgainstNVIDIAOperator(t *testing.T) {
	code, out, errOut := nvdriver(t, "assign", "nv-gold", "--nodes", "gpu-node-0,gpu-node-1", "--version", "550.90.07")
	if code != 0 {
		t.Fatalf("assign: exit %d\n%s%s", code, out, errOut)
	}
	t.Cleanup(func() {
		_, _ = run("kubectl", "delete", "nvidiadriver", "nv-gold", "--ignore-not-found", "--wait=true", "--timeout=60s")
	})
	eventually(t, 3*time.Minute, "NVIDIA's operator to run nv-gold", func() error {
		if dss := driverDaemonSets(t, "nv-gold"); len(dss) == 0 {
			return fmt.Errorf("no DaemonSet yet")
		}
		if st := statusOf(t, "nv-gold"); st.State != "ready" {
			return fmt.Errorf("state %q, conditions %+v", st.State, st.Conditions)
		}
		return nil
	})

	// preview predicts NVIDIA's DaemonSet names and images, under its rules.
	code, out, errOut = nvdriver(t, "preview", "nv-gold", "-o", "json")
	if code != 0 || !strings.Contains(errOut, "NVIDIA's GPU Operator") {
		t.Fatalf("preview: exit %d\n%s%s", code, out, errOut)
	}
	var p plan.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatal(err)
	}
	predicted := map[string]string{}
	for _, pool := range p.DriverByName("nv-gold").Pools {
		predicted[pool.DaemonSet] = pool.Image
	}
	for _, ds := range driverDaemonSets(t, "nv-gold") {
		if img := ds.Spec.Template.Spec.Containers[0].Image; predicted[ds.Name] != img {
			t.Errorf("NVIDIA runs DaemonSet %s with %s; preview predicted %v", ds.Name, img, predicted)
		}
	}

	// doctor sees a controller at work and never advises a second one.
	code, out, _ = nvdriver(t, "doctor", "-o", "json")
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor: exit %d: %v\n%s", code, err, out)
	}
	for _, f := range r.Findings {
		if f.Check == "controller-running" && f.Severity == doctor.Error {
			t.Errorf("doctor says no controller runs, with NVIDIA's operator reconciling: %+v", f)
		}
	}

	// The second use: one more node, the spec otherwise unchanged, and
	// NVIDIA's operator still accepts it.
	before := kubectl(t, "get", "nvidiadriver", "nv-gold", "-o", "jsonpath={.spec.repository}/{.spec.image}:{.spec.version}")
	if code, out, errOut := nvdriver(t, "assign", "nv-gold", "--nodes", "gpu-node-2"); code != 0 {
		t.Fatalf("assign again: exit %d\n%s%s", code, out, errOut)
	}
	if after := kubectl(t, "get", "nvidiadriver", "nv-gold", "-o", "jsonpath={.spec.repository}/{.spec.image}:{.spec.version}"); after != before || before != "nvcr.io/nvidia/driver:550.90.07" {
		t.Errorf("spec image before %q, after %q", before, after)
	}

	// upgrade --wait ends when NVIDIA's rollout does (its status has no
	// observedGeneration).
	code, out, errOut = nvdriver(t, "upgrade", "nv-gold", "--to", "550.127.05", "--wait", "--timeout", "8m")
	if code != 0 || !strings.Contains(out, "upgraded") {
		t.Fatalf("upgrade --wait against NVIDIA's operator: exit %d\n%s%s\noperator log:\n%s", code, out, errOut, operatorLog())
	}
	for _, ds := range driverDaemonSets(t, "nv-gold") {
		if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.Contains(img, "550.127.05") {
			t.Errorf("DaemonSet %s still runs %s", ds.Name, img)
		}
	}
}
