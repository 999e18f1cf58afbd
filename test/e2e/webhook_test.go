package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/webhook"
)

const precompSeed = "nvd-precompiled-some.yaml"

// The source document's precompiled example, applied verbatim on nodes
// already labelled gold, is refused by kubectl apply (and its server dry
// run) with the nodes and the other CR named; with the controller stopped
// the same apply is accepted, and the controller reports the conflict when
// it returns.
func TestWebhookRefusesAnOverlappingApply(t *testing.T) {
	labelNodes(t, "driver.config", "gold", "gpu-node-1", "gpu-node-3")
	labelNodes(t, "driver.precompiled", "true", "gpu-node-1", "gpu-node-3")
	labelNodes(t, "driver.version", "535", "gpu-node-1", "gpu-node-3")
	applySeed(t, "demo-gold-sample.yaml")
	deleteCRs(t, "demo-precomp")
	seed := filepath.Join("test", "testdata", "seed", precompSeed)
	want := `admission webhook "` + webhook.WebhookName + `" denied the request: NVIDIADriver "demo-precomp" would select 2 node(s) that NVIDIADriver "demo-gold" already selects: gpu-node-1, gpu-node-3;`

	// The webhook judges from its cache: give it the gold CR first.
	eventually(t, 30*time.Second, "kubectl apply to be refused", func() error {
		out, err := run("kubectl", "apply", "-f", seed)
		if err == nil {
			_, _ = run("kubectl", "delete", "-f", seed, "--wait=false")
			return fmt.Errorf("admitted: %s", out)
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("refused, but not by the webhook's rule: %s", out)
		}
		return nil
	})
	out, err := run("kubectl", "apply", "--dry-run=server", "-f", seed)
	if err == nil || !strings.Contains(out, want) || !strings.Contains(out, `narrow spec.nodeSelector here or in "demo-gold"`) {
		t.Fatalf("kubectl apply --dry-run=server: %v\n%s", err, out)
	}
	if err := k8s.Get(context.Background(), clientKey("demo-precomp"), &v1alpha1.NVIDIADriver{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused CR exists: %v", err)
	}

	if f := webhookFinding(t); f != nil {
		t.Fatalf("doctor with the webhook answering: %+v", *f)
	}

	// Fail open.
	stopController()
	t.Cleanup(func() {
		if controller.ProcessState != nil {
			if err := startController(); err != nil {
				t.Fatal(err)
			}
		}
	})
	start := time.Now()
	if out, err := run("kubectl", "apply", "-f", seed); err != nil {
		t.Fatalf("with the controller stopped the apply must be accepted (failurePolicy Ignore): %v\n%s", err, out)
	}
	t.Logf("apply with no webhook answering: %s", time.Since(start).Round(time.Millisecond))
	if f := webhookFinding(t); f == nil || f.Severity != doctor.Warning || !strings.Contains(f.Message, "does not answer") ||
		!strings.Contains(f.Message, "https://"+hookAddr+webhook.Path) {
		t.Fatalf("doctor with the controller stopped: %+v, want a warning that the webhook does not answer", f)
	}
	if err := startController(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the controller to report the conflict it could not refuse", func() error {
		d := &v1alpha1.NVIDIADriver{}
		if err := k8s.Get(context.Background(), clientKey("demo-precomp"), d); err != nil {
			return err
		}
		for _, c := range d.Status.Conditions {
			if c.Type == "Error" && c.Status == "True" && c.Reason == "ConflictingNodeSelector" && strings.Contains(c.Message, "gpu-node-1") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", d.Status.Conditions)
	})
	// An already conflicting CR stays editable: a version bump is admitted.
	kubectl(t, "patch", "nvidiadriver", "demo-precomp", "--type=merge", "-p", `{"spec":{"version":"550"}}`)
}

// Certificates that live 15 s rotate under a sampler that asks for an
// overlapping create every 200 ms: every request is refused (none fails
// open because kube-apiserver did not trust the new certificate yet).
func TestWebhookCertificateRotation(t *testing.T) {
	ctx := context.Background()
	labelNodes(t, "driver.config", "gold", "gpu-node-1", "gpu-node-3")
	labelNodes(t, "driver.precompiled", "true", "gpu-node-1", "gpu-node-3")
	labelNodes(t, "driver.version", "535", "gpu-node-1", "gpu-node-3")
	applySeed(t, "demo-gold-sample.yaml")
	var pre v1alpha1.NVIDIADriver
	data, err := os.ReadFile(filepath.Join(root, "test", "testdata", "seed", precompSeed))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &pre); err != nil {
		t.Fatal(err)
	}
	attempt := func() error { return k8s.Create(ctx, pre.DeepCopy(), client.DryRunAll) }

	// Restart with short-lived certificates, from an empty Secret (the
	// running one would otherwise be kept until a third of its year is left).
	stopController()
	t.Cleanup(func() {
		stopController()
		clearWebhookSecret(t)
		if err := startController(); err != nil {
			t.Fatal(err)
		}
	})
	clearWebhookSecret(t)
	if err := startController("--webhook-cert-validity=15s"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the webhook to refuse the overlap", func() error {
		if err := attempt(); !apierrors.IsForbidden(err) {
			return fmt.Errorf("want the denial, got %v", err)
		}
		return nil
	})
	serials := map[string]bool{servedSerial(t): true}
	attempts, deadline := 0, time.Now().Add(30*time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(deadline); <-tick.C {
		attempts++
		if err := attempt(); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "would select 2 node(s)") {
			t.Fatalf("attempt %d, %d certificate(s) served so far: want the denial, got %v", attempts, len(serials), err)
		}
		serials[servedSerial(t)] = true
	}
	// A rotation every 11.5 s or so (a third left, then one 1.5 s interval).
	if len(serials) < 3 {
		t.Fatalf("fewer than two rotations in 30 s of 15 s certificates (%d served)", len(serials))
	}
	t.Logf("%d overlapping creates, all refused, across %d certificates", attempts, len(serials))
}

// webhookFinding is doctor's admission-webhook finding, nil when it has none.
func webhookFinding(t *testing.T) *doctor.Finding {
	t.Helper()
	_, out, errOut := nvdriver(t, "doctor", "-o", "json")
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor -o json: %v\n%s%s", err, out, errOut)
	}
	for _, f := range r.Findings {
		if f.Check == "admission-webhook" {
			return &f
		}
	}
	return nil
}

// clearWebhookSecret empties the webhook's certificate Secret.
func clearWebhookSecret(t *testing.T) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: driverNS, Name: webhook.SecretName}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data = nil
	if err := k8s.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial of the certificate the webhook serves now.
func servedSerial(t *testing.T) string {
	t.Helper()
	conn, err := tls.Dial("tcp", hookAddr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("dialing the webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}
