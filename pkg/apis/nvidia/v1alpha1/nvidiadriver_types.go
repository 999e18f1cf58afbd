package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Label and annotation keys shared with NVIDIA's GPU Operator. They are part of
// the wire protocol: tools written for NVIDIA's operator read them on our nodes.
const (
	// OwnerLabel routes a GPU node to exactly one NVIDIADriver. It is reserved:
	// a CR may not select on it.
	OwnerLabel = "nvidia.com/gpu-operator.driver.owner"
	// Finalizer keeps a CR until its nodes have been released safely.
	Finalizer = "nvidia.com/nvidiadriver-protection"
	// ConditionReady and ConditionError are the status condition types, as
	// NVIDIA's operator sets them (the plugin reads either backend's).
	ConditionReady = "Ready"
	ConditionError = "Error"
	// ConditionImageAvailable is ours: whether the registry has the images
	// being rolled out (docs/design.md, "Image preflight"); absent when the
	// controller's image check is off.
	ConditionImageAvailable = "ImageAvailable"
	// ConditionRolloutHalted is ours: True when the rollout's failed nodes
	// spent spec.upgradePolicy.failureBudget (docs/design.md, "Rollouts").
	ConditionRolloutHalted = "RolloutHalted"
	// The rollout history: ControllerRevisions in the driver namespace,
	// owned by their CR and labelled with its name (docs/design.md, "Rollouts").
	RevisionLabel               = "nvdriver.io/nvidiadriver"
	RevisionStartedAnnotation   = "nvdriver.io/rollout-started-at"
	RevisionCompletedAnnotation = "nvdriver.io/rollout-completed-at"
	RevisionNodesAnnotation     = "nvdriver.io/rollout-nodes"
	RevisionImagesAnnotation    = "nvdriver.io/rollout-images"
	// Reasons of ImageAvailable (ImageMissing is also Ready's reason while a
	// pool is held for its image).
	ReasonImagesFound         = "ImagesFound"
	ReasonNothingToCheck      = "NothingToCheck"
	ReasonImageMissing        = "ImageMissing"
	ReasonRegistryUnreachable = "RegistryUnreachable"
	ReasonRegistryAuthFailed  = "RegistryAuthFailed"
	ReasonRegistryError       = "RegistryError"
	ReasonInvalidReference    = "InvalidReference"
	// ControllerLeaseName is the nvdriver controller's leader-election Lease;
	// doctor judges the controller alive by its renewals.
	ControllerLeaseName = "nvdriver-controller"
	// The controller's validating admission webhook (pkg/webhook), named
	// here for the chart, the controller and doctor alike.
	WebhookConfigurationName = "nvdriver-webhook"
	WebhookSecretName        = "nvdriver-webhook-cert"
	WebhookServiceName       = "nvdriver-webhook"
)

// DriverType is the kind of driver a CR installs.
// +kubebuilder:validation:Enum=gpu;vgpu;vgpu-host-manager
type DriverType string

const (
	GPU             DriverType = "gpu"
	VGPU            DriverType = "vgpu"
	VGPUHostManager DriverType = "vgpu-host-manager"
)

// KernelModuleType selects open or proprietary kernel modules.
// +kubebuilder:validation:Enum=auto;open;proprietary
type KernelModuleType string

// State is the one-word summary in status.state.
// +kubebuilder:validation:Enum=ignored;ready;notReady;disabled
type State string

const (
	Ready    State = "ready"
	NotReady State = "notReady"
	Disabled State = "disabled"
)

// The CEL rules below are the admission checks (docs/design.md, "Admission"). Each message says
// what to change, because the user reads it straight from kubectl apply.
//
// NVIDIADriverSpec is the desired driver for a set of GPU nodes.
// +kubebuilder:validation:XValidation:rule="!(has(self.default) && self.default) || !has(self.nodeSelector) || size(self.nodeSelector) == 0",message="a default NVIDIADriver (spec.default: true) covers the GPU nodes no other NVIDIADriver selects and must not set spec.nodeSelector: remove spec.nodeSelector or set spec.default to false"
// +kubebuilder:validation:XValidation:rule="(has(self.driverType) ? self.driverType : 'gpu') == (has(oldSelf.driverType) ? oldSelf.driverType : 'gpu')",message="spec.driverType is immutable: create a new NVIDIADriver with the other driver type instead"
// +kubebuilder:validation:XValidation:rule="(has(self.usePrecompiled) && self.usePrecompiled) == (has(oldSelf.usePrecompiled) && oldSelf.usePrecompiled)",message="spec.usePrecompiled is immutable (setting or removing it included): create a new NVIDIADriver instead"
// +kubebuilder:validation:XValidation:rule="!(has(self.usePrecompiled) && self.usePrecompiled) || !has(self.gds) || !has(self.gds.enabled) || !self.gds.enabled",message="precompiled drivers do not support GPUDirect Storage: set spec.gds.enabled to false or spec.usePrecompiled to false"
// +kubebuilder:validation:XValidation:rule="!(has(self.usePrecompiled) && self.usePrecompiled) || !has(self.gdrcopy) || !has(self.gdrcopy.enabled) || !self.gdrcopy.enabled",message="precompiled drivers do not support GDRCopy: set spec.gdrcopy.enabled to false or spec.usePrecompiled to false"
// +kubebuilder:validation:XValidation:rule="has(self.version) && size(self.version) != 0",message="spec.version is required: set the driver version, e.g. 535.104.12 (or the branch, e.g. 535, with usePrecompiled: true)"
// +kubebuilder:validation:XValidation:rule="!has(self.version) || size(self.version) == 0 || !(has(self.usePrecompiled) && self.usePrecompiled) || self.version.matches('^[0-9]+$')",message="with usePrecompiled: true, spec.version must be a driver branch such as 535 (digits only), not a full version or a digest"
// +kubebuilder:validation:XValidation:rule="!has(self.version) || size(self.version) == 0 || (has(self.usePrecompiled) && self.usePrecompiled) || self.version.matches('^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$') || self.version.matches('^sha256:[a-f0-9]{64}$')",message="spec.version must be a valid image tag (letters, digits, '.', '_', '-', at most 128 characters, e.g. 535.104.12) or a digest sha256:<64 hex digits>"
// +kubebuilder:validation:XValidation:rule="!has(self.repository) || size(self.repository) == 0 || !has(self.image) || !self.image.contains('/') || !self.image.split('/')[0].matches('[.:]|^localhost$')",message="spec.image is a full image path while spec.repository is also set: set spec.image to the name only (e.g. driver) or clear spec.repository"
type NVIDIADriverSpec struct {
	// Default marks the fallback driver for GPU nodes that no non-default
	// NVIDIADriver selects. At most one CR is the working default.
	// +kubebuilder:default=false
	// +optional
	Default bool `json:"default"`

	// DriverType is gpu (datacenter), vgpu (guest) or vgpu-host-manager. Immutable.
	// +kubebuilder:default=gpu
	// +optional
	DriverType DriverType `json:"driverType,omitempty"`

	// UsePrecompiled deploys precompiled driver images, one DaemonSet per
	// kernel. Immutable.
	// +optional
	UsePrecompiled *bool `json:"usePrecompiled,omitempty"`

	// UseOpenKernelModules is deprecated; use kernelModuleType.
	// +optional
	UseOpenKernelModules *bool `json:"useOpenKernelModules,omitempty"`

	// KernelModuleType is auto, open or proprietary.
	// +kubebuilder:default=auto
	// +optional
	KernelModuleType KernelModuleType `json:"kernelModuleType,omitempty"`

	// Repository is the registry path holding the driver image, e.g. nvcr.io/nvidia.
	// Empty means spec.image is a full path (or nvcr.io/nvidia when image is a bare name).
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$')",message="spec.repository must be a registry path such as nvcr.io/nvidia: no scheme, tag, digest or trailing slash"
	// +optional
	Repository string `json:"repository,omitempty"`

	// Image is the driver image name (driver), or a full path when repository is empty.
	// +kubebuilder:default=driver
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$')",message="spec.image must be an image name without tag or digest, e.g. driver (or nvcr.io/nvidia/driver with no repository): put the version in spec.version"
	Image string `json:"image,omitempty"`

	// Version is the driver version (535.104.12), a sha256: digest, or with
	// usePrecompiled the branch (535). The OS tag is appended to form the tag.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Version string `json:"version,omitempty"`

	// ImagePullPolicy for the driver image.
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`

	// ImagePullSecrets are names of Secrets in the driver namespace.
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`

	// Manager configures the k8s-driver-manager init container.
	// +optional
	Manager DriverManagerSpec `json:"manager,omitempty"`

	// StartupProbe settings for the driver container; unset fields take the
	// driver defaults (initialDelay 60s, 5s precompiled; timeout 60s; period 10s;
	// failureThreshold 120), never the Kubernetes zero-value defaults.
	// +optional
	StartupProbe *ContainerProbeSpec `json:"startupProbe,omitempty"`
	// LivenessProbe is accepted for compatibility.
	// +optional
	LivenessProbe *ContainerProbeSpec `json:"livenessProbe,omitempty"`
	// ReadinessProbe is accepted for compatibility.
	// +optional
	ReadinessProbe *ContainerProbeSpec `json:"readinessProbe,omitempty"`

	// GPUDirectRDMA adds the nvidia-peermem sidecar.
	// +optional
	GPUDirectRDMA *GPUDirectRDMASpec `json:"rdma,omitempty"`
	// GPUDirectStorage adds the nvidia-fs sidecar.
	// +optional
	GPUDirectStorage *GPUDirectStorageSpec `json:"gds,omitempty"`
	// GDRCopy adds the gdrcopy sidecar.
	// +optional
	GDRCopy *GDRCopySpec `json:"gdrcopy,omitempty"`

	// NodeSelector picks the GPU nodes of this driver (all labels must match).
	// Absent or empty selects every GPU node.
	// +kubebuilder:validation:XValidation:rule="!('nvidia.com/gpu-operator.driver.owner' in self)",message="spec.nodeSelector must not use nvidia.com/gpu-operator.driver.owner: that label is set by the controller; select on your own label (e.g. driver.config)"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// NodeAffinity is accepted for compatibility with NVIDIA's schema.
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`

	// Labels added to the driver pods. app and app.kubernetes.io/* are reserved.
	// +kubebuilder:validation:XValidation:rule="self.all(k, k != 'app' && !k.startsWith('app.kubernetes.io/'))",message="spec.labels must not set app or app.kubernetes.io/* labels: they identify the driver DaemonSet; use another key"
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations added to the driver pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// Tolerations added to the driver pods (nvidia.com/gpu:NoSchedule is always there).
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'] || size(t.operator) == 0)",message="spec.tolerations[].operator must be Exists or Equal"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.effect) || t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'] || size(t.effect) == 0)",message="spec.tolerations[].effect must be NoSchedule, PreferNoSchedule or NoExecute (or empty for all)"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || size(t.value) == 0)",message="spec.tolerations[]: a toleration with operator Exists must not set a value"
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// PriorityClassName of the driver pods; system-node-critical when empty.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// PodSecurityContext for the driver pods.
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	// HostNetwork runs the driver pods in the host network namespace.
	// +optional
	HostNetwork *bool `json:"hostNetwork,omitempty"`

	// Env for the driver container.
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// Args for the driver container.
	// +optional
	Args []string `json:"args,omitempty"`
	// Resources for every container of the driver pod.
	// +optional
	Resources *ResourceRequirements `json:"resources,omitempty"`

	// RepoConfig names a ConfigMap with package repository files.
	// +optional
	RepoConfig *DriverRepoConfigSpec `json:"repoConfig,omitempty"`
	// CertConfig names a ConfigMap with custom certificates.
	// +optional
	CertConfig *DriverCertConfigSpec `json:"certConfig,omitempty"`
	// LicensingConfig for vGPU licensing.
	// +optional
	LicensingConfig *DriverLicensingConfigSpec `json:"licensingConfig,omitempty"`
	// VirtualTopologyConfig for vGPU.
	// +optional
	VirtualTopologyConfig *VirtualTopologyConfigSpec `json:"virtualTopologyConfig,omitempty"`
	// KernelModuleConfig names a ConfigMap with kernel module parameters.
	// +optional
	KernelModuleConfig *KernelModuleConfigSpec `json:"kernelModuleConfig,omitempty"`
	// SecretEnv names a Secret whose keys become driver container env.
	// +optional
	SecretEnv string `json:"secretEnv,omitempty"`

	// UpgradePolicy controls rolling driver upgrades on this CR's nodes.
	// +optional
	UpgradePolicy *DriverUpgradePolicySpec `json:"upgradePolicy,omitempty"`
}

// DriverManagerSpec configures the k8s-driver-manager init container. Fields
// left empty come from the controller's default manager image (see
// docs/design.md, "Images").
// +kubebuilder:validation:XValidation:rule="!has(self.version) || size(self.version) == 0 || self.version.matches('^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$') || self.version.matches('^sha256:[a-f0-9]{64}$')",message="spec.manager.version must be a valid image tag (e.g. v0.8.1) or a digest sha256:<64 hex digits>"
// +kubebuilder:validation:XValidation:rule="!has(self.image) || size(self.image) == 0 || self.image.matches('^([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$')",message="spec.manager.image must be an image name without tag or digest, e.g. k8s-driver-manager: put the version in spec.manager.version"
type DriverManagerSpec struct {
	// +kubebuilder:validation:Optional
	Repository string `json:"repository,omitempty"`
	// +kubebuilder:validation:Pattern=[a-zA-Z0-9\-]+
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
}

// ContainerProbeSpec holds probe timings; nil fields take the driver defaults.
type ContainerProbeSpec struct {
	// +optional
	InitialDelaySeconds *int32 `json:"initialDelaySeconds,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	PeriodSeconds *int32 `json:"periodSeconds,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	SuccessThreshold *int32 `json:"successThreshold,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	FailureThreshold *int32 `json:"failureThreshold,omitempty"`
}

// GPUDirectRDMASpec enables the nvidia-peermem sidecar.
type GPUDirectRDMASpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// UseHostMOFED uses the MOFED driver installed on the host.
	// +optional
	UseHostMOFED *bool `json:"useHostMofed,omitempty"`
}

// GPUDirectStorageSpec enables the nvidia-fs sidecar. See docs/design.md,
// "Images", for how its image is resolved.
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || !self.enabled || (has(self.version) && size(self.version) != 0)",message="spec.gds.version is required when spec.gds.enabled is true: set the nvidia-fs version, e.g. 2.20.5 (repository and image default to nvcr.io/nvidia/cloud-native and nvidia-fs)"
// +kubebuilder:validation:XValidation:rule="!has(self.version) || size(self.version) == 0 || self.version.matches('^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$') || self.version.matches('^sha256:[a-f0-9]{64}$')",message="spec.gds.version must be a valid image tag (e.g. 2.20.5) or a digest sha256:<64 hex digits>"
// +kubebuilder:validation:XValidation:rule="!has(self.image) || size(self.image) == 0 || self.image.matches('^([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$')",message="spec.gds.image must be an image name without tag or digest, e.g. nvidia-fs: put the version in spec.gds.version"
type GPUDirectStorageSpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Repository string `json:"repository,omitempty"`
	// +kubebuilder:validation:Pattern=[a-zA-Z0-9\-]+
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
}

// GDRCopySpec enables the gdrcopy sidecar.
// +kubebuilder:validation:XValidation:rule="!has(self.enabled) || !self.enabled || (has(self.version) && size(self.version) != 0)",message="spec.gdrcopy.version is required when spec.gdrcopy.enabled is true: set the gdrdrv version, e.g. v2.4.1 (repository and image default to nvcr.io/nvidia/cloud-native and gdrdrv)"
// +kubebuilder:validation:XValidation:rule="!has(self.version) || size(self.version) == 0 || self.version.matches('^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$') || self.version.matches('^sha256:[a-f0-9]{64}$')",message="spec.gdrcopy.version must be a valid image tag (e.g. v2.4.1) or a digest sha256:<64 hex digits>"
// +kubebuilder:validation:XValidation:rule="!has(self.image) || size(self.image) == 0 || self.image.matches('^([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$')",message="spec.gdrcopy.image must be an image name without tag or digest, e.g. gdrdrv: put the version in spec.gdrcopy.version"
type GDRCopySpec struct {
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +optional
	Repository string `json:"repository,omitempty"`
	// +kubebuilder:validation:Pattern=[a-zA-Z0-9\-]+
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	// +optional
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
}

// EnvVar is a plain name/value pair, as in NVIDIA's schema.
type EnvVar struct {
	Name string `json:"name"`
	// +optional
	Value string `json:"value,omitempty"`
}

// ResourceRequirements are requests and limits for the driver pod's containers.
type ResourceRequirements struct {
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

// DriverRepoConfigSpec names a ConfigMap with repository files.
type DriverRepoConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
}

// DriverCertConfigSpec names a ConfigMap with certificates.
type DriverCertConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
}

// DriverLicensingConfigSpec configures vGPU licensing.
type DriverLicensingConfigSpec struct {
	// Name of a ConfigMap (deprecated; use secretName).
	// +optional
	Name string `json:"name,omitempty"`
	// SecretName of a Secret with the licensing configuration.
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// NLSEnabled enables NVIDIA License System.
	// +optional
	NLSEnabled *bool `json:"nlsEnabled,omitempty"`
}

// VirtualTopologyConfigSpec names a ConfigMap for the vGPU topology daemon.
type VirtualTopologyConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
}

// KernelModuleConfigSpec names a ConfigMap with kernel module parameters.
type KernelModuleConfigSpec struct {
	// +optional
	Name string `json:"name,omitempty"`
}

// DriverUpgradePolicySpec mirrors NVIDIA's per-CR upgrade policy.
type DriverUpgradePolicySpec struct {
	// AutoUpgrade rolls nodes automatically when the driver changes; when false a
	// node is upgraded only when annotated nvidia.com/gpu-driver-upgrade-requested=true.
	// +kubebuilder:default=true
	// +optional
	AutoUpgrade bool `json:"autoUpgrade"`
	// MaxParallelUpgrades is how many nodes upgrade at once; 0 means unlimited.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxParallelUpgrades int `json:"maxParallelUpgrades"`
	// MaxUnavailable is how many of this CR's nodes may be unavailable at once,
	// a number or a percentage (rounded up, at least 1).
	// +kubebuilder:default="25%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="spec.upgradePolicy.maxUnavailable must be a non-negative number of nodes or a percentage from 0% to 100%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// +optional
	PodDeletion *PodDeletionSpec `json:"podDeletion,omitempty"`
	// +optional
	WaitForCompletion *WaitForCompletionSpec `json:"waitForCompletion,omitempty"`
	// +optional
	DrainSpec *DrainSpec `json:"drain,omitempty"`

	// The fields below are ours (not NVIDIA's): absent, a rollout behaves as
	// NVIDIA's does, except that one failed node halts it (failureBudget).
	// See docs/design.md, "Rollouts".

	// Paused stops the rollout: no further node starts its upgrade, nodes
	// already in it finish (`kubectl nvdriver rollout pause|resume`).
	// +optional
	Paused bool `json:"paused,omitempty"`
	// Canary upgrades a first wave of nodes, then waits for
	// `kubectl nvdriver rollout resume` or a bake time before the rest.
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`
	// FailureBudget is how many nodes may fail in one rollout before it halts
	// (no further node starts): a number or a percentage of the CR's nodes
	// (rounded up, at least 1). Default 1.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="spec.upgradePolicy.failureBudget must be a number of nodes (at least 1) or a percentage from 1% to 100%"
	// +optional
	FailureBudget *intstr.IntOrString `json:"failureBudget,omitempty"`
	// AutoRollback puts the last fully rolled-out revision back when the
	// rollout halts, as `kubectl nvdriver rollout undo` would (the controller
	// then writes the CR's driver fields). Off by default.
	// +optional
	AutoRollback bool `json:"autoRollback,omitempty"`
	// RevisionHistoryLimit is how many fully rolled-out revisions are kept as
	// ControllerRevisions for `kubectl nvdriver rollout history|undo`. Default 10.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RevisionHistoryLimit *int32 `json:"revisionHistoryLimit,omitempty"`
}

// PodDeletionSpec controls how GPU pods are evicted before a driver restart.
type PodDeletionSpec struct {
	// +kubebuilder:default=false
	// +optional
	Force bool `json:"force"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	TimeoutSecond int `json:"timeoutSeconds"`
	// +kubebuilder:default=false
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir"`
}

// WaitForCompletionSpec waits for selected jobs to finish before evicting.
type WaitForCompletionSpec struct {
	// PodSelector is a label selector for the pods to wait for.
	// +optional
	PodSelector string `json:"podSelector,omitempty"`
	// TimeoutSecond is how long to wait; 0 waits forever.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +optional
	TimeoutSecond int `json:"timeoutSeconds"`
}

// DrainSpec drains the node when GPU pod deletion fails.
type DrainSpec struct {
	// +kubebuilder:default=false
	// +optional
	Enable bool `json:"enable"`
	// +kubebuilder:default=false
	// +optional
	Force bool `json:"force"`
	// +optional
	PodSelector string `json:"podSelector,omitempty"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	TimeoutSecond int `json:"timeoutSeconds"`
	// +kubebuilder:default=false
	// +optional
	DeleteEmptyDir bool `json:"deleteEmptyDir"`
}

// NVIDIADriverStatus is what the controller observed.
type NVIDIADriverStatus struct {
	// State is ready or notReady (disabled/ignored are kept for NVIDIA compatibility).
	// +optional
	State State `json:"state,omitempty"`
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Namespace where the driver DaemonSets live.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Conditions Ready and Error.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Pools is one entry per driver DaemonSet.
	// +optional
	Pools []PoolStatus `json:"pools,omitempty"`
	// Rollout is the current (or last) rollout of the spec to the nodes (ours).
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
}

// PoolStatus reports one driver DaemonSet (one OS release, or kernel when precompiled).
type PoolStatus struct {
	OSTag string `json:"osTag"`
	// +optional
	Kernel    string `json:"kernel,omitempty"`
	DaemonSet string `json:"daemonSet"`
	Image     string `json:"image"`
	// +optional
	Nodes     int32 `json:"nodes"`
	Desired   int32 `json:"desired"`
	Ready     int32 `json:"ready"`
	Updated   int32 `json:"updated"`
	Available int32 `json:"available"`
	// Upgrade counts this pool's nodes per upgrade state.
	// +optional
	Upgrade map[string]int32 `json:"upgrade,omitempty"`
}

// NVIDIADriver installs one NVIDIA driver on the GPU nodes it selects.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName={nvd,nvdriver,nvdrivers}
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Default",type=boolean,JSONPath=`.spec.default`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.driverType`,priority=1
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`,priority=1
// +kubebuilder:printcolumn:name="Precompiled",type=boolean,JSONPath=`.spec.usePrecompiled`,priority=1
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.status.rollout.phase`,priority=1
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.upgradePolicy.paused`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NVIDIADriver struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NVIDIADriverSpec   `json:"spec,omitempty"`
	Status NVIDIADriverStatus `json:"status,omitempty"`
}

// NVIDIADriverList is a list of NVIDIADriver.
// +kubebuilder:object:root=true
type NVIDIADriverList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NVIDIADriver `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NVIDIADriver{}, &NVIDIADriverList{})
}

// IsPrecompiled reports whether the CR uses precompiled driver images.
func (s *NVIDIADriverSpec) IsPrecompiled() bool {
	return s.UsePrecompiled != nil && *s.UsePrecompiled
}

// Type returns the driver type, gpu when unset.
func (s *NVIDIADriverSpec) Type() DriverType {
	if s.DriverType == "" {
		return GPU
	}
	return s.DriverType
}

// Enabled reports whether an optional *bool switch is on.
func Enabled(b *bool) bool { return b != nil && *b }
