package doctor

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Webhook is what doctor learned of the controller's admission webhook.
type Webhook struct {
	// Forbidden is the API's refusal to show the configuration, if any.
	Forbidden string
	// Configured: the ValidatingWebhookConfiguration exists.
	Configured bool
	Name       string
	// Endpoint is its URL, or "service NS/NAME".
	Endpoint string
	CABundle []byte
	// ServingCert is the certificate in the controller's Secret (nil when
	// the Secret could not be read).
	ServingCert []byte
	// Unanswered says why the endpoint did not answer ("" when it did, or
	// when it was not asked: ReadyEndpoints counts a Service's pods).
	Unanswered string
	// ReadyEndpoints counts a Service's ready addresses (-1 when not known).
	ReadyEndpoints int
}

// checkWebhook says whether kubectl apply refuses overlapping NVIDIADrivers,
// and what it means when it does not: the webhook fails open, so a missing,
// untrusted or silent webhook breaks nothing but the refusal at apply time.
func checkWebhook(s *Snapshot, _ *plan.Plan) []Finding {
	w := s.Webhook
	if w == nil || s.Rules == plan.RulesGPUOperator {
		return nil // NVIDIA's operator has no such webhook
	}
	const meaning = "kubectl apply accepts an NVIDIADriver that overlaps another, and the controller reports it afterwards (Error=True, ConflictingNodeSelector)"
	obj := []string{"validatingwebhookconfiguration/" + w.Name}
	ns := s.Namespace
	switch {
	case w.Forbidden != "":
		return []Finding{{Severity: Info, Message: "cannot check the admission webhook (" + w.Forbidden + ")", Fix: "kubectl auth can-i get validatingwebhookconfigurations"}}
	case !w.Configured:
		return []Finding{{Severity: Info, Message: "no admission webhook is configured: " + meaning +
			"; the chart's controller.webhook.enabled=true turns it on"}}
	}
	restart := fmt.Sprintf("kubectl -n %s rollout restart deployment/nvdriver-controller", ns)
	cas, bad := validCAs(w.CABundle, s.Now)
	switch {
	case len(cas) == 0 && bad == "":
		return []Finding{{Severity: Warning, Objects: obj, Fix: restart,
			Message: "the admission webhook has no caBundle, so kube-apiserver cannot call it: " + meaning + "; the controller fills it when it starts with --webhook-bind-address"}}
	case len(cas) == 0:
		return []Finding{{Severity: Warning, Objects: obj, Fix: restart,
			Message: "the admission webhook's caBundle holds no valid CA (" + bad + "): " + meaning + "; the controller replaces it within a minute while it runs"}}
	}
	if w.ServingCert != nil && !signedByAny(w.ServingCert, cas) {
		return []Finding{{Severity: Warning, Objects: append(obj, "secret/"+ns+"/"+v1alpha1.WebhookSecretName), Fix: restart,
			Message: "the webhook's serving certificate is not signed by a CA in the caBundle, so kube-apiserver refuses to call it: " + meaning}}
	}
	switch {
	case w.Unanswered != "":
		return []Finding{{Severity: Warning, Objects: obj, Fix: fmt.Sprintf("kubectl -n %s get pods -l app.kubernetes.io/name=nvdriver", ns),
			Message: fmt.Sprintf("the admission webhook at %s does not answer (%s): %s", w.Endpoint, w.Unanswered, meaning)}}
	case w.ReadyEndpoints == 0:
		return []Finding{{Severity: Warning, Objects: obj, Fix: fmt.Sprintf("kubectl -n %s get pods -l app.kubernetes.io/name=nvdriver", ns),
			Message: fmt.Sprintf("no ready controller pod behind the admission webhook's %s: %s", w.Endpoint, meaning)}}
	}
	return nil
}

// validCAs parses the bundle's certificates valid at now; bad says why
// none is, when the bundle is not empty.
func validCAs(bundle []byte, now time.Time) ([]*x509.Certificate, string) {
	var out []*x509.Certificate
	var why []string
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		switch {
		case err != nil:
			why = append(why, "unparsable certificate")
		case now.After(c.NotAfter):
			why = append(why, "expired "+c.NotAfter.UTC().Format(time.RFC3339))
		default:
			out = append(out, c)
		}
	}
	if len(out) == 0 && len(strings.TrimSpace(string(bundle))) > 0 && len(why) == 0 {
		why = append(why, "no PEM certificate")
	}
	return out, strings.Join(why, ", ")
}

func signedByAny(certPEM []byte, cas []*x509.Certificate) bool {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return false
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return false
	}
	for _, ca := range cas {
		if c.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}
