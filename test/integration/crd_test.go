package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// decodeAll reads every YAML document of a file as unstructured objects.
func decodeAll(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if err == io.EOF {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	return out
}

// cleanup deletes the CRs and waits until they are gone (the controller's
// finalizer runs first), so the next test may create the same names.
func cleanup(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		deleteDriver(t, n)
	}
}

// Every manifest of the seed document applies unchanged, with the defaults
// NVIDIA's users rely on.
func TestSeedManifestsApplyUnchanged(t *testing.T) {
	ctx := context.Background()
	files, _ := filepath.Glob(filepath.Join(repoRoot(), "test", "testdata", "seed", "*.yaml"))
	if len(files) != 5 {
		t.Fatalf("want the 5 seed manifests, found %d", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			for _, u := range decodeAll(t, f) {
				if err := k8s.Create(ctx, u); err != nil {
					t.Fatalf("%s %s rejected: %v", filepath.Base(f), u.GetName(), err)
				}
				t.Cleanup(func() { cleanup(t, u.GetName()) })
				got := &v1alpha1.NVIDIADriver{}
				if err := k8s.Get(ctx, client.ObjectKey{Name: u.GetName()}, got); err != nil {
					t.Fatal(err)
				}
				if got.Spec.DriverType != v1alpha1.GPU || got.Spec.Default || got.Spec.KernelModuleType != "auto" || got.Spec.Image != "driver" {
					t.Errorf("defaults not applied: %+v", got.Spec)
				}
			}
		})
	}
}

func TestDefaultsOnMinimalCR(t *testing.T) {
	ctx := context.Background()
	// Unstructured, as kubectl sends it: a typed Go object would send zero values.
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`{"apiVersion":"nvidia.com/v1alpha1","kind":"NVIDIADriver","metadata":{"name":"minimal"},"spec":{"version":"550.90.07","upgradePolicy":{"podDeletion":{}}}}`), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(t, "minimal") })
	d := &v1alpha1.NVIDIADriver{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: "minimal"}, d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.DriverType != v1alpha1.GPU || d.Spec.Image != "driver" || d.Spec.Default {
		t.Errorf("spec defaults not applied: %+v", d.Spec)
	}
	up := d.Spec.UpgradePolicy
	if up == nil || !up.AutoUpgrade || up.MaxParallelUpgrades != 1 || up.MaxUnavailable.String() != "25%" || up.PodDeletion.TimeoutSecond != 300 {
		t.Errorf("upgradePolicy defaults not applied: %+v", up)
	}
}

// The bad-input catalogue: each object is rejected at admission with a message
// that says what to fix.
func TestInvalidCRsAreRejected(t *testing.T) {
	ctx := context.Background()
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name string
		spec string // JSON/YAML of spec
		want string // substring of the rejection
	}{
		{"unknown driverType", `{driverType: cuda, version: "535.104.12"}`, `Unsupported value: "cuda"`},
		{"default with nodeSelector", `{default: true, version: "535.104.12", nodeSelector: {driver.config: gold}}`, "a default NVIDIADriver (spec.default: true) covers the GPU nodes no other NVIDIADriver selects and must not set spec.nodeSelector"},
		{"reserved owner label in nodeSelector", `{version: "535.104.12", nodeSelector: {nvidia.com/gpu-operator.driver.owner: x}}`, "spec.nodeSelector must not use nvidia.com/gpu-operator.driver.owner"},
		{"precompiled with GDS", `{usePrecompiled: true, version: "535", gds: {enabled: true}}`, "precompiled drivers do not support GPUDirect Storage"},
		{"precompiled with GDRCopy", `{usePrecompiled: true, version: "535", gdrcopy: {enabled: true}}`, "precompiled drivers do not support GDRCopy"},
		{"precompiled with a full version", `{usePrecompiled: true, version: "535.104.12"}`, "with usePrecompiled: true, spec.version must be a driver branch such as 535"},
		{"precompiled with a digest", `{usePrecompiled: true, version: "` + digest + `"}`, "with usePrecompiled: true, spec.version must be a driver branch"},
		{"missing version", `{driverType: gpu}`, "spec.version is required"},
		{"empty version", `{version: ""}`, "spec.version is required"},
		{"version with a space", `{version: "535 104"}`, "spec.version must be a valid image tag"},
		{"version with a slash", `{version: "535/104"}`, "spec.version must be a valid image tag"},
		{"version starting with a dot", `{version: ".535"}`, "spec.version must be a valid image tag"},
		{"malformed digest", `{version: "sha256:xyz"}`, "spec.version must be a valid image tag"},
		{"version over 128 characters", `{version: "` + strings.Repeat("1", 129) + `"}`, "Too long"},
		{"image with a tag", `{version: "535.104.12", image: "driver:latest"}`, "spec.image must be an image name without tag or digest"},
		{"image with a digest", `{version: "535.104.12", image: "driver@` + digest + `"}`, "spec.image must be an image name without tag or digest"},
		{"image with upper case", `{version: "535.104.12", image: "Driver"}`, "spec.image must be an image name without tag or digest"},
		{"full-path image with repository", `{version: "535.104.12", repository: nvcr.io/nvidia, image: nvcr.io/nvidia/driver}`, "spec.image is a full image path while spec.repository is also set"},
		{"repository with scheme", `{version: "535.104.12", repository: "https://nvcr.io/nvidia"}`, "spec.repository must be a registry path such as nvcr.io/nvidia"},
		{"repository with trailing slash", `{version: "535.104.12", repository: "nvcr.io/nvidia/"}`, "spec.repository must be a registry path"},
		{"label overriding app", `{version: "535.104.12", labels: {app: mine}}`, "spec.labels must not set app or app.kubernetes.io/* labels"},
		{"label overriding app.kubernetes.io/component", `{version: "535.104.12", labels: {app.kubernetes.io/component: x}}`, "spec.labels must not set app or app.kubernetes.io/* labels"},
		{"unknown kernelModuleType", `{version: "535.104.12", kernelModuleType: closed}`, `Unsupported value: "closed"`},
		{"negative maxParallelUpgrades", `{version: "535.104.12", upgradePolicy: {maxParallelUpgrades: -1}}`, "should be greater than or equal to 0"},
		{"maxUnavailable of 150%", `{version: "535.104.12", upgradePolicy: {maxUnavailable: "150%"}}`, "spec.upgradePolicy.maxUnavailable must be a non-negative number of nodes or a percentage from 0% to 100%"},
		{"negative maxUnavailable", `{version: "535.104.12", upgradePolicy: {maxUnavailable: -2}}`, "spec.upgradePolicy.maxUnavailable must be a non-negative number"},
		{"maxUnavailable not a number", `{version: "535.104.12", upgradePolicy: {maxUnavailable: "many"}}`, "spec.upgradePolicy.maxUnavailable must be a non-negative number"},
		{"startupProbe timeout 0", `{version: "535.104.12", startupProbe: {timeoutSeconds: 0}}`, "should be greater than or equal to 1"},
		{"negative podDeletion timeout", `{version: "535.104.12", upgradePolicy: {podDeletion: {timeoutSeconds: -5}}}`, "should be greater than or equal to 0"},
		{"toleration with a bad operator", `{version: "535.104.12", tolerations: [{key: k, operator: Maybe}]}`, "spec.tolerations[].operator must be Exists or Equal"},
		{"toleration with a bad effect", `{version: "535.104.12", tolerations: [{key: k, effect: Sometimes}]}`, "spec.tolerations[].effect must be NoSchedule"},
		{"Exists toleration with a value", `{version: "535.104.12", tolerations: [{key: k, operator: Exists, value: v}]}`, "a toleration with operator Exists must not set a value"},
		{"env without a name", `{version: "535.104.12", env: [{value: x}]}`, "Required value"},
		{"GDS enabled without a version", `{version: "535.104.12", gds: {enabled: true}}`, "spec.gds.version is required when spec.gds.enabled is true"},
		{"GDRCopy enabled without a version", `{version: "535.104.12", gdrcopy: {enabled: true, image: gdrdrv}}`, "spec.gdrcopy.version is required when spec.gdrcopy.enabled is true"},
		{"GDS version with a space", `{version: "535.104.12", gds: {enabled: true, version: "2 20"}}`, "spec.gds.version must be a valid image tag"},
		{"GDS image with a tag", `{version: "535.104.12", gds: {enabled: true, version: "2.20.5", image: "nvidia-fs:2.20.5"}}`, "spec.gds.image must be an image name without tag or digest"},
		{"GDRCopy image with upper case", `{version: "535.104.12", gdrcopy: {enabled: true, version: "v2.4.1", image: "GDRDRV"}}`, "spec.gdrcopy.image must be an image name"},
		{"manager version with a slash", `{version: "535.104.12", manager: {version: "v0/8"}}`, "spec.manager.version must be a valid image tag"},
		{"manager image with a tag", `{version: "535.104.12", manager: {image: "k8s-driver-manager:v0.8.1"}}`, "spec.manager.image must be an image name without tag or digest"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatalf("bad test spec: %v", err)
			}
			u.Object = map[string]any{"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
				"metadata": map[string]any{"name": "bad-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}, "spec": spec}
			err := k8s.Create(ctx, u)
			if err == nil {
				cleanup(t, u.GetName())
				t.Fatalf("accepted; want rejection containing %q", tc.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("rejection %q lacks %q", err.Error(), tc.want)
			}
			if apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: u.GetName()}, &v1alpha1.NVIDIADriver{})) == false {
				t.Errorf("a rejected object exists")
			}
		})
	}
}

// Transition rules: driverType and usePrecompiled cannot change, including
// setting or removing usePrecompiled (NVIDIA's self == oldSelf misses those).
func TestImmutableFields(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		initial  string
		patch    string // JSON merge patch
		wantFail string
	}{
		{"change driverType", `{driverType: gpu, version: "535.104.12"}`, `{"spec":{"driverType":"vgpu"}}`, "spec.driverType is immutable"},
		{"set usePrecompiled on a CR that had none", `{version: "535"}`, `{"spec":{"usePrecompiled":true}}`, "spec.usePrecompiled is immutable"},
		{"unset usePrecompiled", `{usePrecompiled: true, version: "535"}`, `{"spec":{"usePrecompiled":null}}`, "spec.usePrecompiled is immutable"},
		{"flip usePrecompiled to false", `{usePrecompiled: true, version: "535"}`, `{"spec":{"usePrecompiled":false,"version":"535.104.12"}}`, "spec.usePrecompiled is immutable"},
		{"changing the version is allowed", `{version: "535.104.12"}`, `{"spec":{"version":"550.90.07"}}`, ""},
		{"spelling out usePrecompiled: false is allowed", `{version: "535.104.12"}`, `{"spec":{"usePrecompiled":false}}`, ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.initial), &spec); err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
				"metadata": map[string]any{"name": "immut-" + string(rune('a'+i))}, "spec": spec}}
			if err := k8s.Create(ctx, u); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cleanup(t, u.GetName()) })
			// The controller may be running (status, finalizer), so compare the
			// spec generation, which only a spec change moves.
			before := u.GetGeneration()
			err := k8s.Patch(ctx, u, client.RawPatch("application/merge-patch+json", []byte(tc.patch)))
			if tc.wantFail == "" {
				if err != nil {
					t.Fatalf("patch rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantFail) {
				t.Fatalf("err = %v, want %q", err, tc.wantFail)
			}
			got := &v1alpha1.NVIDIADriver{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: u.GetName()}, got); err != nil || got.Generation != before {
				t.Errorf("spec changed after a rejected patch (generation %d -> %d, %v)", before, got.Generation, err)
			}
		})
	}
}

func yamlUnmarshal(data []byte, into any) error { return yaml.Unmarshal(data, into) }

// The other side of the sidecar rules: what NVIDIA's documentation writes
// (a disabled GDS with nothing else) and the short forms our defaults fill
// are admitted.
func TestSidecarSpecsAccepted(t *testing.T) {
	ctx := context.Background()
	for i, spec := range []string{
		`{version: "535.104.12", gds: {enabled: false}}`,
		`{version: "535.104.12", gds: {enabled: true, version: "2.20.5"}, kernelModuleType: open}`,
		`{version: "535.104.12", gdrcopy: {enabled: true, repository: nvcr.io/nvidia/cloud-native, image: gdrdrv, version: v2.4.1}}`,
		`{version: "535.104.12", manager: {version: v0.8.1}}`,
		`{version: "535.104.12", manager: {image: mirror.local:5000/nv/k8s-driver-manager}}`,
	} {
		var s map[string]any
		if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
			"metadata": map[string]any{"name": fmt.Sprintf("sidecar-ok-%d", i)}, "spec": s}}
		if err := k8s.Create(ctx, u, client.DryRunAll); err != nil {
			t.Errorf("%s: rejected: %v", spec, err)
		}
	}
}
