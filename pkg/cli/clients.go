package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/resource"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// FieldManager is the server-side apply owner of the plugin's writes.
const FieldManager = "kubectl-nvdriver"

// DefaultNamespace is where NVIDIA's operator and our controller put the
// driver DaemonSets unless told otherwise.
const DefaultNamespace = "gpu-operator"

var scheme = runtime.NewScheme()

// ClusterPolicyGVK is NVIDIA's cluster-wide operator configuration.
var ClusterPolicyGVK = schema.GroupVersionKind{Group: "nvidia.com", Version: "v1", Kind: "ClusterPolicy"}

func init() {
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	_ = apiextv1.AddToScheme(scheme)
}

// restMapper knows every kind the plugin touches, so no command spends
// requests on discovery.
func restMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	add := func(gvk schema.GroupVersionKind, plural string, scope meta.RESTScope) {
		m.AddSpecific(gvk, gvk.GroupVersion().WithResource(plural), gvk.GroupVersion().WithResource(plural[:len(plural)-1]), scope)
	}
	add(corev1.SchemeGroupVersion.WithKind("Node"), "nodes", meta.RESTScopeRoot)
	add(corev1.SchemeGroupVersion.WithKind("Pod"), "pods", meta.RESTScopeNamespace)
	add(corev1.SchemeGroupVersion.WithKind("Secret"), "secrets", meta.RESTScopeNamespace)
	add(corev1.SchemeGroupVersion.WithKind("Namespace"), "namespaces", meta.RESTScopeRoot)
	add(corev1.SchemeGroupVersion.WithKind("Event"), "events", meta.RESTScopeNamespace)
	add(appsv1.SchemeGroupVersion.WithKind("DaemonSet"), "daemonsets", meta.RESTScopeNamespace)
	add(appsv1.SchemeGroupVersion.WithKind("Deployment"), "deployments", meta.RESTScopeNamespace)
	add(appsv1.SchemeGroupVersion.WithKind("ControllerRevision"), "controllerrevisions", meta.RESTScopeNamespace)
	add(policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), "poddisruptionbudgets", meta.RESTScopeNamespace)
	add(coordinationv1.SchemeGroupVersion.WithKind("Lease"), "leases", meta.RESTScopeNamespace)
	add(v1alpha1.GroupVersion.WithKind("NVIDIADriver"), "nvidiadrivers", meta.RESTScopeRoot)
	add(apiextv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"), "customresourcedefinitions", meta.RESTScopeRoot)
	add(ClusterPolicyGVK, "clusterpolicies", meta.RESTScopeRoot)
	add(admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"), "validatingwebhookconfigurations", meta.RESTScopeRoot)
	add(discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), "endpointslices", meta.RESTScopeNamespace)
	return m
}

// clientFor builds a client from the kubectl flags (no discovery).
func clientFor(flags *genericclioptions.ConfigFlags) (client.Client, *rest.Config, error) {
	if err := clusterConfigured(flags); err != nil {
		return nil, nil, err
	}
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme, Mapper: restMapper()})
	if err != nil {
		return nil, nil, err
	}
	return c, cfg, nil
}

// clusterConfigured refuses to fall back to client-go's default of
// http://localhost:8080 when no kubeconfig names a cluster: that only ever
// ends in "connection refused" and hides the real problem.
func clusterConfigured(flags *genericclioptions.ConfigFlags) error {
	if flags.APIServer != nil && *flags.APIServer != "" {
		return nil
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return nil // in a pod: client-go uses the in-cluster config
	}
	loader := flags.ToRawKubeConfigLoader()
	raw, err := loader.RawConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	ctxName := raw.CurrentContext
	if flags.Context != nil && *flags.Context != "" {
		ctxName = *flags.Context
	}
	if ctx, ok := raw.Contexts[ctxName]; ok && ctx.Cluster != "" {
		if _, ok := raw.Clusters[ctx.Cluster]; ok {
			return nil
		}
	}
	tried := loader.ConfigAccess().GetLoadingPrecedence()
	if f := loader.ConfigAccess().GetExplicitFile(); f != "" {
		tried = []string{f}
	}
	where := strings.Join(tried, ", ")
	if where == "" {
		where = "none"
	}
	if ctxName == "" {
		return fmt.Errorf("no cluster is configured: no current context in the kubeconfig (tried: %s); set KUBECONFIG, or pass --kubeconfig or --context", where)
	}
	return fmt.Errorf("no cluster is configured: context %q is not in the kubeconfig or names no cluster (tried: %s); see kubectl config get-contexts", ctxName, where)
}

// namespaceFlag is the driver namespace the user chose with -n, or ""
// (every namespace: driver DaemonSets and pods are found by their labels).
func namespaceFlag(flags *genericclioptions.ConfigFlags) string {
	if flags.Namespace != nil {
		return *flags.Namespace
	}
	return ""
}

// inputs is one read of what the planner needs: a metadata-only LIST of
// nodes, a LIST of NVIDIADrivers and a LIST of driver DaemonSets.
type inputs struct {
	nodes      []plan.Node
	drivers    []v1alpha1.NVIDIADriver
	daemonSets []appsv1.DaemonSet
}

// connectAndRead builds the client and takes the planner's inputs.
func connectAndRead(ctx context.Context, flags *genericclioptions.ConfigFlags) (client.Client, *inputs, error) {
	c, _, err := clientFor(flags)
	if err != nil {
		return nil, nil, err
	}
	in, err := readInputs(ctx, c, namespaceFlag(flags))
	return c, in, err
}

// readInputs reads nodes, NVIDIADrivers and the driver DaemonSets of the
// namespace ("" for every namespace).
func readInputs(ctx context.Context, c client.Reader, namespace string) (*inputs, error) {
	nodes := &metav1.PartialObjectMetadataList{}
	nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := c.List(ctx, nodes); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := c.List(ctx, drivers); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("the NVIDIADriver CRD is not installed: install it with `helm install nvdriver charts/nvdriver` or `kubectl apply -f charts/nvdriver/crds/`")
		}
		return nil, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	dss := &appsv1.DaemonSetList{}
	sel, _ := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{render.DriverComponentRequirement()}})
	if err := c.List(ctx, dss, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing driver DaemonSets: %w", err)
	}
	in := &inputs{drivers: drivers.Items, daemonSets: dss.Items}
	in.nodes = make([]plan.Node, len(nodes.Items))
	for i := range nodes.Items {
		in.nodes[i] = plan.Node{Name: nodes.Items[i].Name, Labels: nodes.Items[i].Labels}
	}
	return in, nil
}

// readDriverFiles decodes NVIDIADriver manifests with cli-runtime's resource
// builder, as kubectl apply -f reads them: files, directories (-R to recurse),
// URLs and "-" for stdin. Other kinds are an error, and so is reading no
// object at all: preview says what it cannot show.
func readDriverFiles(getter genericclioptions.RESTClientGetter, paths []string, recursive bool, stdin io.Reader) ([]v1alpha1.NVIDIADriver, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	var files []string
	useStdin := false
	for _, p := range paths {
		if p == "-" {
			useStdin = true
			continue
		}
		files = append(files, p)
	}
	b := resource.NewBuilder(getter).Unstructured().Local().ContinueOnError().Flatten()
	if len(files) > 0 {
		b = b.FilenameParam(false, &resource.FilenameOptions{Filenames: files, Recursive: recursive})
	}
	if useStdin {
		b = b.Stream(stdin, "stdin")
	}
	infos, err := b.Do().Infos()
	if err != nil {
		return nil, explainDecodeError(err)
	}
	if len(infos) == 0 {
		return nil, fmt.Errorf("no objects passed to preview: -f %s held no NVIDIADriver", strings.Join(paths, ", "))
	}
	var out []v1alpha1.NVIDIADriver
	for _, info := range infos {
		u, ok := info.Object.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("%s: unexpected object %T", info.Source, info.Object)
		}
		gvk := u.GroupVersionKind()
		if gvk.Kind != "NVIDIADriver" || gvk.GroupVersion() != v1alpha1.GroupVersion {
			return nil, fmt.Errorf("%s: %s %s/%s is not an NVIDIADriver (nvidia.com/v1alpha1)", info.Source, u.GetAPIVersion(), u.GetKind(), u.GetName())
		}
		d := v1alpha1.NVIDIADriver{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &d, true); err != nil {
			hint := ""
			if strings.Contains(err.Error(), "to string") {
				hint = ` (a number where text belongs: quote it in YAML, e.g. version: "535")`
			}
			return nil, fmt.Errorf("%s: NVIDIADriver %q: %w%s", info.Source, u.GetName(), err, hint)
		}
		if d.Name == "" {
			return nil, fmt.Errorf("%s: an NVIDIADriver has no metadata.name", info.Source)
		}
		defaultSpec(&d.Spec)
		out = append(out, d)
	}
	return out, nil
}

var undecodable = regexp.MustCompile(`unable to decode "([^"]+)": (json: cannot unmarshal|error converting YAML)`)

// explainDecodeError replaces the decoder's Go-typed complaint about a file
// that is not a manifest with one that names the file and says what it needs.
func explainDecodeError(err error) error {
	if m := undecodable.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("%s is not a Kubernetes manifest: each document must be a YAML or JSON object with apiVersion, kind and metadata", m[1])
	}
	return fmt.Errorf("reading -f: %w", err)
}

// defaultSpec applies the CRD's defaults to a CR read from a file, as the API
// server would on create.
func defaultSpec(s *v1alpha1.NVIDIADriverSpec) {
	if s.DriverType == "" {
		s.DriverType = v1alpha1.GPU
	}
	if s.Image == "" {
		s.Image = plan.DefaultImage
	}
	if s.KernelModuleType == "" {
		s.KernelModuleType = "auto"
	}
}

// streams is the IO of a command.
type streams = genericiooptions.IOStreams

// dryRunSuffix ends a write's message under --dry-run.
func dryRunSuffix(mode string) string {
	return map[string]string{"none": "", "client": " (dry run)", "server": " (server dry run)"}[mode]
}

// patchDriver sends a merge patch to the CR as a server dry run first
// (admission and the CRD's rules judge it: a refusal changes nothing and is
// said as "<refusal> (nothing was changed): why"), then for real unless
// mode is client or server. It returns the server's answer to the dry run
// (nil with --dry-run=client); d becomes the stored object after a real write.
func patchDriver(ctx context.Context, c client.Client, d *v1alpha1.NVIDIADriver, body []byte, mode, refusal string) (*v1alpha1.NVIDIADriver, error) {
	patch := client.RawPatch(types.MergePatchType, body)
	var probe *v1alpha1.NVIDIADriver
	if mode != "client" {
		probe = d.DeepCopy()
		if err := c.Patch(ctx, probe, patch, client.FieldOwner(FieldManager), client.DryRunAll); err != nil {
			return nil, fmt.Errorf("%s (nothing was changed): %v", refusal, err)
		}
	}
	if mode == "none" {
		if err := c.Patch(ctx, d, patch, client.FieldOwner(FieldManager)); err != nil {
			return nil, fmt.Errorf("patching %s: %w", d.Name, err)
		}
	}
	return probe, nil
}
