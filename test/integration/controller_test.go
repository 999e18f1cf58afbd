package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/controller"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

const driverNS = "gpu-operator"

var (
	startOnce  sync.Once
	startErr   error
	writeCount atomic.Int64
	// nodePatches counts the controller's PATCHes per node name.
	nodePatches sync.Map // string -> *atomic.Int64
	// stopController ends the manager before the API server stops.
	stopController = func() {}
)

// countingTransport counts the controller's mutating requests (docs/design.md, "Writes").
type countingTransport struct{ next http.RoundTripper }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		// Leader election renews its Lease; that is not a reconcile write.
		if !strings.Contains(r.URL.Path, "/leases/") && !strings.Contains(r.URL.Path, "/events") {
			writeCount.Add(1)
			if name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/nodes/"); ok && r.Method == http.MethodPatch && !strings.Contains(name, "/") {
				n, _ := nodePatches.LoadOrStore(name, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
			if os.Getenv("NVD_DEBUG_WRITES") != "" {
				var body []byte
				if r.GetBody != nil {
					if rc, err := r.GetBody(); err == nil {
						body, _ = io.ReadAll(rc)
					}
				}
				fmt.Fprintln(os.Stderr, "WRITE", r.Method, r.URL.String(), string(body))
			}
		}
	}
	return c.next.RoundTrip(r)
}

// startController runs the real controller against the envtest apiserver once.
func startController(t *testing.T) {
	t.Helper()
	startOnce.Do(func() {
		ctx := context.Background()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: driverNS}}
		if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			startErr = err
			return
		}
		mcfg := rest.CopyConfig(cfg)
		// As cmd/controller talks to the API server: protobuf, the nodes
		// trimmed on the wire, each upgrade step's answers timed.
		controller.ClientConfig(mcfg)
		mcfg.Wrap(controller.TimeAnswers)
		mcfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt} })
		ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(testLogWriter{})))
		cacheOpts, err := controller.CacheOptions(mcfg, driverNS)
		if err != nil {
			startErr = err
			return
		}
		mgr, err := ctrl.NewManager(mcfg, ctrl.Options{
			Scheme: scheme, Cache: cacheOpts,
			Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		})
		if err != nil {
			startErr = err
			return
		}
		if err := controller.Setup(mgr, controller.Options{Namespace: driverNS, ImageCheck: controller.ImageCheckOff}); err != nil {
			startErr = err
			return
		}
		mctx, cancel := context.WithCancel(ctx)
		stopController = cancel
		go func() { _ = mgr.Start(mctx) }()
	})
	if startErr != nil {
		t.Fatalf("starting the controller: %v", startErr)
	}
}

// testLogWriter drops controller logs unless NVDRIVER_TEST_LOGS is set.
type testLogWriter struct{}

func (testLogWriter) Write(p []byte) (int, error) {
	if os.Getenv("NVDRIVER_TEST_LOGS") != "" {
		return os.Stderr.Write(p)
	}
	return len(p), nil
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		<-tick.C
	}
	t.Fatalf("timed out waiting for %s: %v", what, err)
}

func gpuNode(name, osID, osVer, kernel string, extra map[string]string) *corev1.Node {
	l := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true",
		plan.LabelOSID: osID, plan.LabelOSVersion: osVer, plan.LabelOSVersionMajor: strings.Split(osVer, ".")[0]}
	if kernel != "" {
		l[plan.LabelKernel] = kernel
	}
	for k, v := range extra {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

// scenario creates nodes and CRs and removes them (and waits) at the end.
func scenario(t *testing.T, nodes []*corev1.Node, drivers ...client.Object) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		if err := k8s.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range drivers {
		if err := k8s.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range drivers {
			_ = k8s.Delete(ctx, d)
		}
		for _, d := range drivers {
			eventually(t, "NVIDIADriver "+d.GetName()+" to be gone", func() error {
				err := k8s.Get(ctx, client.ObjectKeyFromObject(d), &v1alpha1.NVIDIADriver{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("still there (%v)", err)
			})
		}
		for _, n := range nodes {
			_ = k8s.Delete(ctx, n)
		}
		// No kube-controller-manager here, so no garbage collector: remove the
		// DaemonSets by hand after asserting they were owned.
		_ = k8s.DeleteAllOf(ctx, &appsv1.DaemonSet{}, client.InNamespace(driverNS))
	})
}

func nvd(name string, spec string) *v1alpha1.NVIDIADriver {
	d := &v1alpha1.NVIDIADriver{}
	mustYAML(fmt.Sprintf(`{"metadata":{"name":%q},"spec":%s}`, name, spec), d)
	return d
}

func mustYAML(s string, into any) {
	if err := yamlUnmarshal([]byte(s), into); err != nil {
		panic(err)
	}
}

// driverDaemonSets lists the driver DaemonSets by owner CR name.
func driverDaemonSets(t *testing.T) map[string][]appsv1.DaemonSet {
	t.Helper()
	list := &appsv1.DaemonSetList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(driverNS)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]appsv1.DaemonSet{}
	for _, ds := range list.Items {
		if ds.DeletionTimestamp != nil {
			continue
		}
		ref := metav1.GetControllerOf(&ds)
		if ref == nil {
			out[""] = append(out[""], ds)
			continue
		}
		out[ref.Name] = append(out[ref.Name], ds)
	}
	for k := range out {
		sort.Slice(out[k], func(i, j int) bool { return out[k][i].Name < out[k][j].Name })
	}
	return out
}

// rollOut plays the DaemonSet controller (absent in envtest): every pod of
// every driver DaemonSet is scheduled, updated and available.
func rollOut(t *testing.T, desired map[string]int32) {
	t.Helper()
	ctx := context.Background()
	list := &appsv1.DaemonSetList{}
	if err := k8s.List(ctx, list, client.InNamespace(driverNS)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		ds := &list.Items[i]
		n := desired[ds.Name]
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: n, CurrentNumberScheduled: n,
			NumberReady: n, UpdatedNumberScheduled: n, NumberAvailable: n}
		if err := k8s.Status().Update(ctx, ds); err != nil {
			t.Fatal(err)
		}
	}
}

func getDriver(t *testing.T, name string) *v1alpha1.NVIDIADriver {
	t.Helper()
	d := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, d); err != nil {
		t.Fatal(err)
	}
	return d
}

func conditionIs(d *v1alpha1.NVIDIADriver, typ string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(d.Status.Conditions, typ)
	if c == nil || c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s: condition %s = %+v, want %s/%s (state %q)", d.Name, typ, c, status, reason, d.Status.State)
	}
	if d.Status.ObservedGeneration != d.Generation {
		return fmt.Errorf("%s: observedGeneration %d, generation %d", d.Name, d.Status.ObservedGeneration, d.Generation)
	}
	return nil
}

func nodeOwner(t *testing.T, name string) string {
	t.Helper()
	n := &corev1.Node{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n.Labels[plan.LabelOwner]
}

// The seed's gold/silver manifest, applied verbatim: one DaemonSet per CR per
// OS release, with every nodeSelector label of the seed's troubleshooting output.
func TestControllerSeedGoldSilver(t *testing.T) {
	startController(t)
	ctx := context.Background()
	nodes := []*corev1.Node{
		gpuNode("gs-g1", "ubuntu", "22.04", "", map[string]string{"driver.config": "gold"}),
		gpuNode("gs-g2", "ubuntu", "22.04", "", map[string]string{"driver.config": "gold"}),
		gpuNode("gs-s1", "ubuntu", "20.04", "", map[string]string{"driver.config": "silver"}),
	}
	var objs []client.Object
	for _, u := range decodeAll(t, filepath.Join(repoRoot(), "test", "testdata", "seed", "nvd-driver-multiple.yaml")) {
		objs = append(objs, u)
	}
	scenario(t, nodes, objs...)

	eventually(t, "one DaemonSet each for gold and silver", func() error {
		got := driverDaemonSets(t)
		if len(got["demo-gold"]) != 1 || len(got["demo-silver"]) != 1 {
			return fmt.Errorf("DaemonSets by owner: %v", names(got))
		}
		return nil
	})
	got := driverDaemonSets(t)
	gold := got["demo-gold"][0]
	if !strings.HasPrefix(gold.Name, "nvidia-gpu-driver-ubuntu22.04-") || !strings.HasPrefix(got["demo-silver"][0].Name, "nvidia-gpu-driver-ubuntu20.04-") {
		t.Errorf("DaemonSet names: %v", names(got))
	}
	sel := gold.Spec.Template.Spec.NodeSelector
	for k, v := range map[string]string{plan.LabelOSID: "ubuntu", plan.LabelOSVersion: "22.04",
		plan.LabelDeployDriver: "true", plan.LabelGPUPresent: "true", plan.LabelOwner: "demo-gold"} {
		if sel[k] != v {
			t.Errorf("gold nodeSelector[%s] = %q, want %q (all: %v)", k, sel[k], v, sel)
		}
	}
	// The CR's own selector reaches the pods through the owner label only, so
	// relabelling a node cannot pull its driver pod out from under GPU jobs.
	if _, ok := sel["driver.config"]; ok {
		t.Errorf("gold nodeSelector carries the CR's selector label: %v", sel)
	}
	if img := gold.Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04" {
		t.Errorf("gold image = %s", img)
	}
	if ref := metav1.GetControllerOf(&gold); ref == nil || ref.Name != "demo-gold" || ref.Kind != "NVIDIADriver" {
		t.Errorf("gold DaemonSet is not controlled by its CR (garbage collection would not remove it): %+v", gold.OwnerReferences)
	}
	for n, want := range map[string]string{"gs-g1": "demo-gold", "gs-g2": "demo-gold", "gs-s1": "demo-silver"} {
		eventually(t, "owner label on "+n, func() error {
			if got := nodeOwner(t, n); got != want {
				return fmt.Errorf("owner %q, want %q", got, want)
			}
			return nil
		})
	}
	// Not rolled out yet: honest status.
	eventually(t, "gold waiting for its driver pods", func() error {
		return conditionIs(getDriver(t, "demo-gold"), "Ready", metav1.ConditionFalse, controller.ReasonDriverNotReady)
	})
	rollOut(t, map[string]int32{gold.Name: 2, got["demo-silver"][0].Name: 1})
	for _, name := range []string{"demo-gold", "demo-silver"} {
		eventually(t, name+" ready", func() error {
			d := getDriver(t, name)
			if d.Status.State != v1alpha1.Ready {
				return fmt.Errorf("state %q", d.Status.State)
			}
			return conditionIs(d, "Ready", metav1.ConditionTrue, controller.ReasonReconciled)
		})
	}
	d := getDriver(t, "demo-gold")
	if len(d.Status.Pools) != 1 || d.Status.Pools[0].Desired != 2 || d.Status.Pools[0].Available != 2 || d.Status.Pools[0].Image == "" {
		t.Errorf("gold pools status = %+v", d.Status.Pools)
	}
	if !containsString(d.Finalizers, v1alpha1.Finalizer) {
		t.Errorf("finalizers = %v", d.Finalizers)
	}

	// Converged: a reconcile with nothing to change makes no write.
	before := writeCount.Load()
	reconciles := reconcileCount(t)
	if err := k8s.Patch(ctx, d, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"touch":"1"}}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a reconcile after the label change", func() error {
		if reconcileCount(t) <= reconciles {
			return fmt.Errorf("no reconcile yet")
		}
		return nil
	})
	if w := writeCount.Load() - before; w != 0 {
		t.Errorf("an idle reconcile made %d write(s); want 0", w)
	}
}

func TestControllerPoolsPrecompiledAndStaleRemoval(t *testing.T) {
	startController(t)
	ctx := context.Background()
	nodes := []*corev1.Node{
		gpuNode("pc-a", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"pc": "yes"}),
		gpuNode("pc-b", "ubuntu", "22.04", "5.15.0-78-generic", map[string]string{"pc": "yes"}),
	}
	scenario(t, nodes, nvd("pc", `{"usePrecompiled": true, "version": "535", "nodeSelector": {"pc": "yes"}}`))
	eventually(t, "two precompiled DaemonSets", func() error {
		if got := driverDaemonSets(t)["pc"]; len(got) != 2 {
			return fmt.Errorf("%d DaemonSets", len(got))
		}
		return nil
	})
	before := driverDaemonSets(t)["pc"]
	images := []string{before[0].Spec.Template.Spec.Containers[0].Image, before[1].Spec.Template.Spec.Containers[0].Image}
	sort.Strings(images)
	if images[0] != "nvcr.io/nvidia/driver:535-5.15.0-78-generic-ubuntu22.04" || images[1] != "nvcr.io/nvidia/driver:535-5.15.0-84-generic-ubuntu22.04" {
		t.Errorf("images = %v", images)
	}

	// Node pc-b moves to pc-a's kernel: its pool disappears; only that DaemonSet goes.
	n := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "pc-b"}, n); err != nil {
		t.Fatal(err)
	}
	pre := n.DeepCopy() // a patch: the controller writes nodes too
	n.Labels[plan.LabelKernel] = "5.15.0-84-generic"
	if err := k8s.Patch(ctx, n, client.MergeFrom(pre)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stale kernel pool's DaemonSet to be deleted", func() error {
		got := driverDaemonSets(t)["pc"]
		if len(got) != 1 {
			return fmt.Errorf("%d DaemonSets", len(got))
		}
		if !strings.Contains(got[0].Spec.Template.Spec.Containers[0].Image, "5.15.0-84-generic") {
			return fmt.Errorf("the wrong DaemonSet survived: %s", got[0].Name)
		}
		return nil
	})
	kept := driverDaemonSets(t)["pc"][0]
	for _, b := range before {
		if b.Name == kept.Name && b.UID != kept.UID {
			t.Errorf("the surviving DaemonSet was recreated (UID %s -> %s)", b.UID, kept.UID)
		}
	}
}

func TestControllerConflictIsScoped(t *testing.T) {
	startController(t)
	ctx := context.Background()
	nodes := []*corev1.Node{
		gpuNode("cf-both", "ubuntu", "22.04", "", map[string]string{"cf-a": "1"}),
		gpuNode("cf-c", "ubuntu", "22.04", "", map[string]string{"cf-c": "1"}),
	}
	scenario(t, nodes,
		nvd("cf-a", `{"version": "535.104.12", "nodeSelector": {"cf-a": "1"}}`),
		nvd("cf-b", `{"version": "535.104.12", "nodeSelector": {"cf-b": "1"}}`),
		nvd("cf-c", `{"version": "535.104.12", "nodeSelector": {"cf-c": "1"}}`))
	eventually(t, "cf-a owns cf-both", func() error {
		if o := nodeOwner(t, "cf-both"); o != "cf-a" {
			return fmt.Errorf("owner %q", o)
		}
		if len(driverDaemonSets(t)["cf-a"]) != 1 {
			return fmt.Errorf("no DaemonSet for cf-a yet")
		}
		return nil
	})
	aDS := driverDaemonSets(t)["cf-a"][0]

	// Now cf-b selects the same node too.
	n := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "cf-both"}, n); err != nil {
		t.Fatal(err)
	}
	pre := n.DeepCopy() // a patch: the controller writes nodes too
	n.Labels["cf-b"] = "1"
	if err := k8s.Patch(ctx, n, client.MergeFrom(pre)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cf-a", "cf-b"} {
		eventually(t, name+" in conflict", func() error {
			d := getDriver(t, name)
			if d.Status.State != v1alpha1.NotReady {
				return fmt.Errorf("state %q", d.Status.State)
			}
			if err := conditionIs(d, "Error", metav1.ConditionTrue, plan.ReasonConflictingNodeSelector); err != nil {
				return err
			}
			msg := meta.FindStatusCondition(d.Status.Conditions, "Error").Message
			if !strings.Contains(msg, "cf-both") {
				return fmt.Errorf("message does not name the node: %q", msg)
			}
			return nil
		})
	}
	eventually(t, "cf-c unaffected: DaemonSet created", func() error {
		if len(driverDaemonSets(t)["cf-c"]) != 1 {
			return fmt.Errorf("no DaemonSet for cf-c")
		}
		return nil
	})
	cDS := driverDaemonSets(t)["cf-c"][0]
	rollOut(t, map[string]int32{cDS.Name: 1, aDS.Name: 1})
	eventually(t, "cf-c ready", func() error {
		return conditionIs(getDriver(t, "cf-c"), "Ready", metav1.ConditionTrue, controller.ReasonReconciled)
	})
	got := driverDaemonSets(t)
	if len(got["cf-b"]) != 0 {
		t.Errorf("cf-b got a DaemonSet during the conflict: %v", names(got))
	}
	if len(got["cf-a"]) != 1 || got["cf-a"][0].UID != aDS.UID {
		t.Errorf("cf-a's running DaemonSet was removed or replaced during the conflict: %v", names(got))
	}
	if owner := nodeOwner(t, "cf-both"); owner != "cf-a" {
		t.Errorf("the conflicted node's owner changed to %q; it must keep cf-a", owner)
	}
}

func TestControllerDefaultsAndDeletion(t *testing.T) {
	startController(t)
	ctx := context.Background()
	nodes := []*corev1.Node{
		gpuNode("df-x", "ubuntu", "22.04", "", nil),
		gpuNode("df-g", "ubuntu", "22.04", "", map[string]string{"df": "gold"}),
		gpuNode("df-pre", "ubuntu", "22.04", "", map[string]string{plan.LabelDeployDriver: "pre-installed"}),
	}
	first := nvd("df-default", `{"default": true, "version": "550.90.07"}`)
	scenario(t, nodes, first, nvd("df-gold", `{"version": "535.104.12", "nodeSelector": {"df": "gold"}}`))
	eventually(t, "default owns the rest", func() error {
		if o := nodeOwner(t, "df-x"); o != "df-default" {
			return fmt.Errorf("df-x owner %q", o)
		}
		if o := nodeOwner(t, "df-g"); o != "df-gold" {
			return fmt.Errorf("df-g owner %q", o)
		}
		if o := nodeOwner(t, "df-pre"); o != "" {
			return fmt.Errorf("pre-installed node got owner %q", o)
		}
		return nil
	})
	// deploy.driver=true was filled in where absent, pre-installed kept.
	n := &corev1.Node{}
	_ = k8s.Get(ctx, client.ObjectKey{Name: "df-pre"}, n)
	if n.Labels[plan.LabelDeployDriver] != "pre-installed" || n.Labels[plan.LabelGPUPresent] != "true" {
		t.Errorf("df-pre labels = %v", n.Labels)
	}

	second := nvd("df-second", `{"default": true, "version": "550.90.07"}`)
	if err := k8s.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, second) })
	eventually(t, "the second default reports ConflictingDefault", func() error {
		d := getDriver(t, "df-second")
		if err := conditionIs(d, "Error", metav1.ConditionTrue, plan.ReasonConflictingDefault); err != nil {
			return err
		}
		if m := meta.FindStatusCondition(d.Status.Conditions, "Error").Message; !strings.Contains(m, `"df-default"`) {
			return fmt.Errorf("message does not name the working default: %q", m)
		}
		return nil
	})

	// Deleting the gold CR moves its node to the default, then the CR goes.
	if err := k8s.Delete(ctx, getDriver(t, "df-gold")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "df-g falls back to the default and df-gold is released", func() error {
		if o := nodeOwner(t, "df-g"); o != "df-default" {
			return fmt.Errorf("df-g owner %q", o)
		}
		err := k8s.Get(ctx, client.ObjectKey{Name: "df-gold"}, &v1alpha1.NVIDIADriver{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("df-gold still exists (%v)", err)
		}
		return nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// reconcileCount reads controller-runtime's reconcile counter for the driver controller.
func reconcileCount(t *testing.T) float64 { return reconcileCountOf(t, "nvidiadriver") }

// reconcileCountOf is how many reconciles the named controller has run.
func reconcileCountOf(t *testing.T, name string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == name {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
