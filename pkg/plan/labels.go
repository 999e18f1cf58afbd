package plan

import (
	"strings"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

// Node labels read and written by the plan. Names follow NVIDIA's GPU Operator
// exactly so that either controller can drive the same nodes.
const (
	LabelGPUPresent   = "nvidia.com/gpu.present"
	LabelDeployDriver = "nvidia.com/gpu.deploy.driver"
	LabelDeployVGPUM  = "nvidia.com/gpu.deploy.vgpu-manager"
	LabelOwner        = v1alpha1.OwnerLabel

	LabelOSID           = "feature.node.kubernetes.io/system-os_release.ID"
	LabelOSVersion      = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	LabelOSVersionMajor = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major"
	LabelKernel         = "feature.node.kubernetes.io/kernel-version.full"

	DeployPreInstalled = "pre-installed"
	DeployFalse        = "false"
)

// NFDGPULabels are NFD's labels for an NVIDIA PCI device (vendor 10de), any class.
var NFDGPULabels = []string{
	"feature.node.kubernetes.io/pci-10de.present",
	"feature.node.kubernetes.io/pci-0302_10de.present",
	"feature.node.kubernetes.io/pci-0300_10de.present",
}

// HasNFDGPU reports whether NFD found an NVIDIA PCI device on the node.
func HasNFDGPU(labels map[string]string) bool {
	for _, k := range NFDGPULabels {
		if labels[k] == "true" {
			return true
		}
	}
	return false
}

// IsGPUNode reports whether the plan treats the node as a GPU node: labelled
// gpu.present=true, or not yet labelled by a controller but seen by NFD (so a
// preview on a fresh cluster shows what the controller is about to do).
func IsGPUNode(labels map[string]string) bool {
	v, ok := labels[LabelGPUPresent]
	if ok {
		return v == "true"
	}
	return HasNFDGPU(labels)
}

// GPULabels returns the labels a controller adds to a node so the plan and the
// driver DaemonSets can select it: gpu.present on NFD GPU nodes, and
// deploy.driver=true only where it is absent or empty (pre-installed and false
// are the user's or the driver manager's decision and are never overwritten).
// It returns nil when nothing needs to change.
func GPULabels(labels map[string]string) map[string]string {
	if !HasNFDGPU(labels) {
		return nil
	}
	var out map[string]string
	if labels[LabelGPUPresent] != "true" {
		out = map[string]string{LabelGPUPresent: "true"}
	}
	if labels[LabelDeployDriver] == "" {
		if out == nil {
			out = map[string]string{}
		}
		out[LabelDeployDriver] = "true"
	}
	return out
}

// OSTag is NVIDIA's pool key for an OS release: ID plus VERSION_ID, major-only
// for the RHEL family (v26.7 behaviour). It also returns the OS labels a pool
// selects on. ok is false when a needed label is missing.
func OSTag(labels map[string]string) (tag string, selector map[string]string, ok bool) {
	tag, versionKey, ok := osTagOf(labels)
	if !ok {
		return "", nil, false
	}
	return tag, osSelector(labels, versionKey), true
}

// osTagOf is OSTag without the selector, which the planner needs once per
// pool, not once per node; versionKey is the version label it read.
func osTagOf(labels map[string]string) (tag, versionKey string, ok bool) {
	id := labels[LabelOSID]
	if id == "" {
		return "", "", false
	}
	versionKey = LabelOSVersion
	if majorOnly(id) {
		versionKey = LabelOSVersionMajor
	}
	ver := labels[versionKey]
	if ver == "" {
		return "", "", false
	}
	return id + ver, versionKey, true
}

func osSelector(labels map[string]string, versionKey string) map[string]string {
	return map[string]string{LabelOSID: labels[LabelOSID], versionKey: labels[versionKey]}
}

func majorOnly(id string) bool {
	switch strings.ToLower(id) {
	case "rhel", "rocky", "ol":
		return true
	}
	return false
}

// Upgrade protocol labels (NVIDIA's k8s-operator-libs, driver name "gpu").
const (
	LabelUpgradeState = "nvidia.com/gpu-driver-upgrade-state"
	UpgradeDone       = "upgrade-done"
	UpgradeFailed     = "upgrade-failed"
)

// UpgradeCounts counts nodes per upgrade state, the label's values; a node
// with no state is not counted. The controller's status and the plugin's
// status both count with it (over the pool's planned nodes, and over the
// nodes a DaemonSet selects, which is all a plugin reading NVIDIA's
// operator has).
func UpgradeCounts(states []string) map[string]int32 {
	out := map[string]int32{}
	for _, s := range states {
		if s != "" {
			out[s]++
		}
	}
	return out
}
