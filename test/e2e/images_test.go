package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// startRegistry runs a real registry on loopback for the test, with the
// controller restarted to check images against it (short backoff) and put
// back as the suite runs it afterwards.
func startRegistry(t *testing.T) *registrytest.Registry {
	t.Helper()
	reg, err := registrytest.Start("127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	stopController()
	if err := startController("--image-check=enforce", "--image-check-backoff=2s", "--image-check-max-backoff=4s"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopController()
		if err := startController(); err != nil {
			t.Errorf("restarting the controller: %v", err)
		}
	})
	return reg
}

func imageCondition(t *testing.T, name string) (*metav1.Condition, *metav1.Condition) {
	d := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(context.Background(), clientKey(name), d); err != nil {
		return nil, nil
	}
	return meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionImageAvailable), meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionReady)
}

// A version bump to a tag the registry does not have cordons nothing,
// evicts nothing and restarts no driver pod (sampled all along); the CR says
// which image and which nodes wait. Pushing the tag lets the rollout finish
// by itself, within the backoff.
func TestMissingImageHoldsTheRollout(t *testing.T) {
	reg := startRegistry(t)
	const ns = "e2e-images"
	workloadNamespace(t, ns)
	if out, err := run("go", "run", "./test/cluster/nodes", "--kubeconfig", kubeconfig, "--prefix", "img", "--gpu-nodes", "3", "--os", "ubuntu22.04", "--extras=false"); err != nil {
		t.Fatalf("creating nodes: %v\n%s", err, out)
	}
	nodes := []string{"img-0", "img-1", "img-2"}
	t.Cleanup(func() { _, _ = run("kubectl", append([]string{"delete", "node", "--ignore-not-found"}, nodes...)...) })
	labelNodes(t, "img", "yes", nodes...)
	deleteCRs(t, "img")
	oldImage, newImage := reg.Host+"/nvidia/driver:535.104.12-ubuntu22.04", reg.Host+"/nvidia/driver:550.90.07-ubuntu22.04"
	if err := reg.Push(oldImage); err != nil {
		t.Fatal(err)
	}
	applyStdin(t, fmt.Sprintf(`apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: img}
spec:
  repository: %s/nvidia
  version: "535.104.12"
  nodeSelector: {img: "yes"}
  upgradePolicy:
    maxParallelUpgrades: 0
    maxUnavailable: "100%%"
    podDeletion: {force: true}
`, reg.Host))
	eventually(t, 2*time.Minute, "img on 3 nodes", func() error { return driversRunning(t, "img", 3) })
	for _, n := range nodes {
		applyStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: job-%[1]s, namespace: %[2]s}
spec:
  nodeName: %[1]s
  automountServiceAccountToken: false
  containers: [{name: c, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, n, ns))
	}
	driverPodNames := func() map[string]string {
		out := map[string]string{}
		for _, p := range driverPods(t) {
			if strings.HasPrefix(p.Spec.NodeName, "img-") {
				out[p.Spec.NodeName] = p.Name
			}
		}
		return out
	}
	var before map[string]string
	eventually(t, time.Minute, "a driver pod and a GPU job on each node", func() error {
		before = driverPodNames()
		jobs := kubectl(t, "get", "pods", "-n", ns, "-o", "jsonpath={range .items[*]}{.status.phase} {end}")
		if len(before) != 3 || strings.Count(jobs, "Running") != 3 {
			return fmt.Errorf("driver pods %v, jobs %s", before, jobs)
		}
		return nil
	})

	// Sample until the tag is pushed: nothing may move.
	var mu sync.Mutex
	var problems []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var found []string
			for _, n := range ownedNodes(t, "img") {
				if n.Spec.Unschedulable {
					found = append(found, n.Name+" cordoned")
				}
				if s := n.Labels[upgrade.LabelState]; s != upgrade.StateDone {
					found = append(found, n.Name+" in "+s)
				}
			}
			pods := &corev1.PodList{}
			if err := k8s.List(context.Background(), pods, client.InNamespace(ns)); err == nil {
				if len(pods.Items) != 3 {
					found = append(found, fmt.Sprintf("%d GPU jobs", len(pods.Items)))
				}
				for _, p := range pods.Items {
					if p.DeletionTimestamp != nil {
						found = append(found, p.Name+" being deleted")
					}
				}
			}
			for node, name := range driverPodNames() {
				if before[node] != name {
					found = append(found, "driver pod on "+node+" replaced")
				}
			}
			mu.Lock()
			problems = append(problems, found...)
			mu.Unlock()
		}
	}()

	kubectl(t, "patch", "nvidiadriver/img", "--type=merge", `-p={"spec":{"version":"550.90.07"}}`)
	eventually(t, time.Minute, "the CR to report the missing image", func() error {
		c, ready := imageCondition(t, "img")
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != imagecheck.ReasonMissing {
			return fmt.Errorf("ImageAvailable: %v", c)
		}
		for _, want := range []string{newImage, "3 node(s): img-0, img-1, img-2", "no node is cordoned"} {
			if !strings.Contains(c.Message, want) {
				return fmt.Errorf("message %q lacks %q", c.Message, want)
			}
		}
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != imagecheck.ReasonMissing {
			return fmt.Errorf("Ready: %v", ready)
		}
		return nil
	})
	events := kubectl(t, "get", "events", "-A", "--field-selector", "involvedObject.name=img,reason=ImageMissing", "-o", "jsonpath={range .items[*]}{.note}{.message}{\"\\n\"}{end}")
	if !strings.Contains(events, newImage) {
		t.Errorf("no ImageMissing event naming %s: %q", newImage, events)
	}
	// Held through several checks (2s, 4s, 4s ...), not just the first.
	checks := (&replica{metrics: ctrlMetrics}).metric("nvdriver_registry_checks_total", `status="missing"`)
	eventually(t, time.Minute, "three more checks of the missing tag", func() error {
		if n := (&replica{metrics: ctrlMetrics}).metric("nvdriver_registry_checks_total", `status="missing"`); n < checks+3 {
			return fmt.Errorf("%v checks", n)
		}
		return nil
	})
	// The registry stops answering: "cannot ask" is not "it exists", so the
	// pool stays held (sampled all along).
	reg.SetDown(true)
	unknown := (&replica{metrics: ctrlMetrics}).metric("nvdriver_registry_checks_total", `status="unknown"`)
	eventually(t, time.Minute, "two checks against the dead registry", func() error {
		if n := (&replica{metrics: ctrlMetrics}).metric("nvdriver_registry_checks_total", `status="unknown"`); n < unknown+2 {
			return fmt.Errorf("%v checks", n)
		}
		return nil
	})
	if c, _ := imageCondition(t, "img"); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "last answer: not found") {
		t.Errorf("ImageAvailable with the registry down: %v", c)
	}
	reg.SetDown(false)
	close(stop)
	<-done
	mu.Lock()
	for _, p := range dedupe(problems) {
		t.Errorf("while the image was missing: %s", p)
	}
	mu.Unlock()

	pushed := time.Now()
	if err := reg.Push(newImage); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the rollout to finish by itself once the tag exists", func() error {
		if err := allNodesIn(t, "img", 3, upgrade.StateDone); err != nil {
			return err
		}
		running := driverPodNames()
		for _, p := range driverPods(t) {
			if strings.HasPrefix(p.Spec.NodeName, "img-") && (p.Spec.Containers[0].Image != newImage || running[p.Spec.NodeName] == before[p.Spec.NodeName]) {
				return fmt.Errorf("%s runs %s", p.Spec.NodeName, p.Spec.Containers[0].Image)
			}
		}
		if c, _ := imageCondition(t, "img"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("ImageAvailable: %v", c)
		}
		return nil
	})
	t.Logf("rollout finished %s after the push", time.Since(pushed).Round(100*time.Millisecond))
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
