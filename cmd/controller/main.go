// Command controller reconciles NVIDIADriver resources into driver DaemonSets.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/controller"
	"github.com/nvdriver/nvdriver/pkg/memlimit"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/version"
	"github.com/nvdriver/nvdriver/pkg/webhook"
)

const podSecurityEnforce = "pod-security.kubernetes.io/enforce"

func main() {
	os.Exit(run())
}

func run() int {
	defNS := os.Getenv("OPERATOR_NAMESPACE")
	if defNS == "" {
		defNS = "gpu-operator"
	}
	var (
		metricsAddr, probeAddr, namespace, leNamespace, managerImage, hostRoot string
		leaderElect, showVersion, labelPrivileged                              bool
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	flag.BoolVar(&leaderElect, "leader-elect", true, "use a Lease so only one replica writes")
	flag.StringVar(&namespace, "namespace", defNS, "namespace of the driver DaemonSets (default: $OPERATOR_NAMESPACE, else gpu-operator)")
	flag.StringVar(&leNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default: --namespace)")
	flag.StringVar(&managerImage, "driver-manager-image", envOr("DRIVER_MANAGER_IMAGE", render.DefaultManagerImage), "k8s-driver-manager image when a CR sets none")
	flag.StringVar(&hostRoot, "host-root", "/", "host root filesystem path mounted into the driver manager")
	flag.BoolVar(&showVersion, "version", false, "print the version and exit")
	flag.BoolVar(&labelPrivileged, "label-namespace-privileged", false, "label the driver namespace pod-security.kubernetes.io/enforce=privileged (driver pods are privileged)")
	pprofAddr := flag.String("pprof-bind-address", "", "serve net/http/pprof here (e.g. 127.0.0.1:6060); empty: off")
	qps := flag.Float64("kube-api-qps", 200, "client requests per second to kube-apiserver (controller-runtime's default is 20; the first start patches every GPU node)")
	burst := flag.Int("kube-api-burst", 400, "client burst to kube-apiserver")
	validationSelector := flag.String("validation-pod-selector", "", "label selector of pods that must be Ready on a node before its upgrade validates (e.g. app=nvidia-operator-validator); empty: the driver pod alone")
	validationTimeout := flag.Duration("validation-timeout", 0, "how long a new driver pod may take to become Ready before its node is marked upgrade-failed (default 10m)")
	imageCheck := flag.String("image-check", controller.ImageCheckEnforce, "ask the registry before creating a pool or rolling it to a new image: enforce (a missing image holds the pool), warn (report only) or off")
	imageBackoff := flag.Duration("image-check-backoff", 30*time.Second, "first re-check of an image that is missing or could not be checked; doubles up to --image-check-max-backoff")
	imageMaxBackoff := flag.Duration("image-check-max-backoff", 10*time.Minute, "longest wait between two checks of a missing image")
	var hook webhook.Options
	hook.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if showVersion {
		fmt.Println("nvdriver-controller", version.Version)
		return 0
	}
	if leNamespace == "" {
		leNamespace = namespace
	}
	if !slices.Contains(controller.ImageCheckModes, *imageCheck) {
		fmt.Fprintf(os.Stderr, "error: --image-check %q: want one of %s\n", *imageCheck, strings.Join(controller.ImageCheckModes, ", "))
		return 1
	}
	if err := hook.Validate(namespace); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		return 1
	}
	if *validationSelector != "" {
		if _, err := labels.Parse(*validationSelector); err != nil {
			fmt.Fprintf(os.Stderr, "error: --validation-pod-selector %q: %v\n", *validationSelector, err)
			return 1
		}
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	logger := ctrl.Log.WithName("setup")
	if soft, err := memlimit.Apply(); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		return 1
	} else if soft > 0 {
		logger.Info("soft memory limit set from the container's", "limitBytes", soft)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: no Kubernetes configuration: %v (pass --kubeconfig or run in a cluster)\n", err)
		return 1
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	controller.ClientConfig(cfg)
	cfg.Wrap(controller.CountWrites)
	cfg.Wrap(controller.TimeAnswers)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)

	// The driver namespace must exist: we never create it (it must allow
	// privileged pods, which is the admin's decision).
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		return 1
	}
	ns := &corev1.Namespace{}
	if err := direct.Get(context.Background(), client.ObjectKey{Name: namespace}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "error: namespace %q does not exist: create it with `kubectl create namespace %s` (and label it pod-security.kubernetes.io/enforce=privileged), or pass --namespace\n", namespace, namespace)
		} else {
			fmt.Fprintf(os.Stderr, "error: checking namespace %q: %v\n", namespace, err)
		}
		return 1
	}
	if labelPrivileged && ns.Labels[podSecurityEnforce] != "privileged" {
		patch := []byte(`{"metadata":{"labels":{"` + podSecurityEnforce + `":"privileged"}}}`)
		if err := direct.Patch(context.Background(), ns, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(controller.FieldManager)); err != nil {
			fmt.Fprintf(os.Stderr, "error: labelling namespace %s privileged for the driver pods: %v\n", namespace, err)
			return 1
		}
	}
	if ns.Labels[podSecurityEnforce] != "" && ns.Labels[podSecurityEnforce] != "privileged" && !labelPrivileged {
		fmt.Fprintf(os.Stderr, "warning: namespace %s enforces pod security %q; the privileged driver pods will be rejected: kubectl label ns %s %s=privileged --overwrite\n",
			namespace, ns.Labels[podSecurityEnforce], namespace, podSecurityEnforce)
	}

	var hookServer crwebhook.Server
	var certs *webhook.Certs
	if hook.Enabled() {
		hookServer, certs, err = hook.Prepare(context.Background(), direct, namespace, ctrl.Log.WithName("webhook"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: preparing the admission webhook's certificate: %v\n", err)
			return 1
		}
	}
	cacheOpts, err := controller.CacheOptions(cfg, namespace)
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:                 hookServer,
		Scheme:                        scheme,
		Cache:                         cacheOpts,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		PprofBindAddress:              *pprofAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              v1alpha1.ControllerLeaseName,
		LeaderElectionNamespace:       leNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		logger.Error(err, "creating the manager")
		return 1
	}
	// A lower GC target while nothing happens (docs/design.md, "Memory"),
	// also on a replica that is not the leader.
	rest := memlimit.NewRest()
	if rest != nil {
		metrics.Registry.MustRegister(rest.Metrics()...)
	}
	if err := controller.Setup(mgr, controller.Options{Namespace: namespace, ManagerImage: managerImage, HostRoot: hostRoot, ValidationTimeout: *validationTimeout, ValidationPodSelector: *validationSelector,
		ImageCheck: *imageCheck, ImageCheckBackoff: *imageBackoff, ImageCheckMaxBackoff: *imageMaxBackoff, Busy: rest.Busy}); err != nil {
		logger.Error(err, "setting up the controllers")
		return 1
	}
	if hook.Enabled() {
		if err := webhook.Setup(context.Background(), mgr, certs); err != nil {
			logger.Error(err, "setting up the admission webhook")
			return 1
		}
	}
	_ = mgr.AddHealthzCheck("healthz", healthz.Ping)
	_ = mgr.AddReadyzCheck("readyz", healthz.Ping)

	logger.Info("starting", "version", version.Version, "namespace", namespace, "leaderElection", leaderElect, "imageCheck", *imageCheck, "webhook", hook.BindAddress)
	ctx := ctrl.SetupSignalHandler()
	go rest.Run(ctx)
	if err := mgr.Start(ctx); err != nil {
		logger.Error(err, "manager stopped")
		return 1
	}
	return 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
