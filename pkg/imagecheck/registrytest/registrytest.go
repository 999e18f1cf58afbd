// Package registrytest runs a real OCI registry (go-containerregistry's) on
// loopback for tests and the demo: tags are pushed with random layers, and
// the registry can require basic auth or go down.
package registrytest

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is one running registry.
type Registry struct {
	// Host is host:port, to prefix repositories with.
	Host string
	// Requests counts the requests that reached it (pushes included).
	Requests atomic.Int64
	down     atomic.Bool
	user     string
	pass     string
	srv      *http.Server
	ln       net.Listener
}

// Start serves a registry on addr (e.g. 127.0.0.1:0); with user set, every
// request needs that basic-auth user and password.
func Start(addr, user, pass string) (*Registry, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), user: user, pass: pass, ln: ln}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close() // a dead registry: the connection drops
					return
				}
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.Requests.Add(1)
		if user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="registrytest"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, req)
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() { _ = r.srv.Close() }

// SetDown makes every connection drop (true) or serves again (false).
func (r *Registry) SetDown(down bool) { r.down.Store(down) }

func (r *Registry) ref(repoTag string) (name.Reference, error) {
	if !strings.HasPrefix(repoTag, r.Host+"/") {
		repoTag = r.Host + "/" + repoTag
	}
	return name.ParseReference(repoTag)
}

func (r *Registry) auth() remote.Option {
	if r.user == "" {
		return remote.WithAuth(authn.Anonymous)
	}
	return remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass})
}

// Push pushes a small random single-platform image as repoTag
// ("nvidia/driver:550.90.07-ubuntu22.04", with or without the host).
func (r *Registry) Push(repoTag string) error {
	ref, err := r.ref(repoTag)
	if err != nil {
		return err
	}
	img, err := random.Image(64, 1)
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img, r.auth()); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}

// PushIndex pushes an image index with one random image per platform.
func (r *Registry) PushIndex(repoTag string, platforms ...v1.Platform) error {
	ref, err := r.ref(repoTag)
	if err != nil {
		return err
	}
	var idx v1.ImageIndex = empty.Index
	for _, p := range platforms {
		img, err := random.Image(64, 1)
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	if err := remote.WriteIndex(ref, idx, r.auth()); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}

// Delete removes a tag's manifest.
func (r *Registry) Delete(repoTag string) error {
	ref, err := r.ref(repoTag)
	if err != nil {
		return err
	}
	return remote.Delete(ref, r.auth())
}

// StartTest starts a registry on loopback for a test and stops it at the
// test's end.
func StartTest(t testing.TB, user, pass string) *Registry {
	t.Helper()
	r, err := Start("127.0.0.1:0", user, pass)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// Offline adds --check-images=false to a plugin command line whose verb
// asks registries (preview, doctor, upgrade), unless it sets the flag: the
// test clusters' CRs name public images, which no test may ask about.
func Offline(args []string) []string {
	if len(args) == 0 || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--check-images") }) {
		return args
	}
	switch args[0] {
	case "preview", "doctor", "upgrade":
		return append(slices.Clone(args), "--check-images=false")
	}
	return args
}
