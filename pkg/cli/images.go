package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// imageCheckParallel bounds the registry requests in flight from the
// admin's machine.
const imageCheckParallel = 8

// planImages asks the registries, from the admin's machine, about every
// image the plan's pools would run, with the admin's docker credentials plus
// each CR's pull Secrets where they may be read (docs/design.md, "Image
// preflight"). It fills Pool.ImageCheck and, for precompiled drivers,
// Driver.KernelImages, and returns the missing images.
type planImages struct {
	reader  client.Reader
	checker *imagecheck.Checker
	// namespace holds the pull Secrets when a CR's status does not say.
	namespace string
	base      authn.Keychain
}

type imageJob struct {
	req imagecheck.Request
	out *plan.ImageCheck
}

func newPlanImages(c client.Reader, namespace string) *planImages {
	if namespace == "" {
		namespace = "gpu-operator"
	}
	return &planImages{reader: c, checker: &imagecheck.Checker{}, namespace: namespace, base: authn.DefaultKeychain}
}

func (pi *planImages) check(ctx context.Context, p *plan.Plan, drivers []v1alpha1.NVIDIADriver, nodes []plan.Node) (missing []string) {
	specs := map[string]*v1alpha1.NVIDIADriver{}
	for i := range drivers {
		specs[drivers[i].Name] = &drivers[i]
	}
	labelsOf := make(map[string]map[string]string, len(nodes))
	for _, n := range nodes {
		labelsOf[n.Name] = n.Labels
	}
	var jobs []imageJob
	for di := range p.Drivers {
		d := &p.Drivers[di]
		cr := specs[d.Name]
		if cr == nil || d.Error != nil {
			continue
		}
		kc, creds := pi.keychain(ctx, cr)
		for i := range d.Pools {
			pool := &d.Pools[i]
			platforms := platformsOf(pool.Nodes, labelsOf)
			imgs := pool.Images()
			pool.ImageCheck = make([]plan.ImageCheck, len(imgs))
			for j, img := range imgs {
				jobs = append(jobs, imageJob{req: imagecheck.Request{Image: img, Platforms: platforms, Keychain: kc, Credentials: creds}, out: &pool.ImageCheck[j]})
			}
		}
		if cr.Spec.UsePrecompiled != nil && *cr.Spec.UsePrecompiled {
			jobs = append(jobs, kernelJobs(d, cr, nodes, kc, creds)...)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(imageCheckParallel)
	for _, j := range jobs {
		g.Go(func() error {
			res, _ := pi.checker.Check(gctx, j.req)
			*j.out = plan.ImageCheck{Image: res.Image, Status: string(res.Status), Reason: res.Reason, Message: res.Message}
			return nil
		})
	}
	_ = g.Wait()
	seen := map[string]bool{}
	for _, d := range p.Drivers {
		for _, pool := range d.Pools {
			for _, c := range pool.ImageCheck {
				if c.Status == string(imagecheck.Missing) && !seen[c.Image] {
					seen[c.Image] = true
					missing = append(missing, c.Image)
				}
			}
		}
	}
	sort.Strings(missing)
	return missing
}

// kernelJobs check a precompiled driver's image for every (OS, kernel) the
// cluster's GPU nodes run, so a kernel without an image shows before a node
// boots into it or is moved to the driver.
func kernelJobs(d *plan.Driver, cr *v1alpha1.NVIDIADriver, nodes []plan.Node, kc authn.Keychain, creds string) []imageJob {
	selected := map[string]bool{}
	for _, n := range d.SelectedNodes {
		selected[n] = true
	}
	type key struct{ os, kernel string }
	byKey := map[key]*plan.KernelImage{}
	platforms := map[key]map[string]bool{}
	for _, n := range nodes {
		if !plan.IsGPUNode(n.Labels) || n.Labels[plan.LabelKernel] == "" || plan.Excluded(n.Labels) != "" {
			continue
		}
		osTag, _, ok := plan.OSTag(n.Labels)
		if !ok {
			continue
		}
		k := key{osTag, n.Labels[plan.LabelKernel]}
		ki := byKey[k]
		if ki == nil {
			ki = &plan.KernelImage{OSTag: osTag, Kernel: k.kernel}
			byKey[k] = ki
			platforms[k] = map[string]bool{}
		}
		ki.Nodes++
		if selected[n.Name] {
			ki.Selected++
		}
		platforms[k][imagecheck.Platform(n.Labels)] = true
	}
	keys := make([]key, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].os != keys[j].os {
			return keys[i].os < keys[j].os
		}
		return keys[i].kernel < keys[j].kernel
	})
	d.KernelImages = make([]plan.KernelImage, 0, len(keys))
	for _, k := range keys {
		d.KernelImages = append(d.KernelImages, *byKey[k])
	}
	var jobs []imageJob
	for i, k := range keys {
		img, err := plan.Image(&cr.Spec, k.os, k.kernel)
		ki := &d.KernelImages[i]
		if err != nil {
			ki.Check = plan.ImageCheck{Image: "-", Status: string(imagecheck.Unknown), Reason: imagecheck.ReasonInvalid, Message: err.Error()}
			continue
		}
		jobs = append(jobs, imageJob{req: imagecheck.Request{Image: img, Platforms: slices.Sorted(maps.Keys(platforms[k])), Keychain: kc, Credentials: creds}, out: &ki.Check})
	}
	return jobs
}

// keychain is the admin's docker credentials plus the CR's pull Secrets
// that can be read; a Secret that cannot (not found, forbidden) is left out
// and the registry's answer says what that means.
func (pi *planImages) keychain(ctx context.Context, cr *v1alpha1.NVIDIADriver) (authn.Keychain, string) {
	ns := cr.Status.Namespace
	if ns == "" {
		ns = pi.namespace
	}
	var secrets []corev1.Secret
	for _, ref := range pullSecretNames(cr) {
		s := corev1.Secret{}
		if pi.reader != nil && pi.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref}, &s) == nil {
			secrets = append(secrets, s)
		}
	}
	kc, creds, err := imagecheck.SecretsKeychain(ctx, secrets, pi.base)
	if err != nil {
		return pi.base, "+base"
	}
	return kc, creds
}

func platformsOf(nodes []string, labelsOf map[string]map[string]string) []string {
	set := map[string]bool{}
	for _, n := range nodes {
		set[imagecheck.Platform(labelsOf[n])] = true
	}
	return slices.Sorted(maps.Keys(set))
}

func pullSecretNames(cr *v1alpha1.NVIDIADriver) []string {
	refs := render.PullSecrets(&cr.Spec)
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.Name
	}
	return out
}

// planChecked tells whether preview asked the registries (the REGISTRY
// column and the image sections appear only then).
func planChecked(p plan.Plan) bool {
	for _, d := range p.Drivers {
		for _, pool := range d.Pools {
			if len(pool.ImageCheck) > 0 {
				return true
			}
		}
	}
	return false
}

// poolRegistry is a pool's REGISTRY cell: the worst answer of its images.
func poolRegistry(pool plan.Pool, st *output.Styles) string {
	if len(pool.ImageCheck) == 0 {
		return "-"
	}
	worst := pool.ImageCheck[0]
	for _, c := range pool.ImageCheck[1:] {
		if rank(c.Status) > rank(worst.Status) {
			worst = c
		}
	}
	cell := worst.Status
	if worst.Image != pool.Image && worst.Status != string(imagecheck.OK) {
		cell += " (" + worst.Image + ")"
	}
	return styleCheck(cell, worst.Status, st)
}

func rank(status string) int {
	switch status {
	case string(imagecheck.Missing):
		return 2
	case string(imagecheck.Unknown):
		return 1
	}
	return 0
}

func styleCheck(cell, status string, st *output.Styles) string {
	switch status {
	case string(imagecheck.OK):
		return st.OK(cell)
	case string(imagecheck.Missing):
		return st.Bad(cell)
	}
	return st.Warn(cell)
}

// imageSections are the table sections about images: each image that is
// not ok with why, and each precompiled driver's images by kernel.
func imageSections(p plan.Plan, st *output.Styles) []planSection {
	var problems [][]string
	seen := map[string]bool{}
	var secs []planSection
	for _, d := range p.Drivers {
		for _, pool := range d.Pools {
			for _, c := range pool.ImageCheck {
				if c.Status != string(imagecheck.OK) && !seen[c.Image] {
					seen[c.Image] = true
					problems = append(problems, []string{c.Image, styleCheck(c.Status, c.Status, st), imageWhy(c)})
				}
			}
		}
		if len(d.KernelImages) == 0 {
			continue
		}
		var rows [][]string
		lacking := 0
		for _, k := range d.KernelImages {
			if k.Check.Status == string(imagecheck.Missing) {
				lacking++
			}
			rows = append(rows, []string{k.Kernel, k.OSTag, kernelNodes(k), k.Check.Image, styleCheck(k.Check.Status, k.Check.Status, st)})
		}
		title := "Precompiled images of " + d.Name + " by kernel seen on GPU nodes"
		if lacking > 0 {
			title = st.Bad(title + ": " + itoa(lacking) + " kernel(s) lack an image")
		}
		secs = append(secs, planSection{title: title, headers: []string{"kernel", "os", "nodes", "image", "registry"}, rows: rows, keepOrder: true})
	}
	if len(problems) > 0 {
		secs = append([]planSection{{title: st.Bad("Images the registry did not confirm (" + itoa(len(problems)) + ")"), headers: []string{"image", "registry", "why"}, rows: problems}}, secs...)
	}
	return secs
}

func imageWhy(c plan.ImageCheck) string {
	switch {
	case c.Status == string(imagecheck.Missing) && c.Message != "" && c.Message != "not found in the registry":
		return c.Message
	case c.Status == string(imagecheck.Missing):
		return "not found in the registry: under imageCheck=enforce (the default) the controller rolls no node of the pool onto it until it exists"
	}
	return c.Reason + ": " + c.Message
}

func kernelNodes(k plan.KernelImage) string {
	if k.Selected == k.Nodes {
		return itoa(k.Nodes)
	}
	return itoa(k.Nodes) + " (" + itoa(k.Selected) + " selected)"
}

func itoa(n int) string { return strconv.Itoa(n) }

// checkImages, after a version change (made or dry-run), says per pool
// whether the new version's images exist: a warning for a real change (the
// controller holds the pool until they do), findings (exit 3) for a dry run.
func (o *UpgradeOptions) checkImages(ctx context.Context, c client.Reader, d *v1alpha1.NVIDIADriver) error {
	if !o.CheckImages {
		return nil
	}
	in, err := readInputs(ctx, c, namespaceFlag(o.Flags))
	if err != nil {
		return err
	}
	drivers := append([]v1alpha1.NVIDIADriver(nil), in.drivers...)
	for i := range drivers {
		if drivers[i].Name == d.Name {
			drivers[i].Spec.Version = o.To
		}
	}
	p := plan.ComputeWith(in.nodes, drivers, plan.Options{})
	if err := filterPlan(&p, []string{d.Name}); err != nil {
		return nil // not in the plan: nothing to check
	}
	missing := newPlanImages(c, namespaceFlag(o.Flags)).check(ctx, &p, drivers, in.nodes)
	pd := p.DriverByName(d.Name)
	for _, pool := range pd.Pools {
		for _, ic := range pool.ImageCheck {
			line := fmt.Sprintf("image %s for %s (%d node(s)): %s", ic.Image, pool.DaemonSet, len(pool.Nodes), ic.Status)
			switch ic.Status {
			case plan.ImageStatusOK:
				fmt.Fprintln(o.Streams.ErrOut, line)
			case plan.ImageStatusMissing:
				fmt.Fprintf(o.Streams.ErrOut, "warning: %s: under imageCheck=enforce (the default) the controller rolls no node of this pool onto it until it exists\n", line)
			default:
				fmt.Fprintf(o.Streams.ErrOut, "warning: %s: could not check (%s: %s)\n", line, ic.Reason, ic.Message)
			}
		}
	}
	if len(missing) > 0 && o.DryRun != "none" {
		return &FindingsError{Msg: fmt.Sprintf("%d image(s) missing from the registry: %s", len(missing), strings.Join(missing, ", "))}
	}
	return nil
}
