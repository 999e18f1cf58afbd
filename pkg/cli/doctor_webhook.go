package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/doctor"
)

// webhookState reads the admission webhook's configuration and the
// certificate in its Secret; a URL endpoint (a controller outside the
// cluster, as on the local cluster) is asked directly with the caBundle as
// the only trusted CA, a Service's ready endpoints are counted.
func webhookState(ctx context.Context, c client.Client, ns string) *doctor.Webhook {
	w := &doctor.Webhook{Name: v1alpha1.WebhookConfigurationName, ReadyEndpoints: -1}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: w.Name}, vwc); err != nil {
		if !apierrors.IsNotFound(err) {
			w.Forbidden = forbiddenText(err)
		}
		return w
	}
	w.Configured = true
	if len(vwc.Webhooks) == 0 {
		return w
	}
	cc := vwc.Webhooks[0].ClientConfig
	w.CABundle = cc.CABundle
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.WebhookSecretName}, sec); err == nil && len(sec.Data[corev1.TLSCertKey]) > 0 {
		w.ServingCert = sec.Data[corev1.TLSCertKey]
	}
	switch {
	case cc.URL != nil:
		w.Endpoint = *cc.URL
		w.Unanswered = askWebhook(ctx, *cc.URL, cc.CABundle)
	case cc.Service != nil:
		w.Endpoint = "Service " + cc.Service.Namespace + "/" + cc.Service.Name
		eps := &discoveryv1.EndpointSliceList{}
		if err := c.List(ctx, eps, client.InNamespace(cc.Service.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: cc.Service.Name}); err == nil {
			w.ReadyEndpoints = 0
			for _, s := range eps.Items {
				for _, e := range s.Endpoints {
					if ptr.Deref(e.Conditions.Ready, false) {
						w.ReadyEndpoints++
					}
				}
			}
		}
	}
	return w
}

// askWebhook sends the webhook a CONNECT review, which it admits without
// judging anything, and says why that failed ("" when it answered).
func askWebhook(ctx context.Context, url string, caBundle []byte) string {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caBundle)
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("kubectl-nvdriver-doctor"), Operation: admissionv1.Connect,
			Kind:     metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: "NVIDIADriver"},
			Resource: metav1.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "nvidiadrivers"}},
	}
	body, _ := json.Marshal(review)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := hc.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var got admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got.Response == nil || got.Response.UID != review.Request.UID {
		return fmt.Sprintf("HTTP %d without an admission review", resp.StatusCode)
	}
	return ""
}
