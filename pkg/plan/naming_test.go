package plan

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

func TestDaemonSetName(t *testing.T) {
	const uid = "3fa85f64-5717-4562-b3fc-2c963f66afa6"
	cases := []struct {
		name       string
		driverType v1alpha1.DriverType
		osTag      string
		kernel     string
		want       string
	}{
		{"SPEC vector, UID only", v1alpha1.GPU, "ubuntu22.04", "", "nvidia-gpu-driver-ubuntu22.04-554c55d4cd"},
		{"SPEC vector, UID and kernel", v1alpha1.GPU, "ubuntu22.04", "5.15.0-84-generic", "nvidia-gpu-driver-ubuntu22.04-7657ffb7fc"},
		{"vgpu-host-manager", v1alpha1.VGPUHostManager, "rhel9", "", "nvidia-vgpu-host-manager-driver-rhel9-554c55d4cd"},
		{"long prefix is cut, hash kept", v1alpha1.VGPUHostManager, "averyveryverylongdistributionname123.45", "", "nvidia-vgpu-host-manager-driver-averyveryverylongdis-554c55d4cd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := DaemonSetName(tc.driverType, tc.osTag, uid, tc.kernel)
			if got != tc.want {
				t.Errorf("DaemonSetName = %q, want %q", got, tc.want)
			}
			if len(got) > 63 {
				t.Errorf("name %q is %d characters, over 63", got, len(got))
			}
		})
	}
}

func TestImage(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name       string
		spec       v1alpha1.NVIDIADriverSpec
		osTag, krn string
		want       string
		wantErr    string
	}{
		{"repository and image", v1alpha1.NVIDIADriverSpec{Repository: "nvcr.io/nvidia", Image: "driver", Version: "535.104.12"}, "ubuntu22.04", "", "nvcr.io/nvidia/driver:535.104.12-ubuntu22.04", ""},
		{"defaults", v1alpha1.NVIDIADriverSpec{Version: "550.90.07"}, "ubuntu20.04", "", "nvcr.io/nvidia/driver:550.90.07-ubuntu20.04", ""},
		{"full-path image without repository", v1alpha1.NVIDIADriverSpec{Image: "nvcr.io/nvidia/driver", Version: "535.104.12"}, "rhel9", "", "nvcr.io/nvidia/driver:535.104.12-rhel9", ""},
		{"registry with port", v1alpha1.NVIDIADriverSpec{Repository: "localhost:5000/mirror", Image: "driver", Version: "1.0"}, "ubuntu22.04", "", "localhost:5000/mirror/driver:1.0-ubuntu22.04", ""},
		{"precompiled", v1alpha1.NVIDIADriverSpec{Repository: "nvcr.io/nvidia", Image: "driver", Version: "535", UsePrecompiled: ptr.To(true)}, "ubuntu22.04", "5.15.0-84-generic", "nvcr.io/nvidia/driver:535-5.15.0-84-generic-ubuntu22.04", ""},
		{"digest gets no suffix", v1alpha1.NVIDIADriverSpec{Repository: "nvcr.io/nvidia", Image: "driver", Version: digest}, "ubuntu22.04", "", "nvcr.io/nvidia/driver@" + digest, ""},
		{"precompiled digest is an error", v1alpha1.NVIDIADriverSpec{Version: digest, UsePrecompiled: ptr.To(true)}, "ubuntu22.04", "k", "", "digest"},
		{"empty version is an error", v1alpha1.NVIDIADriverSpec{}, "ubuntu22.04", "", "", "version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Image(&tc.spec, tc.osTag, tc.krn)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Image = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Every image field against each way a user writes it: unset, name only,
// full path, repository only, digest. The wanted values are the images
// NVIDIA publishes (nvidia-fs and gdrdrv under nvcr.io/nvidia/cloud-native,
// tagged <version>-<os>; k8s-driver-manager tagged <version>).
func TestSidecarAndManagerImages(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const os = "ubuntu22.04"
	on := ptr.To(true)
	type fields struct{ repository, image, version string }
	forms := []struct {
		name    string
		in      fields
		gds     string // "" = an error
		gdrcopy string
		manager string
	}{
		{"unset", fields{}, "", "", "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"},
		{"version only", fields{version: "2.20.5"},
			"nvcr.io/nvidia/cloud-native/nvidia-fs:2.20.5-ubuntu22.04", "nvcr.io/nvidia/cloud-native/gdrdrv:2.20.5-ubuntu22.04",
			"nvcr.io/nvidia/cloud-native/k8s-driver-manager:2.20.5"},
		{"name only", fields{image: "custom"}, "", "",
			"nvcr.io/nvidia/cloud-native/custom:v0.8.1"},
		{"name and version", fields{image: "custom", version: "1.2"},
			"nvcr.io/nvidia/cloud-native/custom:1.2-ubuntu22.04", "nvcr.io/nvidia/cloud-native/custom:1.2-ubuntu22.04",
			"nvcr.io/nvidia/cloud-native/custom:1.2"},
		{"full path", fields{image: "mirror.local:5000/gpu/thing", version: "1.2"},
			"mirror.local:5000/gpu/thing:1.2-ubuntu22.04", "mirror.local:5000/gpu/thing:1.2-ubuntu22.04",
			"mirror.local:5000/gpu/thing:1.2"},
		{"repository only", fields{repository: "mirror.local/nv"}, "", "",
			"mirror.local/nv/k8s-driver-manager:v0.8.1"},
		{"repository and version", fields{repository: "mirror.local/nv", version: "1.2"},
			"mirror.local/nv/nvidia-fs:1.2-ubuntu22.04", "mirror.local/nv/gdrdrv:1.2-ubuntu22.04",
			"mirror.local/nv/k8s-driver-manager:1.2"},
		{"all three", fields{"r.io/x", "y", "v3"},
			"r.io/x/y:v3-ubuntu22.04", "r.io/x/y:v3-ubuntu22.04", "r.io/x/y:v3"},
		{"digest", fields{version: digest},
			"nvcr.io/nvidia/cloud-native/nvidia-fs@" + digest, "nvcr.io/nvidia/cloud-native/gdrdrv@" + digest,
			"nvcr.io/nvidia/cloud-native/k8s-driver-manager@" + digest},
	}
	const defManager = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			spec := v1alpha1.NVIDIADriverSpec{
				GPUDirectStorage: &v1alpha1.GPUDirectStorageSpec{Enabled: on, Repository: f.in.repository, Image: f.in.image, Version: f.in.version},
				GDRCopy:          &v1alpha1.GDRCopySpec{Enabled: on, Repository: f.in.repository, Image: f.in.image, Version: f.in.version},
				Manager:          v1alpha1.DriverManagerSpec{Repository: f.in.repository, Image: f.in.image, Version: f.in.version},
			}
			got, err := SidecarImages(&spec, os)
			if f.gds == "" {
				if err == nil || !strings.Contains(err.Error(), "spec.gds.version is empty") {
					t.Errorf("SidecarImages = %v, %v; want an error naming spec.gds.version", got, err)
				}
			} else if err != nil || got[SidecarGDS] != f.gds || got[SidecarGDRCopy] != f.gdrcopy {
				t.Errorf("SidecarImages = %v, %v; want gds %q, gdrcopy %q", got, err, f.gds, f.gdrcopy)
			}
			if m := ManagerImage(spec.Manager, defManager); m != f.manager {
				t.Errorf("ManagerImage = %q, want %q", m, f.manager)
			}
		})
	}

	// Disabled sidecars resolve to nothing, whatever they hold.
	if got, err := SidecarImages(&v1alpha1.NVIDIADriverSpec{GPUDirectStorage: &v1alpha1.GPUDirectStorageSpec{Version: "1"}}, os); err != nil || got != nil {
		t.Errorf("disabled sidecars = %v, %v", got, err)
	}
	// The controller's default manager image is used whole, a digest or a
	// registry port included, and its parts fill what a spec leaves out.
	if got := ManagerImage(v1alpha1.DriverManagerSpec{}, "localhost:5000/dm@"+digest); got != "localhost:5000/dm@"+digest {
		t.Errorf("default manager = %q", got)
	}
	if got := ManagerImage(v1alpha1.DriverManagerSpec{Version: "v9"}, "localhost:5000/m/dm"); got != "localhost:5000/m/dm:v9" {
		t.Errorf("manager version over an untagged default = %q", got)
	}
}

func TestSanitizeKernel(t *testing.T) {
	cases := map[string]string{
		"5.15.0-84-generic":            "5.15.0-84-generic",
		"5.14.0-427.13.1.el9_4.x86_64": "5.14.0-427.13.1.el9.4",
		"5.14.0-427.el9_4.aarch64_64k": "5.14.0-427.el9.4",
		"6.8.0-1008-NVIDIA_":           "6.8.0-1008-nvidia",
		"4.18.0-513.5.1.el8_9.aarch64": "4.18.0-513.5.1.el8.9",
	}
	for in, want := range cases {
		if got := SanitizeKernel(in); got != want {
			t.Errorf("SanitizeKernel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOSTag(t *testing.T) {
	tag, sel, ok := OSTag(map[string]string{LabelOSID: "rocky", LabelOSVersion: "9.3", LabelOSVersionMajor: "9"})
	if !ok || tag != "rocky9" || sel[LabelOSVersionMajor] != "9" || sel[LabelOSVersion] != "" {
		t.Errorf("OSTag rocky = %q %v %v", tag, sel, ok)
	}
	if _, _, ok := OSTag(map[string]string{LabelOSVersion: "22.04"}); ok {
		t.Error("OSTag without ID must fail")
	}
}

func TestUpgradeCounts(t *testing.T) {
	got := UpgradeCounts([]string{"", UpgradeDone, UpgradeDone, UpgradeFailed, "cordon-required", ""})
	want := map[string]int32{UpgradeDone: 2, UpgradeFailed: 1, "cordon-required": 1}
	if len(got) != len(want) {
		t.Fatalf("UpgradeCounts = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("UpgradeCounts[%s] = %d, want %d", k, got[k], v)
		}
	}
}
