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

// ImageBase is the image path without tag: <repository>/<image>; with an empty
// repository a full-path image is used as it is and a bare name gets the
// default repository.
func ImageBase(repository, image string) string {
	if image == "" {
		image = DefaultImage
	}
	if repository == "" {
		if strings.Contains(image, "/") {
			return image
		}
		repository = DefaultRepository
	}
	return strings.TrimSuffix(repository, "/") + "/" + image
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
		return base + "@" + spec.Version, nil
	}
	if spec.IsPrecompiled() {
		return fmt.Sprintf("%s:%s-%s-%s", base, spec.Version, kernel, osTag), nil
	}
	return fmt.Sprintf("%s:%s-%s", base, spec.Version, osTag), nil
}

// SidecarImage resolves a GDS or GDRCopy image: <repository>/<image>:<version>-<osTag>
// (a digest version gets no suffix).
func SidecarImage(repository, image, version, osTag string) string {
	base := ImageBase(repository, image)
	if strings.HasPrefix(version, "sha256:") {
		return base + "@" + version
	}
	return fmt.Sprintf("%s:%s-%s", base, version, osTag)
}

// ManagerImage resolves the k8s-driver-manager image from the spec, or the
// given default when the spec leaves it empty.
func ManagerImage(m v1alpha1.DriverManagerSpec, def string) string {
	if m.Image == "" && m.Repository == "" && m.Version == "" {
		return def
	}
	base := ImageBase(m.Repository, m.Image)
	if m.Version == "" {
		return base
	}
	if strings.HasPrefix(m.Version, "sha256:") {
		return base + "@" + m.Version
	}
	return base + ":" + m.Version
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
