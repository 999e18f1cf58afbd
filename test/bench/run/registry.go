package main

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// rolloutVersion is what patchDefault rolls the default CR to.
const rolloutVersion = "560.35.03"

// startRegistry runs a real registry on loopback that every bench CR pulls
// from, so the controller's image check (on, as it ships) is measured: how
// many registry requests a first start and a rollout of N nodes cost.
func (e *env) startRegistry() error {
	reg, err := registrytest.Start("127.0.0.1:0", "", "")
	if err != nil {
		return err
	}
	e.reg = reg
	return nil
}

// pushImages pushes every image a CR could run on the bench's nodes (each
// OS release and kernel seen), and the rollout's, so nothing is held and
// the counts are the cost of checking, not of waiting.
func (e *env) pushImages(crs []*v1alpha1.NVIDIADriver) error {
	nodes := &corev1.NodeList{}
	if err := e.c.List(context.Background(), nodes); err != nil {
		return err
	}
	type pair struct{ os, kernel string }
	pairs := map[pair]bool{}
	for _, n := range nodes.Items {
		if os, _, ok := plan.OSTag(n.Labels); ok {
			pairs[pair{os, n.Labels[plan.LabelKernel]}] = true
		}
	}
	images := map[string]bool{}
	add := func(spec *v1alpha1.NVIDIADriverSpec) {
		for p := range pairs {
			kernel := ""
			if spec.IsPrecompiled() {
				kernel = p.kernel
			}
			if img, err := plan.Image(spec, p.os, kernel); err == nil {
				images[img] = true
			}
			side, _ := plan.SidecarImages(spec, p.os)
			for _, img := range side {
				images[img] = true
			}
		}
	}
	for _, d := range crs {
		add(&d.Spec)
		if d.Spec.Default {
			next := d.Spec.DeepCopy()
			next.Version = rolloutVersion
			add(next)
		}
	}
	g := errgroup.Group{}
	g.SetLimit(16)
	for img := range images {
		g.Go(func() error { return e.reg.Push(img) })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("pushing the bench's images: %w", err)
	}
	res.Values["registry_images"] = float64(len(images))
	logf("registry %s: %d images pushed", e.reg.Host, len(images))
	return nil
}
