package imagecheck_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/imagecheck"
)

// testRegistry is an in-process OCI registry on loopback, optionally behind
// basic auth, counting the requests that reach it.
type testRegistry struct {
	host     string
	requests atomic.Int64
	down     atomic.Bool
	srv      *httptest.Server
}

func newRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			_ = conn.Close()
			return
		}
		r.requests.Add(1)
		if user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) push(t *testing.T, ref string, opts ...remote.Option) {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, r.host+"/"+ref), img, opts...); err != nil {
		t.Fatal(err)
	}
}

func (r *testRegistry) pushIndex(t *testing.T, ref string, platforms ...v1.Platform) {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for _, p := range platforms {
		img, err := random.Image(64, 1)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	if err := remote.WriteIndex(mustRef(t, r.host+"/"+ref), idx); err != nil {
		t.Fatal(err)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func pullSecret(host, user, pass string) corev1.Secret {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": auth}}})
	return corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: "gpu-operator", ResourceVersion: "1"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}
}

func TestCheck(t *testing.T) {
	open := newRegistry(t, "", "")
	open.push(t, "nvidia/driver:550.90.07-ubuntu22.04")
	open.pushIndex(t, "nvidia/driver:550.90.07-multi", v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "linux", Architecture: "arm64"})
	open.pushIndex(t, "nvidia/driver:550.90.07-amd64only", v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "unknown", Architecture: "unknown"})

	private := newRegistry(t, "admin", "s3cret")
	private.push(t, "nvidia/driver:550.90.07-ubuntu22.04", remote.WithAuth(&authn.Basic{Username: "admin", Password: "s3cret"}))
	good := pullSecret(private.host, "admin", "s3cret")
	wrong := pullSecret(private.host, "admin", "guess")

	down := newRegistry(t, "", "")
	down.down.Store(true)

	cases := []struct {
		name      string
		image     string
		platforms []string
		secrets   []corev1.Secret
		want      imagecheck.Status
		reason    string
		message   string
	}{
		{name: "existing tag", image: open.host + "/nvidia/driver:550.90.07-ubuntu22.04", platforms: []string{"linux/amd64"}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "missing tag", image: open.host + "/nvidia/driver:999.0.0-ubuntu22.04", want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "missing repository", image: open.host + "/nvidia/nosuch:1", want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "missing digest", image: open.host + "/nvidia/driver@sha256:" + strings.Repeat("0", 64), want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "index with the nodes' platforms", image: open.host + "/nvidia/driver:550.90.07-multi", platforms: []string{"linux/arm64", "linux/amd64"}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "index without the nodes' platform", image: open.host + "/nvidia/driver:550.90.07-amd64only", platforms: []string{"linux/arm64"}, want: imagecheck.Missing, reason: imagecheck.ReasonMissing,
			message: "the image index has no manifest for linux/arm64 (it has linux/amd64)"},
		{name: "auth required, no secret", image: private.host + "/nvidia/driver:550.90.07-ubuntu22.04", want: imagecheck.Unknown, reason: imagecheck.ReasonAuth},
		{name: "auth required, wrong secret", image: private.host + "/nvidia/driver:550.90.07-ubuntu22.04", secrets: []corev1.Secret{wrong}, want: imagecheck.Unknown, reason: imagecheck.ReasonAuth},
		{name: "auth required, right secret", image: private.host + "/nvidia/driver:550.90.07-ubuntu22.04", secrets: []corev1.Secret{good}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "auth required, right secret, missing tag", image: private.host + "/nvidia/driver:1.0-ubuntu22.04", secrets: []corev1.Secret{good}, want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "registry down", image: down.host + "/nvidia/driver:550.90.07-ubuntu22.04", want: imagecheck.Unknown, reason: imagecheck.ReasonUnreachable},
		{name: "not a reference", image: "nvcr.io/nvidia/Driver:UPPER case", want: imagecheck.Unknown, reason: imagecheck.ReasonInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &imagecheck.Checker{Timeout: 5 * time.Second}
			req := imagecheck.Request{Image: tc.image, Platforms: tc.platforms}
			if tc.secrets != nil {
				kc, creds, err := imagecheck.SecretsKeychain(context.Background(), tc.secrets, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Keychain, req.Credentials = kc, creds
			}
			res, _ := c.Check(context.Background(), req)
			if res.Status != tc.want || res.Reason != tc.reason {
				t.Fatalf("Check(%s) = %s/%s (%s), want %s/%s", tc.image, res.Status, res.Reason, res.Message, tc.want, tc.reason)
			}
			if tc.message != "" && res.Message != tc.message {
				t.Errorf("message = %q, want %q", res.Message, tc.message)
			}
		})
	}
}

// The cache: one request per image per interval, whatever the number of
// callers; a missing image is asked again on a doubling backoff and found
// once it is pushed.
func TestCheckCachesAndBacksOff(t *testing.T) {
	reg := newRegistry(t, "", "")
	now := time.Unix(1_000_000, 0)
	var asked atomic.Int64
	c := &imagecheck.Checker{Now: func() time.Time { return now }, MinBackoff: 30 * time.Second, MaxBackoff: 100 * time.Second, TTL: time.Hour,
		OnRequest: func(imagecheck.Result) { asked.Add(1) }}
	req := imagecheck.Request{Image: reg.host + "/nvidia/driver:2.0-ubuntu22.04", Platforms: []string{"linux/amd64"}}

	for i := 0; i < 100; i++ {
		if res, _ := c.Check(context.Background(), req); res.Status != imagecheck.Missing {
			t.Fatalf("check %d: %s", i, res.Status)
		}
	}
	if asked.Load() != 1 {
		t.Fatalf("100 checks within the backoff made %d registry checks, want 1", asked.Load())
	}
	_, next := c.Check(context.Background(), req)
	for i, want := range []time.Duration{60 * time.Second, 100 * time.Second, 100 * time.Second} {
		now = next // stale: the next check asks again
		if _, next = c.Check(context.Background(), req); next.Sub(now) != want {
			t.Fatalf("backoff after %d re-check(s) = %s, want %s", i+1, next.Sub(now), want)
		}
	}
	if asked.Load() != 4 {
		t.Fatalf("4 stale checks made %d registry checks", asked.Load())
	}
	before := asked.Load()
	reg.push(t, "nvidia/driver:2.0-ubuntu22.04")
	if res, _ := c.Check(context.Background(), req); res.Status != imagecheck.Missing {
		t.Fatalf("within the backoff the cached answer stands, got %s", res.Status)
	}
	now = next
	if res, next := c.Check(context.Background(), req); res.Status != imagecheck.OK || next.Sub(now) != time.Hour {
		t.Fatalf("after the push and the backoff: %s, fresh for %s; want ok for 1h", res.Status, next.Sub(now))
	}
	if asked.Load() != before+1 {
		t.Fatalf("finding the pushed tag made %d registry checks, want 1", asked.Load()-before)
	}
	if reg.requests.Load() == 0 {
		t.Fatal("the registry saw no request")
	}
}
