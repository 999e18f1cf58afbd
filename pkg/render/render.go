// Package render turns one pool of a plan into the driver DaemonSet. It is
// pure and follows NVIDIA's pod layout (pkg/render/testdata/nvidia holds
// NVIDIA's own rendered DaemonSets) so NVIDIA's real driver, driver-manager,
// peermem, nvidia-fs and gdrcopy images work unchanged on real GPU nodes.
package render

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// Labels and names on rendered objects (NVIDIA's).
const (
	LabelApp        = "app"
	LabelComponent  = "app.kubernetes.io/component"
	LabelOSVersion  = "nvidia.com/node.os-version"
	LabelPrecomp    = "nvidia.com/precompiled"
	LabelPrecompKrn = "nvidia.com/precompiled.kernel-version"
	LabelState      = "nvidia.com/gpu-operator.state"
	StateDriver     = "state-driver"

	ComponentDriver      = "nvidia-driver"
	ComponentVGPUManager = "nvidia-vgpu-host-manager"

	// ServiceAccount the controller ensures for every driver pod (docs/design.md, "Driver pod objects").
	ServiceAccount = "nvidia-driver"
	// StartupProbeConfigMap holds the driver container's startup probe script.
	StartupProbeConfigMap = "nvidia-driver-startup-probe"

	DefaultManagerImage      = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"
	DefaultPriorityClassName = "system-node-critical"

	ContainerManager = "k8s-driver-manager"
	ContainerDriver  = "nvidia-driver-ctr"
	ContainerPeermem = "nvidia-peermem-ctr"
	ContainerFS      = "nvidia-fs-ctr"
	ContainerGDRCopy = "nvidia-gdrcopy-ctr"
)

// DriverComponents are the component labels of driver pods of either type.
var DriverComponents = []string{ComponentDriver, ComponentVGPUManager}

// DriverComponentRequirement selects the driver pods (and DaemonSets) of
// either type: the anti-affinity between them, the controller's cache, the
// plugin and doctor all use it.
func DriverComponentRequirement() metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: LabelComponent, Operator: metav1.LabelSelectorOpIn, Values: slices.Clone(DriverComponents)}
}

// Options carry what the spec does not: where and with which defaults.
type Options struct {
	Namespace    string
	ManagerImage string // k8s-driver-manager image when spec.manager is empty
	HostRoot     string // host root mounted into the init container; "/" when empty
}

// Component is the app.kubernetes.io/component value for a driver type.
func Component(t v1alpha1.DriverType) string {
	if t == v1alpha1.VGPUHostManager {
		return ComponentVGPUManager
	}
	return ComponentDriver
}

// DeployLabel is the node label a driver type's pods require to be "true".
func DeployLabel(t v1alpha1.DriverType) string {
	if t == v1alpha1.VGPUHostManager {
		return plan.LabelDeployVGPUM
	}
	return plan.LabelDeployDriver
}

// DaemonSet renders the driver DaemonSet of one pool.
func DaemonSet(d *v1alpha1.NVIDIADriver, pool plan.Pool, opts Options) *appsv1.DaemonSet {
	if opts.ManagerImage == "" {
		opts.ManagerImage = DefaultManagerImage
	}
	if opts.HostRoot == "" {
		opts.HostRoot = "/"
	}
	labels := poolLabels(d, pool)
	dsLabels := maps.Clone(labels)
	dsLabels[LabelState] = StateDriver
	var dsAnnotations map[string]string
	podAnnotations := map[string]string{"kubectl.kubernetes.io/default-container": ContainerDriver}
	if len(d.Spec.Annotations) > 0 {
		dsAnnotations = maps.Clone(d.Spec.Annotations)
		maps.Copy(podAnnotations, d.Spec.Annotations)
	}
	return &appsv1.DaemonSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name: pool.DaemonSet, Namespace: opts.Namespace, Labels: dsLabels, Annotations: dsAnnotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, v1alpha1.GroupVersion.WithKind("NVIDIADriver"))},
		},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{LabelApp: pool.DaemonSet}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: podAnnotations},
				Spec:       podSpec(d, pool, opts),
			},
		},
	}
}

// poolLabels are the DaemonSet's and its pods' labels: the user's first, so
// ours win; app and app.kubernetes.io/* are never taken from the user
// (admission rejects them; this guards objects admitted before).
func poolLabels(d *v1alpha1.NVIDIADriver, pool plan.Pool) map[string]string {
	spec := &d.Spec
	labels := map[string]string{}
	for k, v := range spec.Labels {
		if k != LabelApp && !strings.HasPrefix(k, "app.kubernetes.io/") {
			labels[k] = v
		}
	}
	labels[LabelApp] = pool.DaemonSet
	labels[LabelComponent] = Component(spec.Type())
	labels[LabelOSVersion] = pool.OSTag
	labels[LabelPrecomp] = fmt.Sprint(spec.IsPrecompiled())
	if pool.Kernel != "" {
		labels[LabelPrecompKrn] = plan.SanitizeKernel(pool.Kernel)
	}
	return labels
}

// podSpec is the driver pod: NVIDIA's shape (one per node, host PID, the
// manager init container, the driver and its sidecars).
func podSpec(d *v1alpha1.NVIDIADriver, pool plan.Pool, opts Options) corev1.PodSpec {
	spec := &d.Spec
	typ := spec.Type()
	nodeSelector := map[string]string{DeployLabel(typ): "true"}
	maps.Copy(nodeSelector, pool.NodeSelector)
	pod := corev1.PodSpec{
		Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				// Both driver components: one driver pod per node whatever its type
				// (NVIDIA's list names nvidia-vgpu-manager, which no pod carries).
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{DriverComponentRequirement()}},
				TopologyKey:   "kubernetes.io/hostname",
			}},
		}},
		HostPID:            true,
		NodeSelector:       nodeSelector,
		PriorityClassName:  spec.PriorityClassName,
		ServiceAccountName: ServiceAccount,
		Tolerations: append([]corev1.Toleration{{
			Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		}}, spec.Tolerations...),
		SecurityContext: spec.PodSecurityContext.DeepCopy(),
	}
	if pod.PriorityClassName == "" {
		pod.PriorityClassName = DefaultPriorityClassName
	}
	if v1alpha1.Enabled(spec.HostNetwork) {
		pod.HostNetwork = true
		pod.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	}
	if typ == v1alpha1.VGPUHostManager {
		pod.TerminationGracePeriodSeconds = ptr.To[int64](120)
	}
	pod.ImagePullSecrets = PullSecrets(spec)
	digest := ConfigDigest(d, pool, opts)
	resources := resourceRequirements(spec.Resources)
	pod.InitContainers = []corev1.Container{managerContainer(d, opts, digest, resources)}
	pod.Containers = containers(d, pool, digest, resources)
	pod.Volumes = volumes(d, pool, opts)
	return pod
}

// containers are the driver container and the enabled sidecars.
func containers(d *v1alpha1.NVIDIADriver, pool plan.Pool, digest string, resources corev1.ResourceRequirements) []corev1.Container {
	spec := &d.Spec
	out := []corev1.Container{driverContainer(d, pool, digest, resources)}
	if v1alpha1.Enabled(rdma(spec).Enabled) {
		out = append(out, peermemContainer(d, pool, resources))
	}
	if g := spec.GPUDirectStorage; g != nil && v1alpha1.Enabled(g.Enabled) {
		out = append(out, sidecar(ContainerFS, pool.Sidecars[plan.SidecarGDS],
			g.ImagePullPolicy, "nvidia-gds-driver", "lsmod | grep nvidia_fs", g.Env, g.Args, resources))
	}
	if g := spec.GDRCopy; g != nil && v1alpha1.Enabled(g.Enabled) {
		out = append(out, sidecar(ContainerGDRCopy, pool.Sidecars[plan.SidecarGDRCopy],
			g.ImagePullPolicy, "nvidia-gdrcopy-driver", "lsmod | grep gdrdrv", g.Env, g.Args, resources))
	}
	return out
}

func rdma(spec *v1alpha1.NVIDIADriverSpec) v1alpha1.GPUDirectRDMASpec {
	if spec.GPUDirectRDMA == nil {
		return v1alpha1.GPUDirectRDMASpec{}
	}
	return *spec.GPUDirectRDMA
}

func pullPolicy(p string) corev1.PullPolicy {
	if p == "" {
		return corev1.PullIfNotPresent
	}
	return corev1.PullPolicy(p)
}

// PullSecrets are the CR's image pull Secrets, each once, in the order the pods list them.
func PullSecrets(spec *v1alpha1.NVIDIADriverSpec) []corev1.LocalObjectReference {
	var names []string
	seen := map[string]bool{}
	add := func(list []string) {
		for _, n := range list {
			if n != "" && !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	add(spec.ImagePullSecrets)
	add(spec.Manager.ImagePullSecrets)
	if spec.GPUDirectStorage != nil && v1alpha1.Enabled(spec.GPUDirectStorage.Enabled) {
		add(spec.GPUDirectStorage.ImagePullSecrets)
	}
	if spec.GDRCopy != nil && v1alpha1.Enabled(spec.GDRCopy.Enabled) {
		add(spec.GDRCopy.ImagePullSecrets)
	}
	if len(names) == 0 {
		return nil
	}
	out := make([]corev1.LocalObjectReference, len(names))
	for i, n := range names {
		out[i] = corev1.LocalObjectReference{Name: n}
	}
	return out
}

func resourceRequirements(r *v1alpha1.ResourceRequirements) corev1.ResourceRequirements {
	if r == nil {
		return corev1.ResourceRequirements{}
	}
	return corev1.ResourceRequirements{Limits: r.Limits.DeepCopy(), Requests: r.Requests.DeepCopy()}
}

func envVars(list []v1alpha1.EnvVar) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(list))
	for _, e := range list {
		out = append(out, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	return out
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func privileged(seLinux bool) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{Privileged: ptr.To(true)}
	if seLinux {
		sc.SELinuxOptions = &corev1.SELinuxOptions{Level: "s0"}
	}
	return sc
}

func rdmaEnv(spec *v1alpha1.NVIDIADriverSpec) []corev1.EnvVar {
	r := rdma(spec)
	if !v1alpha1.Enabled(r.Enabled) {
		return nil
	}
	env := []corev1.EnvVar{{Name: "GPU_DIRECT_RDMA_ENABLED", Value: "true"}}
	if v1alpha1.Enabled(r.UseHostMOFED) {
		env = append(env, corev1.EnvVar{Name: "USE_HOST_MOFED", Value: "true"})
	}
	return env
}

func managerContainer(d *v1alpha1.NVIDIADriver, opts Options, digest string, res corev1.ResourceRequirements) corev1.Container {
	spec := &d.Spec
	up := spec.UpgradePolicy
	drain := v1alpha1.DrainSpec{}
	if up != nil && up.DrainSpec != nil {
		drain = *up.DrainSpec
	}
	env := []corev1.EnvVar{
		fieldEnv("NODE_NAME", "spec.nodeName"),
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"},
		{Name: "ENABLE_GPU_POD_EVICTION", Value: "true"},
		{Name: "ENABLE_AUTO_DRAIN", Value: fmt.Sprint(drain.Enable)},
		{Name: "DRAIN_USE_FORCE", Value: fmt.Sprint(drain.Force)},
		{Name: "DRAIN_POD_SELECTOR_LABEL", Value: drain.PodSelector},
		{Name: "DRAIN_TIMEOUT_SECONDS", Value: fmt.Sprintf("%ds", drain.TimeoutSecond)},
		{Name: "DRAIN_DELETE_EMPTYDIR_DATA", Value: fmt.Sprint(drain.DeleteEmptyDir)},
		fieldEnv("OPERATOR_NAMESPACE", "metadata.namespace"),
		{Name: ConfigDigestEnv, Value: digest},
	}
	env = append(env, rdmaEnv(spec)...)
	env = append(env, envVars(spec.Manager.Env)...)
	mounts := []corev1.VolumeMount{
		{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
		{Name: "host-root", MountPath: "/host", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		{Name: "host-sys", MountPath: "/sys"},
		{Name: "run-mellanox-drivers", MountPath: "/run/mellanox/drivers", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
	}
	return corev1.Container{
		Name:            ContainerManager,
		Image:           plan.ManagerImage(spec.Manager, opts.ManagerImage),
		ImagePullPolicy: pullPolicy(spec.Manager.ImagePullPolicy),
		Command:         []string{"driver-manager"},
		Args:            []string{"uninstall_driver"},
		Env:             env,
		Resources:       res,
		SecurityContext: privileged(false),
		VolumeMounts:    mounts,
	}
}

func driverContainer(d *v1alpha1.NVIDIADriver, pool plan.Pool, digest string, res corev1.ResourceRequirements) corev1.Container {
	spec := &d.Spec
	env := []corev1.EnvVar{
		{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"},
		fieldEnv("NODE_NAME", "spec.nodeName"),
		fieldEnv("NODE_IP", "status.hostIP"),
		{Name: ConfigDigestEnv, Value: digest},
	}
	if kmt := string(spec.KernelModuleType); kmt != "" && kmt != "auto" {
		env = append(env, corev1.EnvVar{Name: "KERNEL_MODULE_TYPE", Value: kmt})
		if kmt == "open" {
			env = append(env, corev1.EnvVar{Name: "OPEN_KERNEL_MODULES_ENABLED", Value: "true"})
		}
	}
	env = append(env, rdmaEnv(spec)...)
	if spec.GPUDirectStorage != nil && v1alpha1.Enabled(spec.GPUDirectStorage.Enabled) {
		env = append(env, corev1.EnvVar{Name: "GDS_ENABLED", Value: "true"})
	}
	if spec.GDRCopy != nil && v1alpha1.Enabled(spec.GDRCopy.Enabled) {
		env = append(env, corev1.EnvVar{Name: "GDRCOPY_ENABLED", Value: "true"})
	}
	if spec.LicensingConfig != nil && (spec.LicensingConfig.SecretName != "" || spec.LicensingConfig.Name != "") {
		nls := spec.LicensingConfig.NLSEnabled == nil || *spec.LicensingConfig.NLSEnabled
		env = append(env, corev1.EnvVar{Name: "GPU_NLS_ENABLED", Value: fmt.Sprint(nls)})
	}
	env = append(env, envVars(spec.Env)...)

	c := corev1.Container{
		Name:            ContainerDriver,
		Image:           pool.Image,
		ImagePullPolicy: pullPolicy(spec.ImagePullPolicy),
		Command:         []string{"nvidia-driver"},
		Args:            append([]string{"init"}, spec.Args...),
		Env:             env,
		Resources:       res,
		SecurityContext: privileged(true),
		VolumeMounts:    driverMounts(d, pool),
	}
	if spec.SecretEnv != "" {
		c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: spec.SecretEnv}}}}
	}
	if spec.Type() != v1alpha1.VGPUHostManager {
		c.StartupProbe = StartupProbe(spec)
		c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{
			"/bin/sh", "-c", "rm -f /run/nvidia/validations/.driver-ctr-ready /run/nvidia/validations/.driver-daemons-status",
		}}}}
	}
	return c
}

// StartupProbe merges the spec's (possibly partial) probe with the driver
// defaults field by field, so an unset field never becomes a Kubernetes
// zero-value default (timeout 1s, failureThreshold 3 would kill a driver build).
func StartupProbe(spec *v1alpha1.NVIDIADriverSpec) *corev1.Probe {
	initial := int32(60)
	if spec.IsPrecompiled() {
		initial = 5
	}
	p := &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "/usr/local/bin/startup-probe.sh"}}},
		InitialDelaySeconds: initial, TimeoutSeconds: 60, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 120,
	}
	if s := spec.StartupProbe; s != nil {
		set := func(dst *int32, src *int32) {
			if src != nil {
				*dst = *src
			}
		}
		set(&p.InitialDelaySeconds, s.InitialDelaySeconds)
		set(&p.TimeoutSeconds, s.TimeoutSeconds)
		set(&p.PeriodSeconds, s.PeriodSeconds)
		set(&p.SuccessThreshold, s.SuccessThreshold)
		set(&p.FailureThreshold, s.FailureThreshold)
	}
	return p
}

func peermemContainer(d *v1alpha1.NVIDIADriver, pool plan.Pool, res corev1.ResourceRequirements) corev1.Container {
	probe := func(initial, failure int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "nvidia-driver probe_nvidia_peermem"}}},
			InitialDelaySeconds: initial, TimeoutSeconds: 10, PeriodSeconds: map[bool]int32{true: 30, false: 10}[failure == 1],
			SuccessThreshold: 1, FailureThreshold: failure,
		}
	}
	return corev1.Container{
		Name:            ContainerPeermem,
		Image:           pool.Image,
		ImagePullPolicy: pullPolicy(d.Spec.ImagePullPolicy),
		Command:         []string{"nvidia-driver"},
		Args:            []string{"reload_nvidia_peermem"},
		Env:             []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}},
		Resources:       res,
		SecurityContext: privileged(true),
		LivenessProbe:   probe(30, 1),
		StartupProbe:    probe(10, 120),
		VolumeMounts: append([]corev1.VolumeMount{
			{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
			{Name: "var-log", MountPath: "/var/log"},
			{Name: "dev-log", MountPath: "/dev/log", ReadOnly: true},
		}, mofedMounts(&d.Spec)[1:]...),
	}
}

func sidecar(name, image, policy, installer, probeCmd string, env []v1alpha1.EnvVar, args []string, res corev1.ResourceRequirements) corev1.Container {
	script := fmt.Sprintf("until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep nvidia; do echo  Waiting for nvidia-driver to be installed...; sleep 10; done; exec %s install", installer)
	if len(args) > 0 {
		script += " " + strings.Join(args, " ")
	}
	return corev1.Container{
		Name:            name,
		Image:           image,
		ImagePullPolicy: pullPolicy(policy),
		Command:         []string{"bash", "-xc"},
		Args:            []string{script},
		Env:             envVars(env),
		Resources:       res,
		SecurityContext: privileged(true),
		StartupProbe: &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", probeCmd}}},
			InitialDelaySeconds: 10, TimeoutSeconds: 10, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 120,
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "run-nvidia", MountPath: "/run/nvidia", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
			{Name: "var-log", MountPath: "/var/log"},
			{Name: "dev-log", MountPath: "/dev/log", ReadOnly: true},
		},
	}
}

// ConfigDigestEnv is NVIDIA's name for the config digest in the driver
// container (and k8s-driver-manager's): the same value means the same
// install, and they skip the unload.
const ConfigDigestEnv = "DRIVER_CONFIG_DIGEST"

// PodConfigDigest is the config digest a driver pod (or template) runs with,
// "" when it has none.
func PodConfigDigest(spec *corev1.PodSpec) string {
	for _, c := range spec.Containers {
		for _, e := range c.Env {
			if e.Name == ConfigDigestEnv {
				return e.Value
			}
		}
	}
	return ""
}

// ConfigDigest hashes the install-relevant parts of a pool's driver, as
// NVIDIA's DRIVER_CONFIG_DIGEST does: k8s-driver-manager skips unloading the
// driver when it is unchanged. Cosmetic fields (labels, tolerations, probes)
// are left out on purpose.
func ConfigDigest(d *v1alpha1.NVIDIADriver, pool plan.Pool, opts Options) string {
	s := &d.Spec
	in := struct {
		Type             v1alpha1.DriverType
		Image, Manager   string
		KernelModuleType v1alpha1.KernelModuleType
		Args             []string
		Env              []v1alpha1.EnvVar
		RDMA             *v1alpha1.GPUDirectRDMASpec
		GDS              *v1alpha1.GPUDirectStorageSpec
		GDRCopy          *v1alpha1.GDRCopySpec
		Repo, Cert, Kmod string
		Licensing        *v1alpha1.DriverLicensingConfigSpec
		Topology         string
		Kernel, HostRoot string
		UsePrecompiled   bool
		SecretEnv        string
		ManagerEnv       []v1alpha1.EnvVar
		// ImagePullPolicies is always empty and stays: the digest is a hash
		// of this struct's JSON, and dropping a field would change every
		// pool's digest, so upgrading the controller would restart every
		// driver pod for nothing (docs/design.md, "Config digest").
		ImagePullPolicies string
	}{
		Type: s.Type(), Image: pool.Image, Manager: plan.ManagerImage(s.Manager, opts.ManagerImage),
		KernelModuleType: s.KernelModuleType, Args: s.Args, Env: s.Env,
		RDMA: s.GPUDirectRDMA, GDS: s.GPUDirectStorage, GDRCopy: s.GDRCopy,
		Licensing: s.LicensingConfig, Kernel: pool.Kernel, HostRoot: opts.HostRoot,
		UsePrecompiled: s.IsPrecompiled(), SecretEnv: s.SecretEnv, ManagerEnv: s.Manager.Env,
	}
	if s.RepoConfig != nil {
		in.Repo = s.RepoConfig.Name
	}
	if s.CertConfig != nil {
		in.Cert = s.CertConfig.Name
	}
	if s.KernelModuleConfig != nil {
		in.Kmod = s.KernelModuleConfig.Name
	}
	if s.VirtualTopologyConfig != nil {
		in.Topology = s.VirtualTopologyConfig.Name
	}
	data, _ := json.Marshal(in)
	h := fnv.New32a()
	_, _ = h.Write(data)
	return fmt.Sprint(h.Sum32())
}
