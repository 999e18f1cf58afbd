package upgrade

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UsesGPU reports whether a pod requests GPUs or MIG slices (nvidia.com/gpu*,
// nvidia.com/mig-*): the pods an upgrade evicts.
func UsesGPU(p *corev1.Pod) bool {
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range list {
				if strings.HasPrefix(string(name), "nvidia.com/gpu") || strings.HasPrefix(string(name), "nvidia.com/mig-") {
					return true
				}
			}
		}
	}
	return false
}

// Refusal says why a pod-removing step with rules rm may not remove the pod,
// as the spec.upgradePolicy.<field> setting that would allow it ("" when it
// may): kubectl drain's --delete-emptydir-data and --force rules, which the
// controller applies through k8s.io/kubectl/pkg/drain.
func Refusal(p *corev1.Pod, rm Removal, field string) string {
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil && !rm.DeleteEmptyDir {
			return "it has an emptyDir volume whose data would be lost: set spec.upgradePolicy." + field + ".deleteEmptyDir: true to allow"
		}
	}
	if metav1.GetControllerOf(p) == nil && !rm.Force {
		return "no controller would recreate it: set spec.upgradePolicy." + field + ".force: true to allow"
	}
	return ""
}
