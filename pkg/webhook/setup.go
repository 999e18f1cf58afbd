package webhook

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// The certificate modes: the controller keeps its own, or something else
// (cert-manager) writes them into CertDir and the caBundle.
const (
	CertsSelf     = "self"
	CertsExternal = "external"
)

// Options are the controller's webhook flags.
type Options struct {
	BindAddress   string // "" = no webhook
	URL           string
	Service       string
	Certs         string
	CertDir       string
	Secret        string
	Configuration string
	Validity      time.Duration
}

// BindFlags registers the flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.BindAddress, "webhook-bind-address", "", "serve the validating admission webhook here (e.g. :9443); empty: no webhook")
	fs.StringVar(&o.URL, "webhook-url", "", "base URL kube-apiserver calls the webhook at when the controller runs outside the cluster (e.g. https://127.0.0.1:9443)")
	fs.StringVar(&o.Service, "webhook-service", "", "name of the Service in --namespace in front of the webhook (in a cluster)")
	fs.StringVar(&o.Certs, "webhook-certs", CertsSelf, "self: keep the serving certificate in --webhook-cert-secret and the webhook configuration's caBundle, rotating it; external: read it from --webhook-cert-dir (cert-manager)")
	fs.StringVar(&o.CertDir, "webhook-cert-dir", "", "directory of tls.crt and tls.key (default with self: a new temporary directory)")
	fs.StringVar(&o.Secret, "webhook-cert-secret", SecretName, "Secret in --namespace holding the webhook certificate (self)")
	fs.StringVar(&o.Configuration, "webhook-configuration", ConfigurationName, "ValidatingWebhookConfiguration whose caBundle the controller keeps (self)")
	fs.DurationVar(&o.Validity, "webhook-cert-validity", 365*24*time.Hour, "lifetime of each webhook certificate (self); the next one is prepared when a third is left")
}

// Enabled reports whether the webhook is served.
func (o *Options) Enabled() bool { return o.BindAddress != "" }

// Validate checks the flags before anything starts.
func (o *Options) Validate(namespace string) error {
	if !o.Enabled() {
		return nil
	}
	if _, _, err := o.hostPort(); err != nil {
		return err
	}
	switch o.Certs {
	case CertsExternal:
		if o.CertDir == "" {
			return fmt.Errorf("--webhook-certs=external needs --webhook-cert-dir (where cert-manager's Secret is mounted)")
		}
		return nil
	case CertsSelf:
		if o.Validity < 10*time.Second {
			return fmt.Errorf("--webhook-cert-validity %s: want at least 10s", o.Validity)
		}
		if err := o.endpoint(namespace).Validate(); err != nil {
			return fmt.Errorf("%w (--webhook-url or --webhook-service)", err)
		}
		return nil
	}
	return fmt.Errorf("--webhook-certs %q: want %s or %s", o.Certs, CertsSelf, CertsExternal)
}

func (o *Options) endpoint(namespace string) Endpoint {
	return Endpoint{URL: o.URL, Service: o.Service, Namespace: namespace}
}

func (o *Options) hostPort() (string, int, error) {
	host, port, err := net.SplitHostPort(o.BindAddress)
	if err != nil {
		return "", 0, fmt.Errorf("--webhook-bind-address %q: %v", o.BindAddress, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return "", 0, fmt.Errorf("--webhook-bind-address %q: want HOST:PORT with a port", o.BindAddress)
	}
	return host, p, nil
}

// Prepare makes the certificate ready before the manager starts (the
// webhook server refuses to start without one) and returns the server for
// the manager's options, plus the certificate keeper to run (nil when an
// external issuer keeps it).
func (o *Options) Prepare(ctx context.Context, direct client.Client, namespace string, log logr.Logger) (crwebhook.Server, *Certs, error) {
	host, port, _ := o.hostPort()
	var certs *Certs
	if o.Certs == CertsSelf {
		if o.CertDir == "" {
			dir, err := os.MkdirTemp("", "nvdriver-webhook-")
			if err != nil {
				return nil, nil, err
			}
			o.CertDir = dir
		}
		certs = &Certs{Client: direct, Namespace: namespace, Secret: o.Secret, Configuration: o.Configuration,
			Endpoint: o.endpoint(namespace), Validity: o.Validity, Dir: o.CertDir, Log: log}
		if err := certs.Sync(ctx); err != nil {
			return nil, nil, err
		}
	}
	return crwebhook.NewServer(crwebhook.Options{Host: host, Port: port, CertDir: o.CertDir}), certs, nil
}

// Setup registers the validator on the manager's webhook server, starts the
// informers it reads on every replica (controllers start theirs only on the
// leader), and runs the certificate keeper.
func Setup(ctx context.Context, mgr ctrl.Manager, certs *Certs) error {
	for _, obj := range []client.Object{&corev1.Node{}, &v1alpha1.NVIDIADriver{}} {
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return err
		}
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.NVIDIADriver{}).WithValidator(&Validator{Cache: mgr.GetCache()}).Complete(); err != nil {
		return err
	}
	if certs != nil {
		if err := mgr.Add(certs); err != nil {
			return err
		}
	}
	return mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker())
}
