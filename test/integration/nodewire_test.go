package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nvdriver/nvdriver/pkg/controller"
)

// The controller's cache lists and watches nodes through a client that
// trims them on the wire (docs/design.md, "Node cache"). Against a real API
// server: what it lists and watches has lost the managed fields, the images
// and all conditions but Ready, and kept what the cache reads; a single
// node read through the same client is whole.
func TestCacheClientTrimsNodesOnTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pcfg := rest.CopyConfig(cfg)
	controller.ClientConfig(pcfg)
	opts, err := controller.CacheOptions(pcfg, driverNS)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfigAndClient(pcfg, opts.HTTPClient)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := kubernetes.NewForConfig(pcfg)
	if err != nil {
		t.Fatal(err)
	}

	const name = "wire-trim-node"
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia.com/gpu.present": "true"},
			Annotations: map[string]string{"nvidia.com/gpu-driver-upgrade-state.move-to": "x"}},
		Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}},
	}
	created, err := plain.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	created.Status = corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		},
		NodeInfo: corev1.NodeSystemInfo{KernelVersion: "5.15.0-84-generic"},
		Images:   []corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/driver:550.90.07-ubuntu22.04"}, SizeBytes: 1 << 30}},
	}
	if _, err := plain.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	checkTrimmed := func(how string, n *corev1.Node, label string) {
		t.Helper()
		if len(n.ManagedFields) != 0 || len(n.Status.Images) != 0 || n.Status.NodeInfo.KernelVersion != "" {
			t.Errorf("%s: managed fields %d, images %d, kernel %q: not trimmed", how, len(n.ManagedFields), len(n.Status.Images), n.Status.NodeInfo.KernelVersion)
		}
		if len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != corev1.NodeReady || n.Status.Conditions[0].Status != corev1.ConditionTrue {
			t.Errorf("%s: conditions %+v, want the Ready one alone", how, n.Status.Conditions)
		}
		if n.Labels[label] != "true" || n.Annotations["nvidia.com/gpu-driver-upgrade-state.move-to"] != "x" || !n.Spec.Unschedulable || !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "nvidia.com/gpu" }) || n.UID == "" {
			t.Errorf("%s: lost what the cache reads: labels %v, annotations %v, spec %+v, uid %q", how, n.Labels, n.Annotations, n.Spec, n.UID)
		}
	}

	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for i := range list.Items {
		if list.Items[i].Name == name {
			found = true
			checkTrimmed("listed", &list.Items[i], "nvidia.com/gpu.present")
		}
	}
	if !found {
		t.Fatalf("%s not listed", name)
	}

	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	patch := []byte(`{"metadata":{"labels":{"nvidia.com/gpu.deploy.driver":"true"}}}`)
	if _, err := plain.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		n, ok := ev.Object.(*corev1.Node)
		if ev.Type != watch.Modified || !ok {
			t.Fatalf("watch: %s %T, want a modified Node", ev.Type, ev.Object)
		}
		checkTrimmed("watched", n, "nvidia.com/gpu.deploy.driver")
	case <-ctx.Done():
		t.Fatal("no watch event for the label patch")
	}

	one, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.ManagedFields) == 0 || len(one.Status.Images) != 1 || len(one.Status.Conditions) != 2 {
		t.Errorf("a single node read was trimmed: managed fields %d, images %d, conditions %d", len(one.ManagedFields), len(one.Status.Images), len(one.Status.Conditions))
	}
}
