// Package integration runs the API against a real kube-apiserver and etcd
// (controller-runtime envtest with binaries the project builds itself).
package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/webhook"
)

var (
	cfg    *rest.Config
	k8s    client.Client
	scheme = k8sruntime.NewScheme()
	codecs serializer.CodecFactory
	// hookEnv is where envtest expects the webhook to be served.
	hookEnv *envtest.WebhookInstallOptions
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "error: KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(test/tools/build.sh) to build kube-apiserver and etcd once")
		os.Exit(1)
	}
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	codecs = serializer.NewCodecFactory(scheme)

	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "charts", "nvdriver", "crds")},
		ErrorIfCRDPathMissing: true,
		// The controller's webhook configuration, pointed by envtest at a
		// local port with its own CA. Nothing listens there except during the
		// webhook tests; the configuration fails open, so the other tests'
		// writes are admitted without it.
		WebhookInstallOptions: envtest.WebhookInstallOptions{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{
			webhook.Configuration(webhook.ConfigurationName+"-envtest", webhook.Endpoint{Service: "unused", Namespace: "unused"}, nil)}},
	}
	hookEnv = &env.WebhookInstallOptions
	var err error
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: starting kube-apiserver and etcd from %s: %v\n", os.Getenv("KUBEBUILDER_ASSETS"), err)
		os.Exit(1)
	}
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		_ = env.Stop()
		os.Exit(1)
	}
	code := m.Run()
	stopController()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "warning: stopping envtest:", err)
	}
	os.Exit(code)
}
