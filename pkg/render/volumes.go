package render

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Where a distribution keeps package repository files and CA certificates;
// the driver container installs kernel headers from there.
var (
	repoConfigPath = map[string]string{
		"ubuntu": "/etc/apt/sources.list.d", "debian": "/etc/apt/sources.list.d",
		"rhel": "/etc/yum.repos.d", "rocky": "/etc/yum.repos.d", "ol": "/etc/yum.repos.d", "centos": "/etc/yum.repos.d", "rhcos": "/etc/yum.repos.d",
		"sles": "/etc/zypp/repos.d", "sle": "/etc/zypp/repos.d",
	}
	certConfigPath = map[string]string{
		"ubuntu": "/etc/ssl/certs", "debian": "/etc/ssl/certs",
		"rhel": "/etc/pki/ca-trust/extracted/pem", "rocky": "/etc/pki/ca-trust/extracted/pem", "ol": "/etc/pki/ca-trust/extracted/pem",
		"centos": "/etc/pki/ca-trust/extracted/pem", "rhcos": "/etc/pki/ca-trust/extracted/pem",
		"sles": "/etc/ssl", "sle": "/etc/ssl",
	}
)

func hostPath(name, path string, typ corev1.HostPathType) corev1.Volume {
	hp := &corev1.HostPathVolumeSource{Path: path}
	if typ != "" {
		hp.Type = ptr.To(typ)
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: hp}}
}

func configMap(name, cm string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm}}}}
}

// mofedMounts are the MOFED source and driver mounts; with host MOFED the
// sources come from the host's /usr/src.
func mofedMounts(_ *v1alpha1.NVIDIADriverSpec) []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: "mlnx-ofed-usr-src", MountPath: "/run/mellanox/drivers/usr/src", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		{Name: "run-mellanox-drivers", MountPath: "/run/mellanox/drivers", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
	}
}

func osID(pool plan.Pool) string {
	return strings.ToLower(pool.NodeSelector[plan.LabelOSID])
}

func driverMounts(d *v1alpha1.NVIDIADriver, pool plan.Pool) []corev1.VolumeMount {
	spec := &d.Spec
	m := []corev1.VolumeMount{
		{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
		{Name: "run-nvidia-fabricmanager", MountPath: "/run/nvidia-fabricmanager"},
		{Name: "run-nvidia-topologyd", MountPath: "/run/nvidia-topologyd"},
		{Name: "var-log", MountPath: "/var/log"},
		{Name: "dev-log", MountPath: "/dev/log"},
		{Name: "host-os-release", MountPath: "/host-etc/os-release", ReadOnly: true},
	}
	if spec.Type() == v1alpha1.VGPUHostManager {
		m = append(m,
			corev1.VolumeMount{Name: "cgroup", MountPath: "/sys/fs/cgroup"},
			corev1.VolumeMount{Name: "vfio", MountPath: "/dev/vfio"})
	}
	m = append(m, mofedMounts(spec)...)
	m = append(m,
		corev1.VolumeMount{Name: "firmware-search-path", MountPath: "/sys/module/firmware_class/parameters/path"},
		corev1.VolumeMount{Name: "host-sys-devices-system", MountPath: "/sys/devices/system"},
		corev1.VolumeMount{Name: "nv-firmware", MountPath: "/lib/firmware"},
		corev1.VolumeMount{Name: "driver-startup-probe-script", MountPath: "/usr/local/bin/startup-probe.sh", SubPath: "startup-probe.sh"},
	)
	if spec.RepoConfig != nil && spec.RepoConfig.Name != "" {
		if p, ok := repoConfigPath[osID(pool)]; ok {
			m = append(m, corev1.VolumeMount{Name: "repo-config", MountPath: p + "/custom-repo.list", SubPath: "custom-repo.list", ReadOnly: true})
		}
	}
	if spec.CertConfig != nil && spec.CertConfig.Name != "" {
		if p, ok := certConfigPath[osID(pool)]; ok {
			m = append(m, corev1.VolumeMount{Name: "cert-config", MountPath: p + "/custom-ca.crt", SubPath: "custom-ca.crt", ReadOnly: true})
		}
	}
	if lc := spec.LicensingConfig; lc != nil && (lc.SecretName != "" || lc.Name != "") {
		m = append(m, corev1.VolumeMount{Name: "licensing-config", MountPath: "/drivers/gridd.conf", SubPath: "gridd.conf", ReadOnly: true})
		if lc.NLSEnabled == nil || *lc.NLSEnabled {
			m = append(m, corev1.VolumeMount{Name: "licensing-config", MountPath: "/drivers/ClientConfigToken/client_configuration_token.tok",
				SubPath: "client_configuration_token.tok", ReadOnly: true})
		}
	}
	if spec.VirtualTopologyConfig != nil && spec.VirtualTopologyConfig.Name != "" {
		m = append(m, corev1.VolumeMount{Name: "topology-config", MountPath: "/etc/nvidia/nvidia-topologyd.conf", SubPath: "nvidia-topologyd.conf", ReadOnly: true})
	}
	if spec.KernelModuleConfig != nil && spec.KernelModuleConfig.Name != "" {
		m = append(m, corev1.VolumeMount{Name: "kernel-module-config", MountPath: "/drivers", ReadOnly: true})
	}
	return m
}

func volumes(d *v1alpha1.NVIDIADriver, pool plan.Pool, opts Options) []corev1.Volume {
	spec := &d.Spec
	mofedSrc := "/run/mellanox/drivers/usr/src"
	if v1alpha1.Enabled(rdma(spec).UseHostMOFED) {
		mofedSrc = "/usr/src"
	}
	v := []corev1.Volume{
		hostPath("run-nvidia", "/run/nvidia", corev1.HostPathDirectoryOrCreate),
		hostPath("var-log", "/var/log", ""),
		hostPath("dev-log", "/dev/log", ""),
		hostPath("host-os-release", "/etc/os-release", ""),
	}
	if spec.Type() == v1alpha1.VGPUHostManager {
		v = append(v, hostPath("cgroup", "/sys/fs/cgroup", ""), hostPath("vfio", "/dev/vfio", ""))
	}
	v = append(v,
		hostPath("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", corev1.HostPathDirectoryOrCreate),
		hostPath("run-nvidia-topologyd", "/run/nvidia-topologyd", corev1.HostPathDirectoryOrCreate),
		hostPath("mlnx-ofed-usr-src", mofedSrc, corev1.HostPathDirectoryOrCreate),
		hostPath("run-mellanox-drivers", "/run/mellanox/drivers", corev1.HostPathDirectoryOrCreate),
		hostPath("run-nvidia-validations", "/run/nvidia/validations", corev1.HostPathDirectoryOrCreate),
		hostPath("host-root", opts.HostRoot, ""),
		hostPath("host-sys", "/sys", corev1.HostPathDirectory),
		hostPath("firmware-search-path", "/sys/module/firmware_class/parameters/path", ""),
		hostPath("host-sys-devices-system", "/sys/devices/system", corev1.HostPathDirectory),
		hostPath("nv-firmware", "/run/nvidia/driver/lib/firmware", corev1.HostPathDirectoryOrCreate),
	)
	probe := configMap("driver-startup-probe-script", StartupProbeConfigMap)
	probe.ConfigMap.DefaultMode = ptr.To[int32](0o755)
	v = append(v, probe)
	if spec.RepoConfig != nil && spec.RepoConfig.Name != "" {
		if _, ok := repoConfigPath[osID(pool)]; ok {
			v = append(v, configMap("repo-config", spec.RepoConfig.Name))
		}
	}
	if spec.CertConfig != nil && spec.CertConfig.Name != "" {
		if _, ok := certConfigPath[osID(pool)]; ok {
			v = append(v, configMap("cert-config", spec.CertConfig.Name))
		}
	}
	if lc := spec.LicensingConfig; lc != nil && (lc.SecretName != "" || lc.Name != "") {
		if lc.SecretName != "" {
			v = append(v, corev1.Volume{Name: "licensing-config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: lc.SecretName}}})
		} else {
			v = append(v, configMap("licensing-config", lc.Name))
		}
	}
	if spec.VirtualTopologyConfig != nil && spec.VirtualTopologyConfig.Name != "" {
		v = append(v, configMap("topology-config", spec.VirtualTopologyConfig.Name))
	}
	if spec.KernelModuleConfig != nil && spec.KernelModuleConfig.Name != "" {
		v = append(v, configMap("kernel-module-config", spec.KernelModuleConfig.Name))
	}
	return v
}
