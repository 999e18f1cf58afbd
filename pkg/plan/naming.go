package plan

import (
	"fmt"
	"hash/fnv"
	"strings"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// Defaults of the image fields, as in NVIDIA's documentation.
const (
	DefaultRepository = "nvcr.io/nvidia"
	DefaultImage      = "driver"
)

const maxNameLen = 63

// DaemonSetName is NVIDIA's name for a pool's DaemonSet:
// nvidia-<driverType>-driver-<osTag>-<hash>, hash over the CR UID (plus
// "-<kernel>" when precompiled). The prefix is cut so the name fits in 63
// characters and the hash survives.
func DaemonSetName(driverType v1alpha1.DriverType, osTag, uid, kernel string) string {
	s := uid
	if kernel != "" {
		s = uid + "-" + kernel
	}
	hash := hashString(s)
	prefix := fmt.Sprintf("nvidia-%s-driver-%s", driverType, osTag)
	if len(prefix)+1+len(hash) > maxNameLen {
		prefix = strings.TrimRight(prefix[:maxNameLen-1-len(hash)], "-.")
	}
	return prefix + "-" + hash
}

// hashString is NVIDIA's GetStringHash: the decimal FNV-32a sum, made
// DNS-safe by SafeEncodeString.
func hashString(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// Defaults of the sidecar and k8s-driver-manager images: NVIDIA's Helm chart
// values, which publish all three under its cloud-native repository. NVIDIA's
// operator has no defaults for them in the CR (it refuses a GDS or GDRCopy
// spec without repository and image); we fill them, so a CR that sets only
// the version gets the image NVIDIA's chart would have written. See
// docs/design.md, "Images".
const (
	DefaultComponentRepository = "nvcr.io/nvidia/cloud-native"
	DefaultGDSImage            = "nvidia-fs"
	DefaultGDRCopyImage        = "gdrdrv"
	DefaultManagerImageName    = "k8s-driver-manager"
)

// ImageBase is the driver image path without tag: <repository>/<image>; with
// an empty repository a full-path image is used as it is and a bare name gets
// the default repository.
func ImageBase(repository, image string) string {
	return imageBase(repository, image, DefaultRepository, DefaultImage)
}

func imageBase(repository, image, defRepository, defImage string) string {
	if image == "" {
		image = defImage
	}
	if repository == "" {
		if strings.Contains(image, "/") {
			return image
		}
		repository = defRepository
	}
	return strings.TrimSuffix(repository, "/") + "/" + image
}

// withVersion adds a tag, or a digest when the version is one.
func withVersion(base, version string) string {
	if strings.HasPrefix(version, "sha256:") {
		return base + "@" + version
	}
	return base + ":" + version
}

// Image resolves a driver image as NVIDIA does: <base>:<version>-<osTag>,
// precompiled <base>:<version>-<kernel>-<osTag>, and a sha256: version gives
// <base>@sha256:... with no suffix.
func Image(spec *v1alpha1.NVIDIADriverSpec, osTag, kernel string) (string, error) {
	if spec.Version == "" {
		return "", fmt.Errorf("spec.version is empty")
	}
	base := ImageBase(spec.Repository, spec.Image)
	if strings.HasPrefix(spec.Version, "sha256:") {
		if spec.IsPrecompiled() {
			return "", fmt.Errorf("a precompiled driver cannot use a digest version")
		}
		return withVersion(base, spec.Version), nil
	}
	if spec.IsPrecompiled() {
		return fmt.Sprintf("%s:%s-%s-%s", base, spec.Version, kernel, osTag), nil
	}
	return fmt.Sprintf("%s:%s-%s", base, spec.Version, osTag), nil
}

// Sidecar images by spec field, the keys of Pool.Sidecars.
const (
	SidecarGDS     = "gds"
	SidecarGDRCopy = "gdrcopy"
)

// SidecarImages resolves the enabled GDS and GDRCopy images of a pool, keyed
// by SidecarGDS and SidecarGDRCopy: <repository>/<image>:<version>-<osTag>
// as NVIDIA tags them (a digest version gets no suffix), repository and image
// defaulting to NVIDIA's published nvidia-fs and gdrdrv. A sidecar with no
// version cannot be resolved (admission refuses it; this guards CRs stored
// before that rule).
func SidecarImages(spec *v1alpha1.NVIDIADriverSpec, osTag string) (map[string]string, error) {
	var out map[string]string
	add := func(key, field string, enabled *bool, repository, image, version, defImage string) error {
		if !v1alpha1.Enabled(enabled) {
			return nil
		}
		if version == "" {
			return fmt.Errorf("spec.%s.version is empty: set the %s version (spec.%s is enabled)", field, defImage, field)
		}
		img := withVersion(imageBase(repository, image, DefaultComponentRepository, defImage), version)
		if !strings.HasPrefix(version, "sha256:") {
			img += "-" + osTag
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = img
		return nil
	}
	if g := spec.GPUDirectStorage; g != nil {
		if err := add(SidecarGDS, "gds", g.Enabled, g.Repository, g.Image, g.Version, DefaultGDSImage); err != nil {
			return nil, err
		}
	}
	if g := spec.GDRCopy; g != nil {
		if err := add(SidecarGDRCopy, "gdrcopy", g.Enabled, g.Repository, g.Image, g.Version, DefaultGDRCopyImage); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ManagerImage resolves the k8s-driver-manager image. An empty spec.manager
// gives def (the controller's --driver-manager-image) unchanged; otherwise
// each of repository, image and version the spec leaves empty is taken from
// def, so `manager: {version: v0.8.2}` keeps the default registry and name
// and a mirror's `repository` keeps name and tag.
func ManagerImage(m v1alpha1.DriverManagerSpec, def string) string {
	if m.Image == "" && m.Repository == "" && m.Version == "" {
		return def
	}
	defBase, defVersion := splitImage(def)
	defRepository, defName := DefaultComponentRepository, DefaultManagerImageName
	if i := strings.LastIndex(defBase, "/"); i > 0 {
		defRepository, defName = defBase[:i], defBase[i+1:]
	}
	version := m.Version
	if version == "" {
		version = defVersion
	}
	base := imageBase(m.Repository, m.Image, defRepository, defName)
	if version == "" {
		return base
	}
	return withVersion(base, version)
}

// splitImage cuts an image reference into its path and its tag or digest
// (without the separator); a ':' inside the registry host is a port.
func splitImage(ref string) (base, version string) {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i], ref[i+1:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, ""
}

// SanitizeKernel is NVIDIA's label form of a kernel version: the architecture
// suffix dropped, '_' turned into '.', no trailing '.', lower case.
func SanitizeKernel(k string) string {
	for _, suf := range []string{".x86_64", ".aarch64_64k", ".aarch64", "_64k"} {
		k = strings.TrimSuffix(k, suf)
	}
	k = strings.ReplaceAll(k, "_", ".")
	k = strings.TrimRight(k, ".")
	return strings.ToLower(k)
}
