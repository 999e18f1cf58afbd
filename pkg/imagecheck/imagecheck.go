// Package imagecheck asks a registry whether an image exists before a node is
// rolled onto it (docs/design.md, "Image preflight"). The controller, preview,
// upgrade --dry-run and doctor share it, so they give the same answer for the
// same image.
package imagecheck

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/singleflight"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Status is a check's answer.
type Status string

const (
	// OK: the registry has a manifest for the reference (and, for an index,
	// one for every platform asked about).
	OK Status = plan.ImageStatusOK
	// Missing is definitive: the registry answered that the tag, digest or
	// repository does not exist, or the index lacks a platform the nodes run.
	Missing Status = plan.ImageStatusMissing
	// Unknown: no definitive answer (registry unreachable, credentials
	// refused, a server error, a reference that does not parse).
	Unknown Status = plan.ImageStatusUnknown
)

// Reasons say why a result is what it is; they are also the controller's
// ImageAvailable condition reasons.
const (
	ReasonFound       = v1alpha1.ReasonImagesFound
	ReasonMissing     = v1alpha1.ReasonImageMissing
	ReasonUnreachable = v1alpha1.ReasonRegistryUnreachable
	ReasonAuth        = v1alpha1.ReasonRegistryAuthFailed
	ReasonRegistry    = v1alpha1.ReasonRegistryError
	ReasonInvalid     = v1alpha1.ReasonInvalidReference
)

// Result is the answer for one image.
type Result struct {
	Image  string `json:"image"`
	Status Status `json:"status"`
	Reason string `json:"reason"`
	// Message is the human part: what the registry said.
	Message string `json:"message,omitempty"`
	// StillMissing, on an Unknown result, says the registry's last
	// definitive answer for this image was "not found": a hold stays until
	// the registry says the image exists, not merely until it stops
	// answering.
	StillMissing bool `json:"stillMissing,omitempty"`
}

// String is what tables print: ok, missing, or "unknown: <why>".
func (r Result) String() string {
	switch r.Status {
	case OK:
		return "ok"
	case Missing:
		return "missing"
	}
	return "unknown: " + r.Message
}

// Request is one image to check.
type Request struct {
	Image string
	// Platforms the nodes run, "os/arch" (e.g. linux/amd64); an index must
	// hold a manifest for each. Empty: any.
	Platforms []string
	// Keychain resolves credentials; nil is anonymous.
	Keychain authn.Keychain
	// Credentials names the keychain's source (e.g. the pull Secrets) so a
	// cached answer is never reused for other credentials.
	Credentials string
}

// Checker checks images and remembers the answers: an image that exists is
// asked again after TTL, one that is missing or unknown after a backoff
// that doubles from MinBackoff to MaxBackoff. Concurrent checks of the same
// image share one request. The zero value works with the defaults.
type Checker struct {
	// Transport carries the registry requests (nil: remote.DefaultTransport).
	Transport http.RoundTripper
	// Timeout bounds one check (default 10s).
	Timeout    time.Duration
	TTL        time.Duration // default 10m
	MinBackoff time.Duration // default 30s
	MaxBackoff time.Duration // default 10m
	Now        func() time.Time
	// OnRequest is told of every check that reaches the registry.
	OnRequest func(Result)

	mu      sync.Mutex
	entries map[string]*entry
	flight  singleflight.Group
}

type entry struct {
	result  Result
	next    time.Time
	backoff time.Duration
	// definitive is the last OK or Missing answer.
	definitive Status
}

// Default durations (docs/design.md, "Image preflight").
const (
	DefaultTimeout    = 10 * time.Second
	DefaultTTL        = 10 * time.Minute
	DefaultMinBackoff = 30 * time.Second
	DefaultMaxBackoff = 10 * time.Minute
)

func (c *Checker) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (r Request) key() string {
	p := append([]string(nil), r.Platforms...)
	sort.Strings(p)
	return r.Image + "|" + strings.Join(p, ",") + "|" + r.Credentials
}

// Cached returns the remembered answer while it is fresh, and when to ask
// again; ok is false when the registry must be asked.
func (c *Checker) Cached(req Request) (res Result, next time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[req.key()]
	if e == nil || !c.now().Before(e.next) {
		return Result{}, time.Time{}, false
	}
	return e.result, e.next, true
}

// Check answers from the cache while the answer is fresh and asks the
// registry otherwise. next is when the answer goes stale: a caller holding
// a rollout for a missing image looks again then.
func (c *Checker) Check(ctx context.Context, req Request) (res Result, next time.Time) {
	if res, next, ok := c.Cached(req); ok {
		return res, next
	}
	key := req.key()
	v, _, _ := c.flight.Do(key, func() (any, error) {
		if res, next, ok := c.Cached(req); ok { // answered while we waited
			return [2]any{res, next}, nil
		}
		res := c.ask(ctx, req)
		if c.OnRequest != nil {
			c.OnRequest(res)
		}
		res, next := c.remember(key, res)
		return [2]any{res, next}, nil
	})
	pair := v.([2]any)
	return pair[0].(Result), pair[1].(time.Time)
}

func (c *Checker) remember(key string, res Result) (Result, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]*entry{}
	}
	e := c.entries[key]
	if e == nil {
		e = &entry{}
		c.entries[key] = e
	}
	if res.Status == OK {
		e.backoff = 0
		e.next = c.now().Add(orDefault(c.TTL, DefaultTTL))
	} else {
		switch {
		case e.backoff == 0 || e.result.Status == OK:
			e.backoff = orDefault(c.MinBackoff, DefaultMinBackoff)
		default:
			e.backoff = min(2*e.backoff, orDefault(c.MaxBackoff, DefaultMaxBackoff))
		}
		e.next = c.now().Add(e.backoff)
	}
	switch res.Status {
	case OK, Missing:
		e.definitive = res.Status
	case Unknown:
		res.StillMissing = e.definitive == Missing
	}
	e.result = res
	return res, e.next
}

// ask makes the requests: a HEAD of the manifest, and for an index a GET of
// it to see its platforms.
func (c *Checker) ask(ctx context.Context, req Request) Result {
	res := Result{Image: req.Image}
	ref, err := name.ParseReference(req.Image)
	if err != nil {
		res.Status, res.Reason, res.Message = Unknown, ReasonInvalid, err.Error()
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(c.Timeout, DefaultTimeout))
	defer cancel()
	kc := req.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain() // anonymous
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		// One attempt: our own backoff decides when to ask again.
		remote.WithRetryBackoff(remote.Backoff{Steps: 1}),
	}
	if c.Transport != nil {
		opts = append(opts, remote.WithTransport(c.Transport))
	}
	desc, err := remote.Head(ref, opts...)
	if err != nil {
		return classify(res, err)
	}
	if !desc.MediaType.IsIndex() || len(req.Platforms) == 0 {
		res.Status, res.Reason = OK, ReasonFound
		return res
	}
	idx, err := remote.Index(ref, opts...)
	if err != nil {
		return classify(res, err)
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		return classify(res, err)
	}
	if lacking := lackingPlatforms(manifest, req.Platforms); len(lacking) > 0 {
		res.Status, res.Reason = Missing, ReasonMissing
		res.Message = fmt.Sprintf("the image index has no manifest for %s (it has %s)", strings.Join(lacking, ", "), strings.Join(indexPlatforms(manifest), ", "))
		return res
	}
	res.Status, res.Reason = OK, ReasonFound
	return res
}

func lackingPlatforms(m *v1.IndexManifest, want []string) []string {
	have := map[string]bool{}
	for _, p := range indexPlatforms(m) {
		have[p] = true
	}
	var lacking []string
	for _, p := range want {
		if !have[p] {
			lacking = append(lacking, p)
		}
	}
	sort.Strings(lacking)
	return lacking
}

// indexPlatforms are the index's "os/arch" pairs (variants ignored: a node
// label names the architecture only).
func indexPlatforms(m *v1.IndexManifest) []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range m.Manifests {
		if d.Platform == nil || d.Platform.OS == "unknown" {
			continue // attestations and the like
		}
		p := d.Platform.OS + "/" + d.Platform.Architecture
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// classify turns a registry error into a result: only a registry's own
// "not found" is Missing; everything else is Unknown with its reason.
func classify(res Result, err error) Result {
	res.Status, res.Reason, res.Message = Unknown, ReasonUnreachable, err.Error()
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return res
	}
	for _, d := range terr.Errors {
		switch d.Code {
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
			res.Status, res.Reason, res.Message = Missing, ReasonMissing, "not found in the registry"
			return res
		case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
			res.Reason = ReasonAuth
			return res
		}
	}
	switch terr.StatusCode {
	case http.StatusNotFound:
		res.Status, res.Reason, res.Message = Missing, ReasonMissing, "not found in the registry"
	case http.StatusUnauthorized, http.StatusForbidden:
		res.Reason = ReasonAuth
	default:
		res.Reason = ReasonRegistry
	}
	return res
}

// Platform is a node's "os/arch" from its well-known labels (linux/amd64
// when unlabelled, as the kubelet would label it on such a machine).
func Platform(nodeLabels map[string]string) string {
	goos, arch := nodeLabels["kubernetes.io/os"], nodeLabels["kubernetes.io/arch"]
	if goos == "" {
		goos = "linux"
	}
	if arch == "" {
		arch = "amd64"
	}
	return goos + "/" + arch
}
