package doctor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nvdriver/nvdriver/pkg/plan"
)

// testCA returns a CA valid until notAfter and a certificate it signed, PEM.
func testCA(t *testing.T, notAfter time.Time) (caPEM, certPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: notAfter.Add(-48 * time.Hour),
		NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"}, NotBefore: tmpl.NotBefore, NotAfter: notAfter}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})
}

func TestWebhookFindings(t *testing.T) {
	now := time.Now()
	ca, cert := testCA(t, now.Add(time.Hour))
	otherCA, _ := testCA(t, now.Add(time.Hour))
	expiredCA, _ := testCA(t, now.Add(-time.Hour))
	healthy := func() *Webhook {
		return &Webhook{Configured: true, Name: "nvdriver-webhook", Endpoint: "https://127.0.0.1:9443/x", CABundle: ca, ServingCert: cert, ReadyEndpoints: -1}
	}
	with := func(f func(*Webhook)) *Webhook { w := healthy(); f(w); return w }
	cases := []struct {
		name     string
		w        *Webhook
		rules    string
		severity string // "" = no finding
		message  string
	}{
		{"not looked at", nil, "", "", ""},
		{"healthy, URL", healthy(), "", "", ""},
		{"healthy, Service", with(func(w *Webhook) { w.Endpoint, w.ReadyEndpoints = "Service gpu-operator/nvdriver-webhook", 2 }), "", "", ""},
		{"NVIDIA's operator has none", &Webhook{}, plan.RulesGPUOperator, "", ""},
		{"forbidden", &Webhook{Forbidden: "forbidden: User cannot get"}, "", Info, "cannot check the admission webhook (forbidden"},
		{"not configured", &Webhook{}, "", Info, "no admission webhook is configured: kubectl apply accepts an NVIDIADriver that overlaps another"},
		{"no caBundle", with(func(w *Webhook) { w.CABundle = nil }), "", Warning, "has no caBundle, so kube-apiserver cannot call it"},
		{"garbage caBundle", with(func(w *Webhook) { w.CABundle = []byte("garbage") }), "", Warning, "holds no valid CA (no PEM certificate)"},
		{"expired CA", with(func(w *Webhook) { w.CABundle = expiredCA }), "", Warning, "holds no valid CA (expired "},
		{"certificate from another CA", with(func(w *Webhook) { w.CABundle = otherCA }), "", Warning, "not signed by a CA in the caBundle"},
		{"both CAs during a rotation", with(func(w *Webhook) { w.CABundle = append(append([]byte{}, otherCA...), ca...) }), "", "", ""},
		{"silent", with(func(w *Webhook) { w.Unanswered = "connection refused" }), "", Warning, "at https://127.0.0.1:9443/x does not answer (connection refused): kubectl apply accepts"},
		{"no ready pod", with(func(w *Webhook) { w.Endpoint, w.ReadyEndpoints = "Service gpu-operator/nvdriver-webhook", 0 }), "", Warning, "no ready controller pod behind the admission webhook's Service gpu-operator/nvdriver-webhook"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := checkWebhook(&Snapshot{Now: now, Namespace: "gpu-operator", Webhook: c.w, Rules: c.rules}, nil)
			if c.severity == "" {
				if len(got) != 0 {
					t.Fatalf("want no finding, got %+v", got)
				}
				return
			}
			if len(got) != 1 || got[0].Severity != c.severity || !strings.Contains(got[0].Message, c.message) {
				t.Fatalf("got %+v\nwant one %s finding with %q", got, c.severity, c.message)
			}
			if f := got[0].Fix; f != "" && !strings.HasPrefix(f, "kubectl ") {
				t.Errorf("fix %q is not a kubectl command", f)
			}
		})
	}
}
