package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// Valid at admission, impossible at runtime: a secretEnv Secret that does not
// exist gives a condition naming it and the fix, not a hot retry loop; once
// the Secret exists the CR recovers.
func TestControllerMissingSecretEnv(t *testing.T) {
	startController(t)
	ctx := context.Background()
	scenario(t, []*corev1.Node{gpuNode("se-0", "ubuntu", "22.04", "", map[string]string{"se": "yes"})},
		nvd("se", `{"version": "550.90.07", "nodeSelector": {"se": "yes"}, "secretEnv": "se-missing"}`))
	eventually(t, "se reports the missing Secret", func() error {
		d := getDriver(t, "se")
		if err := conditionIs(d, "Error", metav1.ConditionTrue, "ReconcileFailed"); err != nil {
			return err
		}
		if m := meta.FindStatusCondition(d.Status.Conditions, "Error").Message; !strings.Contains(m, "Secret "+driverNS+"/se-missing, which does not exist") || !strings.Contains(m, "kubectl -n "+driverNS+" create secret generic se-missing") {
			return fmt.Errorf("message: %q", m)
		}
		if d.Status.State != v1alpha1.NotReady {
			return fmt.Errorf("state %q", d.Status.State)
		}
		return nil
	})
	// The DaemonSet is there all the same: pods start as soon as the Secret does.
	if len(driverDaemonSets(t)["se"]) != 1 {
		t.Errorf("want the pool's DaemonSet applied, got %v", names(driverDaemonSets(t)))
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "se-missing", Namespace: driverNS}, StringData: map[string]string{"KEY": "v"}}
	if err := k8s.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, sec) })
	// Secrets are not watched: the CR is looked at again within 30 s; poke it
	// (a label change) so the test need not wait that long.
	d := getDriver(t, "se")
	patch := client.MergeFrom(d.DeepCopy())
	d.Labels = map[string]string{"poke": "1"}
	if err := k8s.Patch(ctx, d, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "se no longer in error", func() error {
		return conditionIs(getDriver(t, "se"), "Error", metav1.ConditionFalse, "Ready")
	})
}
