package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/controller"
	"github.com/nvdriver/nvdriver/pkg/webhook"
)

// serveWebhook runs the controller's webhook alone (no reconcilers) until
// the test ends and returns its cache, once it is synced and listening.
func serveWebhook(t *testing.T, opts crwebhook.Options, certs *webhook.Certs, mut ...func(*ctrl.Options)) cache.Cache {
	t.Helper()
	cacheOpts, err := controller.CacheOptions(cfg, driverNS)
	if err != nil {
		t.Fatal(err)
	}
	mo := ctrl.Options{
		Scheme: scheme, Cache: cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		WebhookServer: crwebhook.NewServer(opts),
	}
	for _, m := range mut {
		m(&mo)
	}
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := webhook.Setup(ctx, mgr, certs); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = mgr.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the webhook to listen and its cache to sync", func() error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return fmt.Errorf("cache not synced")
		}
		conn, err := net.Dial("tcp", net.JoinHostPort(opts.Host, fmt.Sprint(opts.Port)))
		if err != nil {
			return err
		}
		return conn.Close()
	})
	return mgr.GetCache()
}

// seen waits until the webhook's cache holds obj at its current
// resourceVersion or later: the webhook judges what its informers have delivered.
func seen(t *testing.T, c cache.Cache, obj client.Object) {
	t.Helper()
	eventually(t, "the webhook's cache to see "+obj.GetName(), func() error {
		got := obj.DeepCopyObject().(client.Object)
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), got); err != nil {
			return err
		}
		// etcd revisions: the controller may have written it since.
		have, _ := strconv.ParseInt(got.GetResourceVersion(), 10, 64)
		want, _ := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
		if have < want {
			return fmt.Errorf("at %d, want %d or later", have, want)
		}
		return nil
	})
}

// refused asserts that err is the webhook's denial carrying every want.
func refused(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: admitted, want the webhook to refuse it", what)
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "`+webhook.WebhookName+`" denied the request`) {
		t.Fatalf("%s: %v, want the webhook's denial", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q\nlacks %q", what, err.Error(), w)
		}
	}
}

func webhookNodes() []*corev1.Node {
	return []*corev1.Node{
		gpuNode("wh-1", "ubuntu", "22.04", "5.15.0-84-generic", map[string]string{"driver.config": "gold", "driver.precompiled": "true", "driver.version": "535"}),
		gpuNode("wh-2", "ubuntu", "22.04", "5.15.0-78-generic", map[string]string{"driver.config": "gold", "driver.precompiled": "true", "driver.version": "535"}),
		gpuNode("wh-3", "ubuntu", "20.04", "5.15.0-84-generic", map[string]string{"driver.config": "silver"}),
		{ObjectMeta: metav1.ObjectMeta{Name: "wh-cpu", Labels: map[string]string{"driver.config": "silver"}}},
	}
}

// The webhook judges as plan.Admit does, on create and update, with the
// message assign gives; a server dry run gets the same answer and stores
// nothing; an already conflicting CR stays editable; deletes pass.
func TestWebhookRefusesWhatThePlanRefuses(t *testing.T) {
	ctx := context.Background()
	c := serveWebhook(t, crwebhook.Options{Host: hookEnv.LocalServingHost, Port: hookEnv.LocalServingPort, CertDir: hookEnv.LocalServingCertDir}, nil)
	gold := nvd("wh-gold", `{"driverType":"gpu","repository":"nvcr.io/nvidia","image":"driver","version":"535.104.12","nodeSelector":{"driver.config":"gold"}}`)
	silver := nvd("wh-silver", `{"driverType":"gpu","repository":"nvcr.io/nvidia","image":"driver","version":"470.141.10","nodeSelector":{"driver.config":"silver"}}`)
	def := nvd("wh-default", `{"driverType":"gpu","repository":"nvcr.io/nvidia","image":"driver","version":"535.104.12","default":true}`)
	scenario(t, webhookNodes(), gold, silver, def)
	for _, o := range []client.Object{gold, silver, def} {
		seen(t, c, o)
	}
	var seed v1alpha1.NVIDIADriver
	mustYAML(readSeed(t, "nvd-precompiled-some.yaml"), &seed)

	wantOverlap := `NVIDIADriver "demo-precomp" would select 2 node(s) that NVIDIADriver "wh-gold" already selects: wh-1, wh-2; ` +
		`a node must be selected by one NVIDIADriver: narrow spec.nodeSelector here or in "wh-gold", or label other nodes ` +
		`(kubectl nvdriver preview -f FILE shows who selects what) (ConflictingNodeSelector)`
	refused(t, "the seed's precompiled CR on gold nodes, dry run", k8s.Create(ctx, seed.DeepCopy(), client.DryRunAll), wantOverlap)
	refused(t, "the seed's precompiled CR on gold nodes", k8s.Create(ctx, seed.DeepCopy()), wantOverlap)
	if err := k8s.Get(ctx, client.ObjectKey{Name: "demo-precomp"}, &v1alpha1.NVIDIADriver{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused CR was stored: %v", err)
	}

	refused(t, "a second default", k8s.Create(ctx, nvd("wh-default-2", `{"driverType":"gpu","version":"535.104.12","default":true}`)),
		`NVIDIADriver "wh-default" is already the default`, "(ConflictingDefault)")

	widen := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"nodeSelector":null}}`))
	refused(t, "silver's selector widened to every node", k8s.Patch(ctx, silver.DeepCopy(), widen),
		`NVIDIADriver "wh-silver" would select 2 node(s) that NVIDIADriver "wh-gold" already selects: wh-1, wh-2`)
	refused(t, "the same, dry run", k8s.Patch(ctx, silver.DeepCopy(), widen, client.DryRunAll), `"wh-silver" would select 2 node(s)`)
	refused(t, "gold made a default", k8s.Patch(ctx, gold.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"default":true,"nodeSelector":null}}`))),
		"(ConflictingDefault)")

	// A CR that conflicts through a node label the webhook never judged.
	team := nvd("wh-team", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"team":"ml"}}`)
	if err := k8s.Create(ctx, team); err != nil {
		t.Fatalf("a CR selecting no node yet: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, team) })
	n := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "wh-1"}, n); err != nil {
		t.Fatal(err)
	}
	pre := n.DeepCopy() // a patch: the controller writes nodes too
	n.Labels["team"] = "ml"
	if err := k8s.Patch(ctx, n, client.MergeFrom(pre)); err != nil {
		t.Fatal(err)
	}
	seen(t, c, n)
	bump := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"version":"550.54.15"}}`))
	if err := k8s.Patch(ctx, team, bump); err != nil {
		t.Fatalf("a version bump of a CR that already conflicts must be admitted: %v", err)
	}
	narrow := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"nodeSelector":{"team":"ml","driver.config":"gold"}}}`))
	if err := k8s.Patch(ctx, team, narrow); err != nil {
		t.Fatalf("a narrower selector that still conflicts must be admitted (do not trap the user): %v", err)
	}
	seen(t, c, team)
	refused(t, "the conflicting CR widened to a node it did not conflict on",
		k8s.Patch(ctx, team.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"nodeSelector":{"team":null}}}`))),
		`"wh-team" would select 1 node(s) that NVIDIADriver "wh-gold" already selects: wh-2;`)
	if err := k8s.Delete(ctx, team); err != nil {
		t.Fatalf("deleting a conflicting CR must be admitted: %v", err)
	}
	// Non-GPU nodes never conflict: silver plus a CR on the CPU node's label.
	cpu := nvd("wh-cpu-only", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.config":"silver","kubernetes.io/os":"none"}}`)
	if err := k8s.Create(ctx, cpu, client.DryRunAll); err != nil {
		t.Fatalf("a CR overlapping on no GPU node must be admitted: %v", err)
	}
}

// A replica that is not the leader answers too, from its first request:
// its informers start without the Lease (controllers start theirs only on
// the leader, so a lazily started cache would admit the first requests
// unchecked).
func TestWebhookAnswersOnANonLeader(t *testing.T) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: driverNS}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: driverNS, Name: "wh-nonleader-lease"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := k8s.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(ctx, lease) })
	gold := nvd("wh-nl-gold", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.config":"gold"}}`)
	scenario(t, webhookNodes(), gold)
	serveWebhook(t, crwebhook.Options{Host: hookEnv.LocalServingHost, Port: hookEnv.LocalServingPort, CertDir: hookEnv.LocalServingCertDir}, nil,
		func(o *ctrl.Options) {
			o.LeaderElection, o.LeaderElectionID, o.LeaderElectionNamespace = true, lease.Name, driverNS
		})
	refused(t, "the first overlapping create on a replica without the Lease",
		k8s.Create(ctx, nvd("wh-nl-pre", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.precompiled":"true"}}`), client.DryRunAll),
		`would select 2 node(s) that NVIDIADriver "wh-nl-gold" already selects`)
}

// Fail open: with nothing answering at the configured address the same
// overlapping create is admitted (the controller reports it later).
func TestWebhookFailsOpenWhenNobodyAnswers(t *testing.T) {
	ctx := context.Background()
	gold := nvd("wh-open-gold", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.config":"gold"}}`)
	pre := nvd("wh-open-pre", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.precompiled":"true"}}`)
	scenario(t, webhookNodes(), gold)
	if err := k8s.Create(ctx, pre, client.DryRunAll); err != nil {
		t.Fatalf("with the webhook down the overlap must be admitted (failurePolicy Ignore): %v", err)
	}
}

// The controller's own certificate: the Secret and the caBundle are created,
// kube-apiserver trusts the served certificate (a denial proves the call
// went through), and a rotation keeps it answering: the next certificate is
// trusted before it is served.
func TestWebhookKeepsItsOwnCertificate(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: driverNS}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// A fake clock drives the rotation, starting 42 minutes in the past so
	// that every certificate it issues is valid on kube-apiserver's real
	// clock too.
	now := time.Now().Add(-42 * time.Minute)
	certs := &webhook.Certs{Client: k8s, Namespace: driverNS, Secret: "wh-cert-test", Configuration: "wh-config-test",
		Endpoint: webhook.Endpoint{URL: fmt.Sprintf("https://127.0.0.1:%d", port)}, Validity: time.Hour,
		Dir: t.TempDir(), Now: func() time.Time { return now }}
	t.Cleanup(func() {
		_ = k8s.Delete(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "wh-config-test"}})
		_ = k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: driverNS, Name: "wh-cert-test"}})
	})
	if err := certs.Sync(ctx); err != nil {
		t.Fatalf("first certificate: %v", err)
	}
	c := serveWebhook(t, crwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: certs.Dir}, nil)

	gold := nvd("wh-cert-gold", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.config":"gold"}}`)
	scenario(t, webhookNodes(), gold)
	seen(t, c, gold)
	overlap := func() error {
		return k8s.Create(ctx, nvd("wh-cert-pre", `{"driverType":"gpu","version":"535.104.12","nodeSelector":{"driver.precompiled":"true"}}`), client.DryRunAll)
	}
	eventually(t, "kube-apiserver to trust the webhook's certificate", func() error {
		if err := overlap(); err == nil || !apierrors.IsForbidden(err) {
			return fmt.Errorf("want a denial, got %v", err)
		}
		return nil
	})
	first := servedSerial(t, port)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "wh-config-test"}, vwc); err != nil {
		t.Fatal(err)
	}
	if got := *vwc.Webhooks[0].ClientConfig.URL; got != fmt.Sprintf("https://127.0.0.1:%d%s", port, webhook.Path) {
		t.Fatalf("clientConfig.url %s", got)
	}
	if p := vwc.Webhooks[0].FailurePolicy; p == nil || *p != admissionregistrationv1.Ignore {
		t.Fatalf("failurePolicy %v, want Ignore", p)
	}

	// Two thirds of the validity later: the next certificate is issued and
	// its CA published, but not served yet.
	now = now.Add(41 * time.Minute)
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "wh-config-test"}, vwc); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(vwc.Webhooks[0].ClientConfig.CABundle), "BEGIN CERTIFICATE"); n != 2 {
		t.Fatalf("caBundle holds %d CA(s) while the next certificate is prepared, want 2 (current and next)", n)
	}
	if got := servedSerial(t, port); got != first {
		t.Fatalf("the next certificate was served before its CA had been published for an interval")
	}
	// An interval later it is served, and the webhook keeps answering.
	now = now.Add(certs.Interval())
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the webhook to serve the new certificate", func() error {
		if servedSerial(t, port) == first {
			return fmt.Errorf("still the first certificate")
		}
		return nil
	})
	refused(t, "an overlap after the rotation", overlap(), "would select 2 node(s)")
	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: driverNS, Name: "wh-cert-test"}, sec); err != nil {
		t.Fatal(err)
	}
	if _, ok := sec.Data["next.crt"]; ok || sec.Data["tls.crt"] == nil || sec.Data["ca.key"] != nil {
		t.Fatalf("Secret keys after the rotation: %v", keys(sec.Data))
	}
	// A hand edit of the caBundle is repaired by the next check.
	vwc.Webhooks[0].ClientConfig.CABundle = []byte("garbage")
	if err := k8s.Update(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	if err := certs.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the repaired caBundle to be used", func() error {
		if err := overlap(); err == nil || !apierrors.IsForbidden(err) {
			return fmt.Errorf("want a denial, got %v", err)
		}
		return nil
	})
}

// servedSerial is the serial number of the certificate served on port.
func servedSerial(t *testing.T, port int) string {
	t.Helper()
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("dialing the webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func readSeed(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "test", "testdata", "seed", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
