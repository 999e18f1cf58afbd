package integration

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/controller"
)

func TestControllerEnsuresDriverPodObjects(t *testing.T) {
	startController(t)
	ctx := context.Background()
	// The controller creates them itself, with nothing but its own start.
	sa := &corev1.ServiceAccount{}
	cm := &corev1.ConfigMap{}
	eventually(t, "the driver pods' ServiceAccount and startup probe ConfigMap", func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: driverNS, Name: "nvidia-driver"}, sa); err != nil {
			return err
		}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: driverNS, Name: "nvidia-driver-startup-probe"}, cm); err != nil {
			return err
		}
		if cm.Data["startup-probe.sh"] == "" {
			return fmt.Errorf("empty probe script")
		}
		return nil
	})
	// Deleted or edited by hand while the controller runs: restored.
	if err := k8s.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "nvidia-driver"}, role); err != nil {
		t.Fatal(err)
	}
	role.Rules = role.Rules[:1]
	if err := k8s.Update(ctx, role); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted ConfigMap and the edited ClusterRole restored", func() error {
		fresh := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cm), fresh); err != nil {
			return err
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(role), role); err != nil {
			return err
		}
		if len(role.Rules) < 4 {
			return fmt.Errorf("ClusterRole has %d rule(s)", len(role.Rules))
		}
		cm = fresh
		return nil
	})
	// A second pass over objects in place writes nothing.
	var writes atomic.Int64
	ccfg := rest.CopyConfig(cfg)
	ccfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet {
				writes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	c, err := client.New(ccfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.EnsureDriverPodObjects(ctx, c, driverNS); err != nil {
		t.Fatal(err)
	}
	if w := writes.Load(); w != 0 {
		t.Errorf("ensuring objects already in place made %d write(s)", w)
	}
	// Drift is repaired.
	cm.Data["startup-probe.sh"] = "tampered"
	if err := k8s.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := controller.EnsureDriverPodObjects(ctx, c, driverNS); err != nil {
		t.Fatal(err)
	}
	_ = k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	if cm.Data["startup-probe.sh"] == "tampered" {
		t.Error("drifted ConfigMap was not repaired")
	}
}

// Level-triggered: a DaemonSet edited by hand (its image changed, a
// toleration deleted) is restored with the controller running.
func TestControllerRepairsHandEditedDaemonSet(t *testing.T) {
	startController(t)
	ctx := context.Background()
	scenario(t, []*corev1.Node{gpuNode("he-a", "ubuntu", "22.04", "", map[string]string{"he": "yes"})},
		nvd("he", `{"version": "550.90.07", "nodeSelector": {"he": "yes"}, "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}`))
	var ds appsv1.DaemonSet
	eventually(t, "he's DaemonSet", func() error {
		got := driverDaemonSets(t)["he"]
		if len(got) != 1 {
			return fmt.Errorf("%d DaemonSets", len(got))
		}
		ds = got[0]
		return nil
	})
	want := ds.Spec.Template.Spec.Containers[0].Image
	tolerates := func(d *appsv1.DaemonSet, key string) bool {
		for _, tol := range d.Spec.Template.Spec.Tolerations {
			if tol.Key == key {
				return true
			}
		}
		return false
	}
	if !tolerates(&ds, "gpu") {
		t.Fatalf("the rendered DaemonSet lacks the CR's toleration: %+v", ds.Spec.Template.Spec.Tolerations)
	}
	edit := ds.DeepCopy()
	edit.Spec.Template.Spec.Containers[0].Image = "example.com/tampered:1"
	var kept []corev1.Toleration
	for _, tol := range edit.Spec.Template.Spec.Tolerations {
		if tol.Key != "gpu" {
			kept = append(kept, tol)
		}
	}
	edit.Spec.Template.Spec.Tolerations = kept
	if err := k8s.Update(ctx, edit); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hand edit reverted", func() error {
		cur := &appsv1.DaemonSet{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(&ds), cur); err != nil {
			return err
		}
		if img := cur.Spec.Template.Spec.Containers[0].Image; img != want {
			return fmt.Errorf("image %s", img)
		}
		if !tolerates(cur, "gpu") {
			return fmt.Errorf("toleration not restored")
		}
		return nil
	})
}
