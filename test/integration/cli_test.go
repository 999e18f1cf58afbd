package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// apiProxy is a plain-HTTP front of the envtest API server that counts the
// plugin's requests; the plugin reaches it through an ordinary kubeconfig.
type apiProxy struct {
	mu       sync.Mutex
	requests []string
	url      string
	kubecfg  string
	// before, when set, sees each request before it is forwarded.
	before func(*http.Request)
}

var (
	proxyOnce sync.Once
	proxy     *apiProxy
)

func cliProxy(t *testing.T) *apiProxy {
	t.Helper()
	proxyOnce.Do(func() {
		target, _ := url.Parse(cfg.Host)
		rt, err := rest.TransportFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := &apiProxy{}
		rp := httputil.NewSingleHostReverseProxy(target)
		rp.Transport = rt
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p.url = "http://" + ln.Addr().String()
		go func() {
			_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p.mu.Lock()
				hook := p.before
				p.mu.Unlock()
				if hook != nil {
					hook(r)
				}
				sw := &statusWriter{ResponseWriter: w, code: 200}
				rp.ServeHTTP(sw, r)
				p.mu.Lock()
				p.requests = append(p.requests, fmt.Sprintf("%s %s?%s %d", r.Method, r.URL.Path, r.URL.RawQuery, sw.code))
				p.mu.Unlock()
			}))
		}()
		dir, _ := os.MkdirTemp("", "nvdriver-cli")
		p.kubecfg = filepath.Join(dir, "kubeconfig")
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: envtest, cluster: {server: %q}}]
users: [{name: admin, user: {}}]
contexts: [{name: envtest, context: {cluster: envtest, user: admin}}]
current-context: envtest
`, p.url)
		if err := os.WriteFile(p.kubecfg, []byte(kc), 0o600); err != nil {
			t.Fatal(err)
		}
		proxy = p
	})
	return proxy
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func (p *apiProxy) reset() {
	p.mu.Lock()
	p.requests = nil
	p.mu.Unlock()
}

func (p *apiProxy) writes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.requests {
		// A dry run (dryRun=All) is validated by the server and persists nothing.
		if !strings.HasPrefix(r, "GET ") && !strings.Contains(r, "dryRun=All") {
			out = append(out, r)
		}
	}
	return out
}

// count is the requests the plugin made, less the retries the server asked
// for (429: API priority and fairness throttles a busy test server).
func (p *apiProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.requests {
		if !strings.HasSuffix(r, " 429") {
			n++
		}
	}
	return n
}

// plugin runs kubectl nvdriver in-process against the proxy.
func plugin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := cliProxy(t)
	var out, errOut bytes.Buffer
	code = cli.MainContext(context.Background(), append([]string{"--kubeconfig", p.kubecfg}, registrytest.Offline(args)...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func cliNodes(t *testing.T, prefix string, n int, extra map[string]string) []*corev1.Node {
	t.Helper()
	var out []*corev1.Node
	for i := 0; i < n; i++ {
		out = append(out, gpuNode(fmt.Sprintf("%s-%d", prefix, i), "ubuntu", "22.04", "5.15.0-84-generic", extra))
	}
	return out
}

func createNodes(t *testing.T, nodes []*corev1.Node) {
	t.Helper()
	for _, n := range nodes {
		if err := k8s.Create(context.Background(), n); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = k8s.Delete(context.Background(), n)
		}
	})
}

func nodeLabel(t *testing.T, name, key string) (string, bool) {
	t.Helper()
	n := &corev1.Node{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	v, ok := n.Labels[key]
	return v, ok
}

func deleteDriver(t *testing.T, name string) {
	t.Helper()
	d := &v1alpha1.NVIDIADriver{}
	d.Name = name
	_ = k8s.Delete(context.Background(), d)
	eventually(t, "NVIDIADriver "+name+" gone", func() error {
		if apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKey{Name: name}, &v1alpha1.NVIDIADriver{})) {
			return nil
		}
		return fmt.Errorf("still there")
	})
}

func TestAssignCreatesLabelsAndRefusesConflicts(t *testing.T) {
	startController(t)
	nodes := cliNodes(t, "as", 3, nil)
	createNodes(t, nodes)
	t.Cleanup(func() { deleteDriver(t, "as-gold"); deleteDriver(t, "as-all") })
	p := cliProxy(t)

	p.reset()
	code, out, errOut := plugin(t, "", "assign", "as-gold", "--nodes", "as-0,as-1", "--version", "550.90.07")
	if code != 0 {
		t.Fatalf("assign: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"node/as-0 labelled driver.config=as-gold", "node/as-1 labelled driver.config=as-gold", "nvidiadriver.nvidia.com/as-gold created"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("assign (create, 2 nodes) made %d requests: %v", p.count(), p.requests)
	d := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: "as-gold"}, d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Version != "550.90.07" || d.Spec.NodeSelector["driver.config"] != "as-gold" {
		t.Errorf("CR spec = %+v", d.Spec)
	}
	managed := false
	for _, mf := range d.ManagedFields {
		managed = managed || mf.Manager == cli.FieldManager
	}
	if !managed {
		t.Errorf("the CR was not written by field manager %s: %+v", cli.FieldManager, d.ManagedFields)
	}
	if v, _ := nodeLabel(t, "as-2", "driver.config"); v != "" {
		t.Errorf("as-2 was labelled %q", v)
	}

	// as-team selects team=x, which as-2 carries: giving as-2 to as-gold would
	// make both select it. assign refuses and writes nothing.
	labelled := &corev1.Node{}
	_ = k8s.Get(context.Background(), client.ObjectKey{Name: "as-2"}, labelled)
	before := labelled.DeepCopy() // a patch: the controller writes nodes too
	labelled.Labels["team"] = "x"
	if err := k8s.Patch(context.Background(), labelled, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(context.Background(), nvd("as-all", `{"version": "535.104.12", "nodeSelector": {"team": "x"}}`)); err != nil {
		t.Fatal(err)
	}
	p.reset()
	code, out, errOut = plugin(t, "", "assign", "as-gold", "--nodes", "as-2")
	if code != cli.ExitFindings {
		t.Fatalf("conflicting assign: exit %d, want 3\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "as-2: selected by as-all, as-gold") || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("stderr does not name the conflict:\n%s", errOut)
	}
	if w := p.writes(); len(w) != 0 {
		t.Errorf("a refused assign wrote: %v", w)
	}
	if v, ok := nodeLabel(t, "as-2", "driver.config"); ok {
		t.Errorf("as-2 got labelled %q", v)
	}
}

func TestAssignMovesAndRollsBack(t *testing.T) {
	startController(t)
	ctx := context.Background()
	nodes := cliNodes(t, "mv", 2, nil)
	createNodes(t, nodes)
	t.Cleanup(func() { deleteDriver(t, "mv-a"); deleteDriver(t, "mv-b"); deleteDriver(t, "rollback-me") })
	if code, out, errOut := plugin(t, "", "assign", "mv-a", "--nodes", "mv-0,mv-1", "--version", "550.90.07"); code != 0 {
		t.Fatalf("assign: %d %s %s", code, out, errOut)
	}
	code, out, errOut := plugin(t, "", "assign", "mv-b", "--nodes", "mv-1", "--version", "535.104.12")
	if code != 0 {
		t.Fatalf("move: %d %s %s", code, out, errOut)
	}
	if !strings.Contains(out, "node/mv-1 moved from driver.config=mv-a to driver.config=mv-b") {
		t.Errorf("move not reported:\n%s", out)
	}
	eventually(t, "mv-1 owned by mv-b", func() error {
		if v, _ := nodeLabel(t, "mv-1", plan.LabelOwner); v != "mv-b" {
			return fmt.Errorf("owner %q", v)
		}
		return nil
	})

	// A policy rejects the real write of rollback-me but not its dry run: the
	// labels the plugin set must be restored.
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "reject-rollback-me"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				// CREATE only: the controller must still be able to update (and
				// remove the finalizer of) a probe admitted before the policy took effect.
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"nvidia.com"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"nvidiadrivers"}}}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.metadata.name != 'rollback-me' || request.dryRun == true", Message: "rejected for the rollback test"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reject-rollback-me"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "reject-rollback-me",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	for _, o := range []client.Object{vap, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		o := o
		t.Cleanup(func() { _ = k8s.Delete(ctx, o) })
	}
	eventually(t, "the policy to take effect", func() error {
		probe := nvd("rollback-me", `{"version": "1.0", "nodeSelector": {"probe": "selects-nothing"}}`)
		err := k8s.Create(ctx, probe)
		if err == nil {
			// Admitted before the policy took effect: remove it (the finalizer
			// makes that asynchronous) and try again.
			deleteDriver(t, "rollback-me")
			return fmt.Errorf("policy not active yet")
		}
		if !strings.Contains(err.Error(), "rejected for the rollback test") {
			return fmt.Errorf("unexpected error: %v", err)
		}
		return nil
	})
	code, out, errOut = plugin(t, "", "assign", "rollback-me", "--nodes", "mv-0,mv-1", "--version", "550.90.07")
	if code != cli.ExitError || !strings.Contains(errOut, "node labels restored") || !strings.Contains(errOut, "rejected for the rollback test") {
		t.Fatalf("want exit 1 with restored labels, got %d\n%s%s", code, out, errOut)
	}
	if v, _ := nodeLabel(t, "mv-0", "driver.config"); v != "mv-a" {
		t.Errorf("mv-0 label = %q after rollback, want mv-a", v)
	}
	if v, _ := nodeLabel(t, "mv-1", "driver.config"); v != "mv-b" {
		t.Errorf("mv-1 label = %q after rollback, want mv-b", v)
	}
}

func TestAssignDryRunServerWritesNothing(t *testing.T) {
	nodes := cliNodes(t, "dr", 1, nil)
	createNodes(t, nodes)
	p := cliProxy(t)
	p.reset()
	code, out, errOut := plugin(t, "", "assign", "dr-x", "--nodes", "dr-0", "--version", "550.90.07", "--dry-run=server", "-o", "yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	// With -o the object alone is on stdout; what would change is on stderr.
	if !strings.Contains(errOut, "would be labelled") || !strings.Contains(errOut, "(server dry run)") || !strings.HasPrefix(out, "apiVersion: nvidia.com/v1alpha1") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", out, errOut)
	}
	if w := p.writes(); len(w) != 0 {
		t.Errorf("a server dry run wrote: %v", w)
	}
	if _, ok := nodeLabel(t, "dr-0", "driver.config"); ok {
		t.Error("server dry run labelled the node")
	}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: "dr-x"}, &v1alpha1.NVIDIADriver{}); !apierrors.IsNotFound(err) {
		t.Errorf("server dry run created the CR: %v", err)
	}
	code, out, _ = plugin(t, "", "assign", "dr-x", "--nodes", "dr-0", "--version", "550.90.07", "--dry-run=client")
	if code != 0 || !strings.Contains(out, "(dry run)") {
		t.Errorf("client dry run: %d\n%s", code, out)
	}
}

func TestPreviewSeedFilesAndRequestCount(t *testing.T) {
	nodes := []*corev1.Node{
		gpuNode("pv-g", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"driver.config": "gold"}),
		gpuNode("pv-s", "ubuntu", "20.04", "5.15.0-84-generic", map[string]string{"driver.config": "silver"}),
	}
	createNodes(t, nodes)
	p := cliProxy(t)
	p.reset()
	seed := filepath.Join(repoRoot(), "test", "testdata", "seed", "nvd-driver-multiple.yaml")
	code, out, errOut := plugin(t, "", "preview", "-f", seed, "demo-gold", "demo-silver", "-o", "json")
	if code != 0 {
		t.Fatalf("preview: exit %d\n%s%s", code, out, errOut)
	}
	// One LIST each of nodes, NVIDIADrivers and DaemonSets, and one of NVIDIA's
	// ClusterPolicies for --rules auto (no CR status told whose rule applies).
	if n := p.count(); n != 4 {
		t.Errorf("preview made %d requests, want 4: %v", n, p.requests)
	}
	var got plan.Plan
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("preview -o json is not a plan: %v\n%s", err, out)
	}
	gold := got.DriverByName("demo-gold")
	if gold == nil || len(gold.Pools) != 1 || gold.Pools[0].Image != "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04" ||
		!strings.HasSuffix(gold.Pools[0].DaemonSet, "-<uid-hash>") || gold.Pools[0].Nodes[0] != "pv-g" {
		t.Errorf("gold plan = %+v", gold)
	}
	// The table shows the same, read from stdin.
	data, _ := os.ReadFile(seed)
	code, out, _ = plugin(t, string(data), "preview", "-f", "-", "demo-silver", "-o", "wide")
	if code != 0 || !strings.Contains(out, "nvcr.io/nvidia/driver:470.141.10-ubuntu20.04") || !strings.Contains(out, "pv-s") {
		t.Errorf("preview wide: %d\n%s", code, out)
	}
}

func TestUpgradePatchesVersion(t *testing.T) {
	ctx := context.Background()
	if err := k8s.Create(ctx, nvd("up-a", `{"version": "535.104.12", "nodeSelector": {"up": "a"}}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDriver(t, "up-a") })
	code, out, errOut := plugin(t, "", "upgrade", "up-a", "--to", "550.90.07")
	if code != 0 || !strings.Contains(out, "version 535.104.12 -> 550.90.07") {
		t.Fatalf("upgrade: %d\n%s%s", code, out, errOut)
	}
	d := &v1alpha1.NVIDIADriver{}
	_ = k8s.Get(ctx, client.ObjectKey{Name: "up-a"}, d)
	if d.Spec.Version != "550.90.07" {
		t.Errorf("version = %q", d.Spec.Version)
	}
}

// Bad invocations: each fails with its own message and exit code, and
// nothing in the cluster changes.
func TestInvalidInvocations(t *testing.T) {
	ctx := context.Background()
	nodes := cliNodes(t, "bad", 1, nil)
	createNodes(t, nodes)
	if err := k8s.Create(ctx, nvd("bad-existing", `{"version": "535.104.12", "nodeSelector": {"bad": "x"}}`)); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, nvd("bad-default", `{"default": true, "version": "535.104.12"}`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteDriver(t, "bad-existing"); deleteDriver(t, "bad-default") })
	// Some cases read the owner the controller gives bad-0.
	eventually(t, "bad-0 owned by the default", func() error {
		if got := nodeOwner(t, "bad-0"); got != "bad-default" {
			return fmt.Errorf("owner %q", got)
		}
		return nil
	})
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"assign", "x", "--version", "1.0"}, 1, "give exactly one of --nodes or -l/--selector"},
		{[]string{"assign", "x", "--nodes", "bad-0", "-l", "a=b", "--version", "1.0"}, 1, "give exactly one of --nodes or -l/--selector"},
		{[]string{"assign", "Bad_Name", "--nodes", "bad-0", "--version", "1.0"}, 1, `invalid NVIDIADriver name "Bad_Name"`},
		{[]string{"assign", "x", "--nodes", "bad-0"}, 1, "--version is required to create it"},
		{[]string{"assign", "x", "--nodes", "nope-0", "--version", "1.0"}, 1, "node(s) not found: nope-0"},
		{[]string{"assign", "x", "-l", "no=match", "--version", "1.0"}, 1, `no node matches --selector "no=match"`},
		{[]string{"assign", "x", "-l", "a in (", "--version", "1.0"}, 1, "invalid --selector"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "1.0", "--type", "cuda"}, 1, `invalid --type "cuda"`},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "535.104.12", "--precompiled"}, 1, "with precompiled drivers the version is a branch"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "5 3 5"}, 1, `invalid version "5 3 5"`},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "1.0", "--label-key", "nvidia.com/gpu-operator.driver.owner"}, 1, "is managed by the controller"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "1.0", "--dry-run=maybe"}, 1, `invalid --dry-run "maybe"`},
		{[]string{"assign", "bad-existing", "--nodes", "bad-0", "--type", "vgpu"}, 1, "apply only when creating"},
		{[]string{"assign", "bad-default", "--nodes", "bad-0"}, 1, "is the default"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "1.0", "--repository", "https://nvcr.io"}, 1, "the API server rejects NVIDIADriver"},
		{[]string{"preview", "-o", "xml"}, 1, `invalid --output "xml"`},
		{[]string{"preview", "--rules", "strict"}, 1, `invalid --rules "strict"`},
		{[]string{"preview", "-f", "/does/not/exist.yaml"}, 1, "does not exist"},
		{[]string{"preview", "-f", "-"}, 1, "no objects passed to preview"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "550.90.07-ubuntu22.04"}, 1, `ends in the OS tag "ubuntu22.04"`},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "v550.90.07"}, 1, "without a leading v"},
		{[]string{"assign", "x", "--nodes", "bad-0", "--version", "535"}, 1, "only precompiled drivers are published per branch"},
		{[]string{"upgrade", "bad-existing", "--to", "550.90.07-ubuntu22.04"}, 1, "ends in the OS tag"},
		{[]string{"upgrade", "bad-existing", "--to", "550.90.07", "--version", "550.127.05"}, 1, "disagree"},
		{[]string{"preview", "nope"}, 1, `NVIDIADriver "nope" not found`},
		{[]string{"upgrade", "bad-existing"}, 1, "give --to VERSION, --nodes, or both"},
		{[]string{"upgrade", "nope", "--to", "1.0"}, 1, `NVIDIADriver "nope" not found`},
		{[]string{"upgrade", "bad-existing", "--to", "not a version"}, 1, `invalid version "not a version"`},
		{[]string{"upgrade", "bad-existing", "--nodes", "bad-0"}, 1, `node "bad-0" belongs to NVIDIADriver "bad-default", not "bad-existing"`},
		{[]string{"upgrade", "bad-existing", "--nodes", "nope-0"}, 1, `node "nope-0" not found`},
		{[]string{"upgrade", "bad-existing", "--to", "1.0", "--timeout", "-1s"}, 1, "invalid --timeout"},
		{[]string{"status", "nope"}, 1, `NVIDIADriver "nope" not found`},
		{[]string{"status", "-o", "csv"}, 1, `invalid --output "csv"`},
		{[]string{"doctor", "-o", "yaml"}, 1, `invalid --output "yaml"`},
		{[]string{"version", "-o", "yaml"}, 1, `invalid --output "yaml"`},
		{[]string{"frobnicate"}, 1, `unknown command "frobnicate"`},
	}
	p := cliProxy(t)
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			p.reset()
			code, out, errOut := plugin(t, "", tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, errOut)
			}
			if tc.code != 0 && !strings.HasPrefix(errOut, "error: ") {
				t.Errorf("stderr does not start with 'error: ': %q", errOut)
			}
			if w := p.writes(); len(w) != 0 {
				t.Errorf("wrote: %v", w)
			}
		})
	}
	if v, ok := nodeLabel(t, "bad-0", "driver.config"); ok {
		t.Errorf("bad-0 got labelled %q", v)
	}
	// Errors in how a command was called point at its help, as kubectl's do.
	for _, args := range [][]string{{"upgrade"}, {"upgrade", "bad-existing", "--bogus"}, {"assign", "x", "--version", "1.0"}, {"status", "-o", "csv"}} {
		_, _, errOut := plugin(t, "", args...)
		want := "See 'kubectl nvdriver " + args[0] + " --help' for usage."
		if !strings.Contains(errOut, want) {
			t.Errorf("%v: stderr lacks %q:\n%s", args, want, errOut)
		}
	}
	d := &v1alpha1.NVIDIADriver{}
	_ = k8s.Get(ctx, client.ObjectKey{Name: "bad-existing"}, d)
	if d.Spec.Version != "535.104.12" || d.Generation != 1 {
		t.Errorf("bad-existing changed: version %q generation %d", d.Spec.Version, d.Generation)
	}
}

// Ctrl-C between labelling the nodes and writing the CR: the plugin puts the
// labels back, so the cluster is as before: never half an assignment.
func TestAssignInterruptedIsAllOrNothing(t *testing.T) {
	nodes := cliNodes(t, "intr", 2, nil)
	createNodes(t, nodes)
	t.Cleanup(func() { deleteDriver(t, "intr-a"); deleteDriver(t, "intr-b") })
	p := cliProxy(t)
	t.Cleanup(func() { p.mu.Lock(); p.before = nil; p.mu.Unlock() })

	for _, tc := range []struct {
		name, driver string
		// cancelOn: the request at which the user presses Ctrl-C.
		cancelOn func(r *http.Request) bool
	}{
		{"before the CR write", "intr-a", func(r *http.Request) bool {
			return r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/nvidiadrivers/") && r.URL.Query().Get("dryRun") == ""
		}},
		{"during the labelling", "intr-a", func(r *http.Request) bool {
			return r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/nodes/intr-1") && r.URL.Query().Get("dryRun") == ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p.mu.Lock()
			p.before = func(r *http.Request) {
				if tc.cancelOn(r) {
					cancel()
					<-r.Context().Done() // the client gives up on this request
				}
			}
			p.mu.Unlock()
			var out, errOut bytes.Buffer
			code := cli.MainContext(ctx, []string{"--kubeconfig", p.kubecfg, "assign", tc.driver, "--nodes", "intr-0,intr-1", "--version", "550.90.07"},
				strings.NewReader(""), &out, &errOut)
			p.mu.Lock()
			p.before = nil
			p.mu.Unlock()
			if code != cli.ExitError || !strings.Contains(errOut.String(), "interrupted") || !strings.Contains(errOut.String(), "restored") {
				t.Fatalf("exit %d, want 1 saying interrupted and restored\n%s%s", code, out.String(), errOut.String())
			}
			for _, n := range []string{"intr-0", "intr-1"} {
				if v, ok := nodeLabel(t, n, "driver.config"); ok {
					t.Errorf("%s keeps driver.config=%q after the interrupted assign", n, v)
				}
			}
			if err := k8s.Get(context.Background(), client.ObjectKey{Name: tc.driver}, &v1alpha1.NVIDIADriver{}); err == nil {
				t.Errorf("NVIDIADriver %s exists after the interrupted assign", tc.driver)
			}
		})
	}
}
