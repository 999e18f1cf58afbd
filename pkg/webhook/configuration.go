package webhook

import (
	"bytes"
	"context"
	"fmt"
	"net/url"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// The names the chart, the controller and doctor share.
const (
	ConfigurationName = v1alpha1.WebhookConfigurationName
	SecretName        = v1alpha1.WebhookSecretName
	ServiceName       = v1alpha1.WebhookServiceName
	WebhookName       = "nvidiadriver-overlap.nvdriver.io"
	// Path is controller-runtime's path for a validator of our kind.
	Path = "/validate-nvidia-com-v1alpha1-nvidiadriver"
	// TimeoutSeconds is short: the webhook fails open, and an unreachable
	// controller should delay a kubectl apply by seconds, not the default 10.
	TimeoutSeconds = 5
)

// Endpoint is where kube-apiserver calls the webhook: a URL when the
// controller runs outside the cluster (the local cluster), else a Service.
type Endpoint struct {
	URL       string // base, e.g. https://127.0.0.1:9443
	Service   string
	Namespace string
}

// Hosts are the names the serving certificate must carry.
func (e Endpoint) Hosts() []string {
	if e.URL != "" {
		u, err := url.Parse(e.URL)
		if err != nil || u.Hostname() == "" {
			return []string{"localhost"}
		}
		return []string{u.Hostname()}
	}
	svc := e.Service + "." + e.Namespace + ".svc"
	return []string{svc, svc + ".cluster.local", e.Service + "." + e.Namespace, e.Service}
}

// Validate reports an unusable endpoint.
func (e Endpoint) Validate() error {
	switch {
	case e.URL != "" && e.Service != "":
		return fmt.Errorf("give either a webhook URL or a Service, not both")
	case e.URL != "":
		u, err := url.Parse(e.URL)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("webhook URL %q: want https://HOST[:PORT] (the path %s is added)", e.URL, Path)
		}
	case e.Service == "":
		return fmt.Errorf("the webhook needs a Service name or a URL kube-apiserver can reach it at")
	}
	return nil
}

// ClientConfig is the webhook's clientConfig without its caBundle.
func (e Endpoint) ClientConfig() admissionregistrationv1.WebhookClientConfig {
	if e.URL != "" {
		u, _ := url.Parse(e.URL)
		u.Path = Path
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To(u.String())}
	}
	return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
		Namespace: e.Namespace, Name: e.Service, Path: ptr.To(Path), Port: ptr.To[int32](443)}}
}

// Configuration is the ValidatingWebhookConfiguration, as the chart renders
// it too (a packaging test compares them): creates and updates of
// NVIDIADrivers only, no side effects (dry runs are judged alike), failing
// open.
func Configuration(name string, e Endpoint, caBundle []byte) *admissionregistrationv1.ValidatingWebhookConfiguration {
	cc := e.ClientConfig()
	cc.CABundle = caBundle
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "nvdriver"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         WebhookName,
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{v1alpha1.GroupVersion.Group},
					APIVersions: []string{v1alpha1.GroupVersion.Version}, Resources: []string{"nvidiadrivers"},
					Scope: ptr.To(admissionregistrationv1.ClusterScope)},
			}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// trusts reports whether every webhook of vwc carries bundle as its caBundle.
func trusts(vwc *admissionregistrationv1.ValidatingWebhookConfiguration, bundle []byte) bool {
	for _, w := range vwc.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
			return false
		}
	}
	return len(vwc.Webhooks) > 0
}

// ensureConfiguration publishes bundle in the webhook configuration (and, for
// a URL endpoint, the URL: the local cluster's port may change), creating it
// when it is missing and the controller may.
func (c *Certs) ensureConfiguration(ctx context.Context, bundle []byte) error {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	err := c.Client.Get(ctx, client.ObjectKey{Name: c.Configuration}, vwc)
	if apierrors.IsNotFound(err) {
		err = c.Client.Create(ctx, Configuration(c.Configuration, c.Endpoint, bundle))
		if err == nil {
			c.Log.Info("webhook configuration created", "name", c.Configuration)
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("ValidatingWebhookConfiguration %s: %w", c.Configuration, err)
	}
	changed := false
	for i := range vwc.Webhooks {
		cc := &vwc.Webhooks[i].ClientConfig
		if c.Endpoint.URL != "" {
			want := c.Endpoint.ClientConfig()
			if cc.Service != nil || ptr.Deref(cc.URL, "") != *want.URL {
				cc.Service, cc.URL, changed = nil, want.URL, true
			}
		}
		if !bytes.Equal(cc.CABundle, bundle) {
			cc.CABundle, changed = bundle, true
		}
	}
	if !changed {
		return nil
	}
	if err := c.Client.Update(ctx, vwc); err != nil {
		return fmt.Errorf("publishing the webhook CA in ValidatingWebhookConfiguration %s: %w", c.Configuration, err)
	}
	return nil
}
