package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ---- the simulated GPU nodes ----

// createNodes adds the GPU nodes in batches, each waiting for kwok to make
// them Ready, with nothing else running (heartbeats lag on a busy apiserver).
// Nodes the converge phase already made are kept.
func (e *env) createNodes() error {
	start := time.Now()
	have := e.gpuNodes()
	for first := have; first < *nodesN; first += *batch {
		if err := e.createNodeRange(first, min(first+*batch, *nodesN)); err != nil {
			return err
		}
	}
	if have < *nodesN {
		res.Values["nodes_create_seconds"] = time.Since(start).Seconds()
	}
	return nil
}

// gpuNodes counts the bench's nodes in the cluster.
func (e *env) gpuNodes() int {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := e.c.List(context.Background(), list, client.HasLabels{groupLabel}); err != nil {
		return 0
	}
	return len(list.Items)
}

// createNodeRange creates bench-node-<from> … bench-node-<to-1> and waits
// for all of them to be Ready.
func (e *env) createNodeRange(from, to int) error {
	if _, err := sh(nil, "go", "run", "./test/cluster/nodes", "--kubeconfig", e.kubeconfig, "--gpu-nodes", fmt.Sprint(to-from),
		"--start", fmt.Sprint(from), "--prefix", "bench-node", "--extras=false",
		"--os", "ubuntu20.04,ubuntu22.04,rhel9.4,rocky8.10",
		"--kernels", "5.15.0-84-generic,5.15.0-78-generic,5.4.0-150-generic,6.8.0-45-generic,5.14.0-427.el9.x86_64,4.18.0-553.el8.x86_64",
		"--group-label", groupLabel, "--groups", fmt.Sprint(groups), "--parallel", "32"); err != nil {
		return err
	}
	if err := poll(10*time.Minute, fmt.Sprintf("%d nodes Ready", to), func() (bool, error) {
		list := &corev1.NodeList{}
		if err := e.c.List(context.Background(), list, client.HasLabels{groupLabel}); err != nil {
			return false, err
		}
		ready := 0
		for _, nd := range list.Items {
			for _, c := range nd.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= to, nil
	}); err != nil {
		return err
	}
	logf("%d/%d nodes Ready", to, *nodesN)
	return nil
}
