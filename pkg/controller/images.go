package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// Image check modes (docs/design.md, "Image preflight").
const (
	// ImageCheckEnforce holds a pool whose image the registry says does not
	// exist; an unreachable registry or refused credentials hold nothing.
	ImageCheckEnforce = "enforce"
	// ImageCheckWarn reports what enforce would hold, and holds nothing.
	ImageCheckWarn = "warn"
	// ImageCheckOff asks no registry.
	ImageCheckOff = "off"
)

// ImageCheckModes are the valid modes, for flag validation.
var ImageCheckModes = []string{ImageCheckEnforce, ImageCheckWarn, ImageCheckOff}

// EventImageMissing is the Event when a pool is held (or, in warn mode,
// would be) because its image is not in the registry.
const EventImageMissing = "ImageMissing"

// imageGate decides, before a pool's DaemonSet is created or given a new
// image, whether the registry has the images.
type imageGate struct {
	mode      string
	checker   *imagecheck.Checker
	secrets   client.Reader // the pull Secrets, by name, in the driver namespace
	namespace string
}

// poolImages is the check of one pool.
type poolImages struct {
	DaemonSet string
	Nodes     []string
	Results   []imagecheck.Result
	Held      bool
}

// imageVerdict is the gate's answer for one CR.
type imageVerdict struct {
	// keep: not checked this time (the CR is in error, so nothing is
	// applied); the condition stays as it was.
	keep  bool
	mode  string
	pools []poolImages // only pools checked
	held  map[string]bool
	// next is when the earliest answer that was not ok goes stale.
	next time.Time
}

func (v *imageVerdict) isHeld(ds string) bool { return v != nil && v.held[ds] }

func (v *imageVerdict) anyHeld() bool {
	for _, h := range v.held {
		if h {
			return true
		}
	}
	return false
}

// unsettled: the pool is being created, is getting a new image, or has not
// finished rolling out the one it has; only then is the registry asked.
func unsettled(pool plan.Pool, cur *appsv1.DaemonSet) bool {
	if cur == nil || len(newImages(pool, cur)) > 0 {
		return true
	}
	s := cur.Status
	return s.ObservedGeneration != cur.Generation || s.UpdatedNumberScheduled < s.DesiredNumberScheduled || s.NumberAvailable < s.DesiredNumberScheduled
}

// newImages are the pool's images the live DaemonSet does not run yet.
func newImages(pool plan.Pool, cur *appsv1.DaemonSet) []string {
	have := map[string]bool{}
	if cur != nil {
		for _, c := range cur.Spec.Template.Spec.Containers {
			have[c.Image] = true
		}
	}
	var out []string
	for _, img := range pool.Images() {
		if !have[img] {
			out = append(out, img)
		}
	}
	return out
}

// imageCheckParallel bounds one CR's registry requests in flight: a
// precompiled CR has a pool (and an image) per kernel, and a registry that
// does not answer costs the checker's timeout per request.
const imageCheckParallel = 8

// check asks about every unsettled pool of the CR. Pools are held only in
// enforce mode, only when an image is definitively missing, and only while
// the DaemonSet does not already run it.
func (g *imageGate) check(ctx context.Context, d *v1alpha1.NVIDIADriver, pools []plan.Pool, owned map[string]*appsv1.DaemonSet, platformsOf func(plan.Pool) []string) *imageVerdict {
	if g == nil || g.mode == ImageCheckOff || g.checker == nil {
		return nil
	}
	v := &imageVerdict{mode: g.mode, held: map[string]bool{}}
	kc, creds := g.keychain(ctx, d)
	type job struct {
		pool, image int
		req         imagecheck.Request
	}
	var jobs []job
	var fresh []map[string]bool
	for _, pool := range pools {
		cur := owned[pool.DaemonSet]
		if !unsettled(pool, cur) {
			continue
		}
		platforms := platformsOf(pool)
		f := map[string]bool{}
		for _, img := range newImages(pool, cur) {
			f[img] = true
		}
		imgs := pool.Images()
		for i, img := range imgs {
			jobs = append(jobs, job{pool: len(v.pools), image: i, req: imagecheck.Request{Image: img, Platforms: platforms, Keychain: kc, Credentials: creds}})
		}
		v.pools = append(v.pools, poolImages{DaemonSet: pool.DaemonSet, Nodes: pool.Nodes, Results: make([]imagecheck.Result, len(imgs))})
		fresh = append(fresh, f)
	}
	nexts := make([]time.Time, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, imageCheckParallel)
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			v.pools[j.pool].Results[j.image], nexts[i] = g.checker.Check(ctx, j.req)
		}()
	}
	wg.Wait()
	for i, j := range jobs {
		pi := &v.pools[j.pool]
		res := pi.Results[j.image]
		if res.Status != imagecheck.OK && (v.next.IsZero() || nexts[i].Before(v.next)) {
			v.next = nexts[i]
		}
		// A pool held on "not found" stays held while the registry cannot
		// be asked: only its "it exists" releases the pool.
		if (res.Status == imagecheck.Missing || res.StillMissing) && g.mode == ImageCheckEnforce && fresh[j.pool][res.Image] {
			pi.Held = true
		}
		v.held[pi.DaemonSet] = pi.Held
	}
	return v
}

// keychain reads the CR's pull Secrets only when the registry is asked
// (a cached answer costs no API request). Credentials names the Secrets,
// so an answer is never shared between CRs with different credentials.
func (g *imageGate) keychain(ctx context.Context, d *v1alpha1.NVIDIADriver) (authn.Keychain, string) {
	refs := render.PullSecrets(&d.Spec)
	if len(refs) == 0 || g.secrets == nil {
		return nil, ""
	}
	names := make([]string, len(refs))
	for i, r := range refs {
		names[i] = r.Name
	}
	return &lazyKeychain{load: func() authn.Keychain {
		var secrets []corev1.Secret
		for _, n := range names {
			s := corev1.Secret{}
			if err := g.secrets.Get(ctx, client.ObjectKey{Namespace: g.namespace, Name: n}, &s); err != nil {
				// A missing Secret fails the pods' pulls too; the check goes
				// on without it and says what the registry answers.
				log.FromContext(ctx).V(1).Info("image check: pull Secret not readable", "secret", n, "error", err.Error())
				continue
			}
			secrets = append(secrets, s)
		}
		kc, _, err := imagecheck.SecretsKeychain(ctx, secrets, nil)
		if err != nil {
			return authn.NewMultiKeychain()
		}
		return kc
	}}, g.namespace + "/" + strings.Join(names, ",")
}

// lazyKeychain loads its Secrets on the first Resolve, that is on the first
// request that reaches a registry.
type lazyKeychain struct {
	once sync.Once
	load func() authn.Keychain
	kc   authn.Keychain
}

func (l *lazyKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	l.once.Do(func() { l.kc = l.load() })
	return l.kc.Resolve(r)
}

// condition is the ImageAvailable condition for the verdict: nil when the
// check is off (the condition is then removed).
func (v *imageVerdict) condition(generation int64) *metav1.Condition {
	if v == nil || v.keep {
		return nil
	}
	c := &metav1.Condition{Type: v1alpha1.ConditionImageAvailable, Status: metav1.ConditionTrue, Reason: imagecheck.ReasonFound,
		Message: "The registry has every image being rolled out", ObservedGeneration: generation}
	if len(v.pools) == 0 {
		// Not "found": nothing was asked. Every pool is rolled out and
		// available, so its nodes pulled its images.
		c.Reason, c.Message = v1alpha1.ReasonNothingToCheck, "Every pool is rolled out and available on its images; nothing to check"
		return c
	}
	var missing, unknown []string
	unknownReason := ""
	for _, p := range v.pools {
		for _, r := range p.Results {
			switch {
			case r.Status == imagecheck.Missing:
				missing = append(missing, missingLine(p, r))
			case r.StillMissing:
				missing = append(missing, missingLine(p, r)+" (last answer: not found; the registry cannot be asked now: "+r.Message+")")
			case r.Status == imagecheck.Unknown:
				unknown = append(unknown, fmt.Sprintf("%s: %s", r.Image, r.Message))
				if unknownReason == "" {
					unknownReason = r.Reason
				}
			}
		}
	}
	missing, unknown = dedupe(missing), dedupe(unknown)
	switch {
	case len(missing) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, imagecheck.ReasonMissing
		var what string
		switch {
		case v.anyHeld():
			what = "the pool waits: no node is cordoned or restarted for it; the rollout goes on by itself once the image exists"
		case v.mode == ImageCheckWarn:
			what = "imageCheck is warn: rolling anyway, the new pods will fail to pull"
		default:
			what = "the DaemonSet already runs it, so nothing is held: a driver pod that restarts will fail to pull"
		}
		c.Message = "Image not found in the registry: " + strings.Join(missing, "; ") + "; " + what + " (checked again on a backoff, 30 s doubling to 10 min)"
		if len(unknown) > 0 {
			c.Message += "; could not check: " + strings.Join(unknown, "; ")
		}
	case len(unknown) > 0:
		c.Status, c.Reason = metav1.ConditionUnknown, unknownReason
		c.Message = "Could not check: " + strings.Join(unknown, "; ") + "; not holding (only a registry's \"not found\" holds a rollout)"
	}
	return c
}

func missingLine(p poolImages, r imagecheck.Result) string {
	s := r.Image
	if r.Message != "" && r.Message != "not found in the registry" {
		s += " (" + r.Message + ")"
	}
	return fmt.Sprintf("%s for %s, %d node(s): %s", s, p.DaemonSet, len(p.Nodes), nodeList(p.Nodes, 5))
}

func nodeList(nodes []string, max int) string {
	if len(nodes) <= max {
		return strings.Join(nodes, ", ")
	}
	return strings.Join(nodes[:max], ", ") + fmt.Sprintf(" and %d more", len(nodes)-max)
}

func dedupe(in []string) []string {
	sort.Strings(in)
	out := in[:0]
	for i, s := range in {
		if i == 0 || s != in[i-1] {
			out = append(out, s)
		}
	}
	return out
}
