package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the certificate Secret. The CA's key is never stored: each
// rotation makes a new CA, so nothing can sign with an old one.
const (
	keyCert     = corev1.TLSCertKey       // the certificate every replica serves
	keyKey      = corev1.TLSPrivateKeyKey //
	keyCA       = "ca.crt"                // the bundle the API server trusts
	keyNextCert = "next.crt"              // issued, trusted, not yet served
	keyNextKey  = "next.key"
	// annotationNextIssued is when next.crt was issued and its CA added to
	// the bundle: it is served once the API server has had a check interval
	// to learn the bundle.
	annotationNextIssued = "nvdriver.io/next-certificate-issued"
)

// Certs keeps the webhook's serving certificate: in a Secret shared by every
// replica, with its CA in the ValidatingWebhookConfiguration's caBundle, and
// in Dir, where the webhook server's certwatcher reloads it. docs/design.md,
// "Admission", describes the rotation.
type Certs struct {
	Client        client.Client // direct: runs before the manager's cache
	Namespace     string
	Secret        string
	Configuration string
	Endpoint      Endpoint
	Validity      time.Duration
	Dir           string
	Log           logr.Logger
	Now           func() time.Time // nil: time.Now
}

// Interval is how often the certificate is checked: a tenth of its validity,
// at most a minute.
func (c *Certs) Interval() time.Duration {
	return min(c.Validity/10, time.Minute)
}

func (c *Certs) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Start checks the certificate every Interval until ctx ends (a manager
// Runnable; every replica runs it, none needs the Lease).
func (c *Certs) Start(ctx context.Context) error {
	t := time.NewTicker(c.Interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := c.Sync(ctx); err != nil {
				c.Log.Error(err, "keeping the webhook certificate")
			}
		}
	}
}

// NeedLeaderElection is false: every replica serves the webhook.
func (c *Certs) NeedLeaderElection() bool { return false }

// Sync makes the Secret, the caBundle and the files in Dir current: it issues
// a certificate when there is none usable, prepares the next one when a third
// of the validity is left, and serves the next one an interval after its CA
// was published.
func (c *Certs) Sync(ctx context.Context) error {
	sec, err := c.secret(ctx)
	if err != nil {
		return err
	}
	data := maps.Clone(sec.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	now := c.now()
	cur, curErr := parsePair(data[keyCert], data[keyKey])
	switch {
	case curErr != nil || !c.usable(cur, now):
		// Nothing served can be trusted (first start, expired, other hosts):
		// a new certificate at once.
		if err := c.issueInto(data, keyCert, keyKey, nil, now); err != nil {
			return err
		}
		delete(data, keyNextCert)
		delete(data, keyNextKey)
		delete(sec.Annotations, annotationNextIssued)
	case data[keyNextCert] == nil && now.After(cur.Leaf.NotAfter.Add(-c.Validity/3)):
		if err := c.issueInto(data, keyNextCert, keyNextKey, data[keyCA], now); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&sec.ObjectMeta, annotationNextIssued, now.UTC().Format(time.RFC3339))
	case data[keyNextCert] != nil:
		if err := c.maybePromote(ctx, sec, data, now); err != nil {
			return err
		}
	}
	if !equalData(sec.Data, data) {
		sec.Data = data
		if err := c.Client.Update(ctx, sec); err != nil {
			return fmt.Errorf("writing Secret %s/%s: %w", c.Namespace, c.Secret, err)
		}
		c.Log.Info("webhook certificate updated", "secret", c.Secret)
	}
	if err := c.ensureConfiguration(ctx, data[keyCA]); err != nil {
		return err
	}
	return c.writeFiles(data[keyCert], data[keyKey])
}

// maybePromote serves the next certificate once the API server has trusted
// its CA for an interval.
func (c *Certs) maybePromote(ctx context.Context, sec *corev1.Secret, data map[string][]byte, now time.Time) error {
	issued, err := time.Parse(time.RFC3339, sec.Annotations[annotationNextIssued])
	if err == nil && now.Sub(issued) < c.Interval() {
		return nil
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: c.Configuration}, vwc); err != nil {
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", c.Configuration, err)
	}
	if !trusts(vwc, data[keyCA]) {
		return nil // published by ensureConfiguration below; promoted next time
	}
	data[keyCert], data[keyKey] = data[keyNextCert], data[keyNextKey]
	delete(data, keyNextCert)
	delete(data, keyNextKey)
	delete(sec.Annotations, annotationNextIssued)
	return nil
}

// usable: parsed, for our hosts, and not expired.
func (c *Certs) usable(cert *tls.Certificate, now time.Time) bool {
	leaf := cert.Leaf
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return false
	}
	for _, h := range c.Endpoint.Hosts() {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// issueInto makes a new CA and a certificate it signs into data[certName],
// data[keyName]; the bundle becomes the new CA plus the CAs of keep that are
// still valid and signed what is served now.
func (c *Certs) issueInto(data map[string][]byte, certName, keyName string, keep []byte, now time.Time) error {
	caPEM, certPEM, keyPEM, err := issue(c.Endpoint.Hosts(), now, c.Validity)
	if err != nil {
		return err
	}
	bundle := slices.Clone(caPEM)
	if cur, err := parsePair(data[keyCert], data[keyKey]); err == nil && keep != nil {
		for _, ca := range parseCerts(keep) {
			if now.Before(ca.NotAfter) && cur.Leaf.CheckSignatureFrom(ca) == nil {
				bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})...)
			}
		}
	}
	data[certName], data[keyName], data[keyCA] = certPEM, keyPEM, bundle
	return nil
}

// secret reads the certificate Secret, creating it empty when it is missing
// (the chart creates it, so the controller needs no create permission).
func (c *Certs) secret(ctx context.Context) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Secret}, sec)
	if apierrors.IsNotFound(err) {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Secret,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "nvdriver"}}}
		if err = c.Client.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
			err = c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Secret}, sec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s for the webhook certificate: %w", c.Namespace, c.Secret, err)
	}
	return sec, nil
}

// writeFiles puts the pair in Dir, key first and each by rename, so the
// certwatcher never loads half a file (a key that does not match the
// certificate yet is refused by it and retried on the next event).
func (c *Certs) writeFiles(certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{keyKey, keyPEM}, {keyCert, certPEM}} {
		path := filepath.Join(c.Dir, f.name)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

// issue makes a CA and a serving certificate for hosts, both valid from a
// minute ago (clock skew) for validity.
func issue(hosts []string, now time.Time, validity time.Duration) (caPEM, certPEM, keyPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	notBefore, notAfter := now.Add(-time.Minute), now.Add(validity)
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "nvdriver-webhook-ca"},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func parsePair(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, fmt.Errorf("no certificate")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &pair, nil // Leaf is parsed by X509KeyPair since Go 1.23
}

// parseCerts returns the certificates of a PEM bundle, skipping what does not parse.
func parseCerts(bundle []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
