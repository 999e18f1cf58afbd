// Package doctor holds the troubleshooting checks of `kubectl nvdriver doctor`.
// Each check is a pure function of one snapshot of the cluster and returns
// findings with a severity, the objects involved and a fix. They automate the
// troubleshooting steps of NVIDIA's NVIDIADriver documentation and the failure
// modes its users report.
package doctor

import (
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// Severities.
const (
	Error   = "error"
	Warning = "warning"
	Info    = "info"
)

// LeaseName is the nvdriver controller's leader-election Lease.
const LeaseName = v1alpha1.ControllerLeaseName

// Finding is one result (stable JSON shape, documented in README).
type Finding struct {
	Check    string   `json:"check"`
	Severity string   `json:"severity"`
	Message  string   `json:"message"`
	Objects  []string `json:"objects"`
	Fix      string   `json:"fix"`
}

// Report is the doctor's output.
type Report struct {
	Findings []Finding      `json:"findings"`
	Summary  map[string]int `json:"summary"`
}

// Snapshot is everything the checks read, taken once.
type Snapshot struct {
	Now          time.Time
	CRDInstalled bool
	Namespace    string // driver namespace
	Drivers      []v1alpha1.NVIDIADriver
	Nodes        []corev1.Node
	DaemonSets   []appsv1.DaemonSet
	DriverPods   []corev1.Pod
	Leases       []coordinationv1.Lease
	// OperatorDeployments are NVIDIA GPU Operator Deployments.
	OperatorDeployments []appsv1.Deployment
	ClusterPolicies     []unstructured.Unstructured
	// MissingSecrets are secretEnv Secrets that do not exist, by driver.
	MissingSecrets map[string]string
	// ControllerLogErrors are recent error lines of the controller's pod, and
	// LogNamespace/LogPod say where they came from ("" when no pod was found).
	ControllerLogErrors []string
	LogNamespace        string
	LogPod              string
	// LeasesForbidden and DeploymentsForbidden hold the API's answer when
	// the user may not list them: doctor then cannot judge, and says so.
	LeasesForbidden      string
	DeploymentsForbidden string
	NodesForbidden       string
	// Rules is the conflict rule in force (plan.RulesNVDriver when empty).
	Rules string
	// Only limits driver-specific checks to one NVIDIADriver.
	Only string
	// Webhook is the admission webhook's state (nil: not looked at).
	Webhook *Webhook
	// ImagePlan is the plan with the registries' answers (Pool.ImageCheck,
	// Driver.KernelImages) when doctor asked them; nil when it did not.
	ImagePlan *plan.Plan
}

// Check is one troubleshooting check.
type Check struct {
	Name string
	Run  func(*Snapshot, *plan.Plan) []Finding
}

// Checks is every check, in the order findings are printed.
var Checks = []Check{
	{"crd-installed", checkCRD},
	{"access", checkAccess},
	{"controller-running", checkController},
	{"controller-logs", checkLogs},
	{"clusterpolicy-driver", checkClusterPolicy},
	{"driver-conditions", checkConditions},
	{"conflicting-selectors", checkConflicts},
	{"admission-webhook", checkWebhook},
	{"secret-env", checkSecrets},
	{"image-available", checkImages},
	{"version-tag", checkVersionWarnings},
	{"nfd-labels", checkNFD},
	{"uncovered-gpu-nodes", checkUncovered},
	{"skipped-nodes", checkSkipped},
	{"daemonset-no-nodes", checkEmptyDaemonSets},
	{"orphan-daemonsets", checkOrphans},
	{"driver-pods", checkPods},
	{"untolerated-taints", checkTaints},
	{"upgrades", checkUpgrades},
	{"rollouts", checkRollouts},
	{"cordoned-nodes", checkCordoned},
}

// Run runs every check.
func Run(s *Snapshot) Report {
	r := Report{Findings: []Finding{}, Summary: map[string]int{Error: 0, Warning: 0, Info: 0}}
	if !s.CRDInstalled {
		r.Findings = checkCRD(s, nil)
		r.Summary[Error] = 1
		return r
	}
	p := s.Plan()
	for _, c := range Checks[1:] {
		for _, f := range c.Run(s, &p) {
			f.Check = c.Name
			if f.Objects == nil {
				f.Objects = []string{}
			}
			r.Findings = append(r.Findings, f)
			r.Summary[f.Severity]++
		}
	}
	return r
}

// PlanNodes are the snapshot's nodes as the planner takes them.
func (s *Snapshot) PlanNodes() []plan.Node {
	nodes := make([]plan.Node, len(s.Nodes))
	for i := range s.Nodes {
		nodes[i] = plan.Node{Name: s.Nodes[i].Name, Labels: s.Nodes[i].Labels}
	}
	return nodes
}

// Plan is the plan the checks judge (the controller's, under s.Rules).
func (s *Snapshot) Plan() plan.Plan {
	return plan.ComputeWith(s.PlanNodes(), s.Drivers, plan.Options{Rules: s.Rules})
}

func (s *Snapshot) wants(driver string) bool { return s.Only == "" || s.Only == driver }

func checkCRD(s *Snapshot, _ *plan.Plan) []Finding {
	if s.CRDInstalled {
		return nil
	}
	return []Finding{{Check: "crd-installed", Severity: Error, Message: "the NVIDIADriver CRD (nvidiadrivers.nvidia.com) is not installed: install the chart (helm install nvdriver charts/nvdriver -n gpu-operator --create-namespace) or the CRD alone",
		Objects: []string{"customresourcedefinition/nvidiadrivers.nvidia.com"},
		Fix:     "kubectl apply --server-side -f charts/nvdriver/crds/"}}
}

// checkAccess says which checks could not run for lack of access: a
// Forbidden answer is not "not found".
func checkAccess(s *Snapshot, _ *plan.Plan) []Finding {
	if s.NodesForbidden == "" {
		return nil
	}
	return []Finding{{Severity: Info, Message: "cannot check nodes (" + s.NodesForbidden + "): the node, NFD, taint, upgrade and cordon checks were skipped",
		Fix: "kubectl auth can-i list nodes"}}
}

func checkController(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	fresh := false
	for _, l := range s.Leases {
		if l.Name != LeaseName || l.Spec.RenewTime == nil {
			continue
		}
		dur := 15 * time.Second
		if l.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		age := s.Now.Sub(l.Spec.RenewTime.Time)
		if age <= 2*dur {
			fresh = true
			out = append(out, Finding{Severity: Info, Message: fmt.Sprintf("the nvdriver controller is running (leader %s, lease renewed %s ago)", holder, age.Round(time.Second)),
				Objects: []string{"lease/" + l.Namespace + "/" + l.Name}})
		} else {
			out = append(out, Finding{Severity: Error, Message: fmt.Sprintf("the nvdriver controller's lease was last renewed %s ago by %s: the controller is not running", age.Round(time.Second), holder),
				Objects: []string{"lease/" + l.Namespace + "/" + l.Name},
				Fix:     fmt.Sprintf("kubectl -n %s get pods -l app.kubernetes.io/name=nvdriver; kubectl -n %s logs deploy/nvdriver-controller", l.Namespace, l.Namespace)})
		}
	}
	for _, d := range s.OperatorDeployments {
		obj := "deployment/" + d.Namespace + "/" + d.Name
		if d.Status.ReadyReplicas > 0 {
			fresh = true
			out = append(out, Finding{Severity: Info, Message: "NVIDIA's GPU Operator is running", Objects: []string{obj}})
		} else {
			out = append(out, Finding{Severity: Error, Message: "NVIDIA's GPU Operator Deployment has no ready replica", Objects: []string{obj},
				Fix: fmt.Sprintf("kubectl -n %s describe deployment %s; kubectl -n %s logs deployment/%s", d.Namespace, d.Name, d.Namespace, d.Name)})
		}
	}
	if !fresh {
		// NVIDIA's operator may run where doctor cannot see its Deployment;
		// its work shows: NVIDIA-style status on the CRs, and their DaemonSets
		// carrying the current spec.
		if names := reconciledByNVIDIA(s); len(names) > 0 {
			fresh = true
			out = append(out, Finding{Severity: Info, Objects: driverObjs(names),
				Message: fmt.Sprintf("NVIDIA's GPU Operator reconciles NVIDIADrivers (%s keep NVIDIA's status and DaemonSets on their current version), though its Deployment is not visible here", strings.Join(limit(names, 10), ", "))})
		}
	}
	var forbidden []string
	for _, what := range []string{s.LeasesForbidden, s.DeploymentsForbidden} {
		if what != "" {
			forbidden = append(forbidden, what)
		}
	}
	if len(forbidden) > 0 && !fresh {
		return append(out, Finding{Severity: Info,
			Message: "cannot check whether a controller runs (" + strings.Join(forbidden, "; ") + "): ask for read access to Leases and Deployments, or check with whoever runs the controller"})
	}
	if !fresh && len(out) == 0 {
		out = append(out, Finding{Severity: Error, Message: "no controller reconciles NVIDIADrivers: neither the nvdriver controller (Lease " + LeaseName + ") nor NVIDIA's GPU Operator was found; install the nvdriver chart (helm install nvdriver charts/nvdriver -n gpu-operator --create-namespace)",
			Fix: "kubectl get leases -A --field-selector metadata.name=" + LeaseName})
	}
	return out
}

// reconciledByNVIDIA names the CRs whose status NVIDIA's operator writes
// (a state, never our observedGeneration or finalizer) and whose DaemonSets
// carry the CR's current version: evidence the operator is at work.
func reconciledByNVIDIA(s *Snapshot) []string {
	var out []string
	for _, d := range s.Drivers {
		if d.Status.State == "" || d.Status.ObservedGeneration != 0 || hasFinalizer(d.Finalizers, v1alpha1.Finalizer) {
			continue
		}
		current, any := true, false
		for _, ds := range s.DaemonSets {
			if ownerName(&ds) != d.Name {
				continue
			}
			any = true
			cs := ds.Spec.Template.Spec.Containers
			if len(cs) == 0 || !strings.Contains(cs[0].Image, d.Spec.Version) || ds.Status.ObservedGeneration != ds.Generation {
				current = false
			}
		}
		if any && current {
			out = append(out, d.Name)
		}
	}
	return out
}

func hasFinalizer(fs []string, f string) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

func driverObjs(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "nvidiadriver/" + n
	}
	return out
}

func checkLogs(s *Snapshot, _ *plan.Plan) []Finding {
	if len(s.ControllerLogErrors) == 0 || s.LogPod == "" {
		return nil
	}
	lines := s.ControllerLogErrors
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return []Finding{{Severity: Warning, Message: fmt.Sprintf("%d error line(s) in the controller's recent logs; the last: %s", len(s.ControllerLogErrors), strings.Join(lines, " | ")),
		Objects: []string{"pod/" + s.LogNamespace + "/" + s.LogPod}, Fix: fmt.Sprintf("kubectl -n %s logs %s --tail=300", s.LogNamespace, s.LogPod)}}
}

func checkClusterPolicy(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, cp := range s.ClusterPolicies {
		enabled, found, _ := unstructured.NestedBool(cp.Object, "spec", "driver", "enabled")
		useCRD, _, _ := unstructured.NestedBool(cp.Object, "spec", "driver", "useNvidiaDriverCRD")
		if (!found || enabled) && !useCRD {
			out = append(out, Finding{Severity: Error,
				Message: "ClusterPolicy " + cp.GetName() + " still manages the GPU driver itself (spec.driver.useNvidiaDriverCRD is not true): NVIDIADrivers are ignored (state disabled) or fight its driver DaemonSet",
				Objects: []string{"clusterpolicy/" + cp.GetName()},
				Fix:     "kubectl patch clusterpolicy " + cp.GetName() + ` --type merge -p '{"spec":{"driver":{"useNvidiaDriverCRD":true}}}'`})
		}
	}
	return out
}

func checkConditions(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, d := range s.Drivers {
		if !s.wants(d.Name) {
			continue
		}
		obj := []string{"nvidiadriver/" + d.Name}
		if e := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionError); e != nil && e.Status == metav1.ConditionTrue {
			// Conflicts get their own check with the node list.
			if e.Reason == plan.ReasonConflictingNodeSelector || e.Reason == plan.ReasonConflictingDefault {
				continue
			}
			// A missing secretEnv Secret is the secret-env check's finding.
			if _, missing := s.MissingSecrets[d.Name]; missing {
				continue
			}
			out = append(out, Finding{Severity: Error, Message: fmt.Sprintf("%s: %s: %s", d.Name, e.Reason, e.Message), Objects: obj,
				Fix: "kubectl describe nvidiadriver " + d.Name})
			continue
		}
		if d.Status.State == "" {
			out = append(out, Finding{Severity: Warning, Message: d.Name + " has no status: no controller has reconciled it yet (see controller-running)", Objects: obj,
				Fix: "kubectl get leases -A --field-selector metadata.name=" + LeaseName})
			continue
		}
		if r := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionReady); r != nil && r.Status == metav1.ConditionFalse {
			if r.Reason == v1alpha1.ReasonImageMissing {
				continue // the image-available check says which image and what to do
			}
			if rolloutWaits(&d) {
				continue // the rollouts check says what it waits for
			}
			if held := heldByAutoUpgradeOff(s, &d); len(held) > 0 {
				out = append(out, Finding{Severity: Warning, Objects: append(obj, nodeObjs(held)...),
					Message: fmt.Sprintf("%s is %s because upgradePolicy.autoUpgrade is false: %d node(s) wait for an upgrade to be requested: %s", d.Name, d.Status.State, len(held), strings.Join(limit(held, 10), ", ")),
					Fix:     fmt.Sprintf("kubectl nvdriver upgrade %s --nodes %s", d.Name, strings.Join(first(held, 10), ","))})
				continue
			}
			out = append(out, Finding{Severity: Warning, Message: fmt.Sprintf("%s is %s: %s (normal for a short while after a change)", d.Name, d.Status.State, r.Message), Objects: obj,
				Fix: "kubectl nvdriver status " + d.Name})
		}
	}
	return out
}

// heldByAutoUpgradeOff names the nodes of a CR with autoUpgrade: false that
// wait in upgrade-required for someone to request them.
func heldByAutoUpgradeOff(s *Snapshot, d *v1alpha1.NVIDIADriver) []string {
	if d.Spec.UpgradePolicy == nil || d.Spec.UpgradePolicy.AutoUpgrade {
		return nil
	}
	var out []string
	for _, n := range s.Nodes {
		if n.Labels[plan.LabelOwner] == d.Name && n.Labels[plan.LabelUpgradeState] == "upgrade-required" && n.Annotations["nvidia.com/gpu-driver-upgrade-requested"] != "true" {
			out = append(out, n.Name)
		}
	}
	return out
}

func checkConflicts(s *Snapshot, p *plan.Plan) []Finding {
	var out []Finding
	groups := map[string][]string{} // drivers -> nodes
	for _, d := range p.Drivers {
		if d.Error != nil && d.Error.Reason == plan.ReasonConflictingDefault && s.wants(d.Name) {
			out = append(out, Finding{Severity: Error, Message: d.Name + ": " + d.Error.Message, Objects: []string{"nvidiadriver/" + d.Name},
				Fix: "kubectl patch nvidiadriver " + d.Name + ` --type merge -p '{"spec":{"default":false}}'`})
		}
		for _, c := range d.Conflicts {
			key := strings.Join(c.Drivers, ",")
			involved := false
			for _, n := range c.Drivers {
				involved = involved || s.wants(n)
			}
			if involved && !contains(groups[key], c.Node) {
				groups[key] = append(groups[key], c.Node)
			}
		}
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		nodes := groups[k]
		drivers := strings.Split(k, ",")
		objs := []string{}
		for _, d := range drivers {
			objs = append(objs, "nvidiadriver/"+d)
		}
		for _, n := range nodes {
			objs = append(objs, "node/"+n)
		}
		out = append(out, Finding{Severity: Error,
			Message: fmt.Sprintf("%d node(s) selected by more than one NVIDIADriver (%s): %s; make the nodeSelectors disjoint (edit them, or relabel the nodes with kubectl nvdriver assign) and check with preview", len(nodes), strings.Join(drivers, ", "), strings.Join(limit(nodes, 10), ", ")),
			Objects: objs,
			Fix:     "kubectl nvdriver preview " + strings.Join(drivers, " ") + " -o wide"})
	}
	return out
}

func checkSecrets(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	names := make([]string, 0, len(s.MissingSecrets))
	for d := range s.MissingSecrets {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		if !s.wants(d) {
			continue
		}
		sec := s.MissingSecrets[d]
		out = append(out, Finding{Severity: Error, Message: fmt.Sprintf("%s: spec.secretEnv names Secret %s/%s, which does not exist: driver pods cannot start; create it with the variables the driver needs, or remove spec.secretEnv", d, s.Namespace, sec),
			Objects: []string{"nvidiadriver/" + d, "secret/" + s.Namespace + "/" + sec},
			Fix:     fmt.Sprintf("kubectl -n %s create secret generic %s --from-literal=KEY=VALUE", s.Namespace, sec)})
	}
	return out
}

func checkVersionWarnings(s *Snapshot, p *plan.Plan) []Finding {
	var out []Finding
	for _, d := range p.Drivers {
		if !s.wants(d.Name) {
			continue
		}
		for _, w := range d.Warnings {
			if strings.Contains(w, "branch") {
				out = append(out, Finding{Severity: Warning, Message: d.Name + ": " + w + "; kubectl nvdriver upgrade " + d.Name + " --to FULL-VERSION sets one", Objects: []string{"nvidiadriver/" + d.Name}})
			}
		}
	}
	return out
}

func limit(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string{}, s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}

// first is at most n elements, for commands (limit's "and N more" is for
// messages: pasted into a command it would break it).
func first(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// DriverPodSelector selects driver pods of either driver type.
var DriverPodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{render.DriverComponentRequirement()}}
