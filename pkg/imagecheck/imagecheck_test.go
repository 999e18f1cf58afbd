package imagecheck_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
)

func push(t *testing.T, r *registrytest.Registry, ref string) {
	t.Helper()
	if err := r.Push(ref); err != nil {
		t.Fatal(err)
	}
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
	open := registrytest.StartTest(t, "", "")
	push(t, open, "nvidia/driver:550.90.07-ubuntu22.04")
	if err := open.PushIndex("nvidia/driver:550.90.07-multi", v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "linux", Architecture: "arm64"}); err != nil {
		t.Fatal(err)
	}
	if err := open.PushIndex("nvidia/driver:550.90.07-amd64only", v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "unknown", Architecture: "unknown"}); err != nil {
		t.Fatal(err)
	}

	private := registrytest.StartTest(t, "admin", "s3cret")
	push(t, private, "nvidia/driver:550.90.07-ubuntu22.04")
	good := pullSecret(private.Host, "admin", "s3cret")
	wrong := pullSecret(private.Host, "admin", "guess")

	down := registrytest.StartTest(t, "", "")
	down.SetDown(true)

	cases := []struct {
		name      string
		image     string
		platforms []string
		secrets   []corev1.Secret
		want      imagecheck.Status
		reason    string
		message   string
	}{
		{name: "existing tag", image: open.Host + "/nvidia/driver:550.90.07-ubuntu22.04", platforms: []string{"linux/amd64"}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "missing tag", image: open.Host + "/nvidia/driver:999.0.0-ubuntu22.04", want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "missing repository", image: open.Host + "/nvidia/nosuch:1", want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "missing digest", image: open.Host + "/nvidia/driver@sha256:" + strings.Repeat("0", 64), want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "index with the nodes' platforms", image: open.Host + "/nvidia/driver:550.90.07-multi", platforms: []string{"linux/arm64", "linux/amd64"}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "index without the nodes' platform", image: open.Host + "/nvidia/driver:550.90.07-amd64only", platforms: []string{"linux/arm64"}, want: imagecheck.Missing, reason: imagecheck.ReasonMissing,
			message: "the image index has no manifest for linux/arm64 (it has linux/amd64)"},
		{name: "auth required, no secret", image: private.Host + "/nvidia/driver:550.90.07-ubuntu22.04", want: imagecheck.Unknown, reason: imagecheck.ReasonAuth},
		{name: "auth required, wrong secret", image: private.Host + "/nvidia/driver:550.90.07-ubuntu22.04", secrets: []corev1.Secret{wrong}, want: imagecheck.Unknown, reason: imagecheck.ReasonAuth},
		{name: "auth required, right secret", image: private.Host + "/nvidia/driver:550.90.07-ubuntu22.04", secrets: []corev1.Secret{good}, want: imagecheck.OK, reason: imagecheck.ReasonFound},
		{name: "auth required, right secret, missing tag", image: private.Host + "/nvidia/driver:1.0-ubuntu22.04", secrets: []corev1.Secret{good}, want: imagecheck.Missing, reason: imagecheck.ReasonMissing},
		{name: "registry down", image: down.Host + "/nvidia/driver:550.90.07-ubuntu22.04", want: imagecheck.Unknown, reason: imagecheck.ReasonUnreachable},
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
	reg := registrytest.StartTest(t, "", "")
	now := time.Unix(1_000_000, 0)
	var asked atomic.Int64
	c := &imagecheck.Checker{Now: func() time.Time { return now }, MinBackoff: 30 * time.Second, MaxBackoff: 100 * time.Second, TTL: time.Hour,
		OnRequest: func(imagecheck.Result) { asked.Add(1) }}
	req := imagecheck.Request{Image: reg.Host + "/nvidia/driver:2.0-ubuntu22.04", Platforms: []string{"linux/amd64"}}

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
	push(t, reg, "nvidia/driver:2.0-ubuntu22.04")
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
	if reg.Requests.Load() == 0 {
		t.Fatal("the registry saw no request")
	}
}
