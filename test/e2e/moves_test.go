package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// Deleting an NVIDIADriver whose node falls back to the default driver swaps
// the driver only after the node is cordoned and its GPU job evicted: the
// owner label changes last, and the deleted CR goes once its node is released.
// A node leaving its CR — the CR deleted (its node falls to the default) or
// the node relabelled to another CR — is cordoned and emptied of GPU jobs
// before its driver pod goes or its owner label changes.
func TestMovesDrainTheNodeFirst(t *testing.T) {
	for _, tc := range []struct {
		name, to string
		leave    func(t *testing.T)
	}{
		{"delete the CR", "mv-default", func(t *testing.T) { kubectl(t, "delete", "nvidiadriver", "mv-a", "--wait=false") }},
		{"relabel the node", "mv-b", func(t *testing.T) { kubectl(t, "label", "node", "gpu-node-3", "mv=b", "--overwrite") }},
	} {
		t.Run(tc.name, func(t *testing.T) { moveScenario(t, tc.to, tc.leave) })
	}
}

func moveScenario(t *testing.T, to string, leave func(t *testing.T)) {
	labelNodes(t, "mv", "a", "gpu-node-3")
	deleteCRs(t, "mv-a", "mv-b", "mv-default")
	applyStdin(t, `apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: mv-a}
spec: {version: "535.104.12", nodeSelector: {mv: a}, upgradePolicy: {podDeletion: {force: true}}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: mv-b}
spec: {version: "550.54.15", nodeSelector: {mv: b}, upgradePolicy: {podDeletion: {force: true}}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: mv-default}
spec: {default: true, version: "550.90.07", upgradePolicy: {podDeletion: {force: true}}}
`) // the GPU job below is a bare pod: force lets the move evict it
	wantVersion := map[string]string{"mv-b": "550.54.15", "mv-default": "550.90.07"}[to]
	eventually(t, 90*time.Second, "mv-a on gpu-node-3", func() error { return driversRunning(t, "mv-a", 1) })
	workloadNamespace(t, gpuNS)
	applyStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: job, namespace: %s}
spec:
  nodeName: gpu-node-3
  automountServiceAccountToken: false
  containers: [{name: cuda, image: nvcr.io/nvidia/cuda:12.4.0-base, resources: {limits: {nvidia.com/gpu: "1"}}}]
`, gpuNS))
	eventually(t, 30*time.Second, "the GPU job running", func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: gpuNS, Name: "job"}, p); err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	var oldPod string
	for _, p := range driverPods(t) {
		if p.Spec.NodeName == "gpu-node-3" {
			oldPod = p.Name
		}
	}

	leave(t)
	var problems []string
	movedSeen, oldGoneSeen := false, false
	eventually(t, 2*time.Minute, "gpu-node-3 moved to "+to+" and done", func() error {
		n := &corev1.Node{}
		_ = k8s.Get(context.Background(), clientKey("gpu-node-3"), n)
		jobThere := k8s.Get(context.Background(), client.ObjectKey{Namespace: gpuNS, Name: "job"}, &corev1.Pod{}) == nil
		oldAlive := false
		for _, p := range driverPods(t) {
			if p.Name == oldPod && p.DeletionTimestamp == nil {
				oldAlive = true
			}
		}
		if n.Labels[plan.LabelOwner] == to && !movedSeen {
			movedSeen = true
			if jobThere {
				problems = append(problems, "the owner label moved while the GPU job still ran")
			}
		}
		if !oldAlive && !oldGoneSeen {
			oldGoneSeen = true
			if jobThere {
				problems = append(problems, "the old driver pod went while the GPU job still ran")
			}
		}
		if n.Labels[plan.LabelOwner] != to || n.Labels[upgrade.LabelState] != upgrade.StateDone || n.Spec.Unschedulable {
			return fmt.Errorf("owner %q state %q unschedulable %v", n.Labels[plan.LabelOwner], n.Labels[upgrade.LabelState], n.Spec.Unschedulable)
		}
		for _, p := range driverPods(t) {
			if p.Spec.NodeName == "gpu-node-3" && p.DeletionTimestamp == nil && !strings.Contains(p.Spec.Containers[0].Image, wantVersion) {
				return fmt.Errorf("gpu-node-3 runs %s", p.Spec.Containers[0].Image)
			}
		}
		if to == "mv-default" {
			if err := k8s.Get(context.Background(), clientKey("mv-a"), &v1alpha1.NVIDIADriver{}); err == nil {
				return fmt.Errorf("mv-a still exists (finalizer)")
			}
		}
		return nil
	})
	for _, p := range problems {
		t.Error(p)
	}
	if !movedSeen || !oldGoneSeen {
		t.Errorf("move not observed (label moved %v, old pod gone %v)", movedSeen, oldGoneSeen)
	}
}
