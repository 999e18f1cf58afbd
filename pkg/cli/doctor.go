package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/doctor"
)

// DoctorOptions holds the flags of `kubectl nvdriver doctor`.
type DoctorOptions struct {
	Flags   *genericclioptions.ConfigFlags
	Streams streams
	NoColor *bool
	Name    string
	// NodeName is set by `doctor node/NAME`: explain one node.
	NodeName string
	Output   string
	// CheckImages asks the registries whether each pool's images exist.
	CheckImages bool
}

// NewCmdDoctor builds the doctor command.
func NewCmdDoctor(flags *genericclioptions.ConfigFlags, s streams, noColor *bool) *cobra.Command {
	o := &DoctorOptions{Flags: flags, Streams: s, NoColor: noColor, Output: "table", CheckImages: true}
	cmd := &cobra.Command{
		Use:   "doctor [NAME | node/NODE]",
		Short: "Find what keeps GPU drivers from running, and say how to fix it",
		Long: `Doctor automates the troubleshooting of NVIDIADrivers: CRD and controller (the nvdriver
controller or NVIDIA's GPU Operator) present and running, errors in the controller's
logs, driver conditions, conflicting node selectors, GPU nodes missing NFD labels or
covered by no driver, pre-installed and disabled nodes, DaemonSets selecting nothing,
driver pods failing (image pulls, crash loops, untolerated taints), nodes stuck or failed
in an upgrade or left cordoned, a ClusterPolicy still managing drivers itself, and driver
images missing from their registry (asked from this machine with your docker credentials
and the CRs' pull Secrets; --check-images=false uses only what the controller reported).
Each finding names the objects involved and a command that fixes it. It only reads.

With node/NODE it explains one node end to end: the NVIDIADriver that selects it (or why
none does), its pool and driver pod, its upgrade state and for how long, who cordoned it,
what it waits for, which pod blocks it and why (a PodDisruptionBudget allowing no
eviction, a pod the upgrade policy may not remove, a job still running), and the command
that unblocks it.

Exit status: 0 no error found, 3 at least one finding of severity error, 1 a failure.`,
		Example: `  kubectl nvdriver doctor
  kubectl nvdriver doctor demo-gold
  kubectl nvdriver doctor node/gpu-node-3
  kubectl nvdriver doctor -o json | jq '.findings[] | select(.severity=="error")'`,
		Args:              maxArgs(1, "NAME"),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.Name = args[0]
				if node, ok := strings.CutPrefix(o.Name, "node/"); ok {
					o.Name, o.NodeName = "", node
					if node == "" {
						return asUsage(usageErrorf("doctor node/NODE: give the node's name"))
					}
				}
			}
			if err := oneOf("--output", o.Output, "table", "json"); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table or json")
	cmd.Flags().BoolVar(&o.CheckImages, "check-images", o.CheckImages, "ask each image's registry whether the image exists")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion("table", "json"))
	return cmd
}

// Run takes the snapshot, runs the checks and prints the findings.
func (o *DoctorOptions) Run(ctx context.Context) error {
	c, cfg, err := clientFor(o.Flags)
	if err != nil {
		return err
	}
	snap, err := o.snapshot(ctx, c)
	if err != nil {
		return err
	}
	if snap.CRDInstalled && o.Name != "" {
		found := false
		for _, d := range snap.Drivers {
			found = found || d.Name == o.Name
		}
		if !found {
			return fmt.Errorf("NVIDIADriver %q not found", o.Name)
		}
	}
	if o.NodeName != "" {
		return o.explainNode(ctx, c, snap)
	}
	if cs, err := kubernetes.NewForConfig(cfg); err == nil {
		readControllerLogs(ctx, cs, snap)
	}
	if snap.CRDInstalled {
		snap.Webhook = webhookState(ctx, c, snap.Namespace)
	}
	if o.CheckImages && snap.CRDInstalled {
		p := snap.Plan()
		if o.Name != "" {
			_ = filterPlan(&p, []string{o.Name})
		}
		newPlanImages(c, snap.Namespace).check(ctx, &p, snap.Drivers, snap.PlanNodes())
		snap.ImagePlan = &p
	}
	report := doctor.Run(snap)
	if o.Output == "json" {
		if err := output.JSON(o.Streams.Out, report); err != nil {
			return err
		}
	} else if err := printFindings(o.Streams.Out, report, output.NewStyles(o.Streams.Out, *o.NoColor)); err != nil {
		return err
	}
	if report.Summary[doctor.Error] > 0 {
		return &FindingsError{Msg: "errors found"}
	}
	return nil
}

// explainNode is `doctor node/NAME`: the snapshot plus the pods on the node
// (one LIST by field selector) and the PodDisruptionBudgets.
func (o *DoctorOptions) explainNode(ctx context.Context, c client.Client, snap *doctor.Snapshot) error {
	var in doctor.NodeInputs
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", o.NodeName)}); err != nil {
		return fmt.Errorf("listing the pods on %s: %w", o.NodeName, err)
	}
	in.Pods = pods.Items
	pdbs := &policyv1.PodDisruptionBudgetList{}
	if err := c.List(ctx, pdbs); err != nil {
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("listing PodDisruptionBudgets: %w", err)
		}
		in.PDBsForbidden = forbiddenText(err)
	}
	in.PDBs = pdbs.Items
	report := doctor.ExplainNode(snap, o.NodeName, in)
	if o.Output == "json" {
		if err := output.JSON(o.Streams.Out, report); err != nil {
			return err
		}
	} else if err := printFindings(o.Streams.Out, report, output.NewStyles(o.Streams.Out, *o.NoColor)); err != nil {
		return err
	}
	if report.Summary[doctor.Error] > 0 {
		return &FindingsError{Msg: "errors found"}
	}
	return nil
}

func (o *DoctorOptions) snapshot(ctx context.Context, c client.Client) (*doctor.Snapshot, error) {
	s := &doctor.Snapshot{Now: time.Now(), Only: o.Name, MissingSecrets: map[string]string{}}
	crd := &apiextv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: "nvidiadrivers.nvidia.com"}, crd); err != nil {
		if apierrors.IsNotFound(err) {
			return s, nil
		}
		if !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("reading the NVIDIADriver CRD: %w", err)
		}
	}
	s.CRDInstalled = true
	drivers := &v1alpha1.NVIDIADriverList{}
	if err := c.List(ctx, drivers); err != nil {
		return nil, fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	s.Drivers = drivers.Items
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		if !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		s.NodesForbidden = forbiddenText(err)
	}
	s.Nodes = nodes.Items
	ns := namespaceFlag(o.Flags)
	sel, _ := metav1.LabelSelectorAsSelector(&doctor.DriverPodSelector)
	dss := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dss, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing driver DaemonSets: %w", err)
	}
	s.DaemonSets = dss.Items
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.MatchingLabelsSelector{Selector: sel}, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing driver pods: %w", err)
	}
	s.DriverPods = pods.Items
	s.Namespace = DefaultNamespace
	if ns != "" {
		s.Namespace = ns
	} else if len(s.DaemonSets) > 0 {
		s.Namespace = s.DaemonSets[0].Namespace
	}
	leases := &coordinationv1.LeaseList{}
	if err := c.List(ctx, leases, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", doctor.LeaseName)}); err != nil {
		if !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("listing leases: %w", err)
		}
		s.LeasesForbidden = "leases: " + forbiddenText(err)
	}
	s.Leases = leases.Items
	deps := &appsv1.DeploymentList{}
	if err := c.List(ctx, deps, client.MatchingLabels{"app.kubernetes.io/component": "gpu-operator"}); err != nil {
		if !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("listing deployments: %w", err)
		}
		s.DeploymentsForbidden = "deployments: " + forbiddenText(err)
	}
	s.OperatorDeployments = deps.Items
	cps, err := listClusterPolicies(ctx, c)
	if err != nil {
		return nil, err
	}
	s.ClusterPolicies = cps
	if s.Rules, _, err = detectRules(ctx, c, s.Drivers); err != nil {
		return nil, err
	}
	for _, d := range s.Drivers {
		if d.Spec.SecretEnv == "" {
			continue
		}
		sec := &metav1.PartialObjectMetadata{}
		sec.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := c.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: d.Spec.SecretEnv}, sec); apierrors.IsNotFound(err) {
			s.MissingSecrets[d.Name] = d.Spec.SecretEnv
		}
	}
	return s, nil
}

// readControllerLogs reads the last lines of the leader's pod, when the
// controller runs in the cluster (the Lease holder is "<pod>_<uuid>").
func readControllerLogs(ctx context.Context, cs kubernetes.Interface, s *doctor.Snapshot) {
	for _, l := range s.Leases {
		if l.Spec.HolderIdentity == nil {
			continue
		}
		pod := strings.SplitN(*l.Spec.HolderIdentity, "_", 2)[0]
		tail := int64(300)
		stream, err := cs.CoreV1().Pods(l.Namespace).GetLogs(pod, &corev1.PodLogOptions{TailLines: &tail}).Stream(ctx)
		if err != nil {
			continue // not a pod (run outside the cluster) or no access
		}
		s.LogNamespace, s.LogPod = l.Namespace, pod
		s.ControllerLogErrors = errorLines(stream)
		stream.Close()
		return
	}
}

// forbiddenText is the API's refusal in short: "forbidden: User "x" cannot list ...".
func forbiddenText(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "forbidden: "); i >= 0 {
		return msg[i:]
	}
	return msg
}

func errorLines(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"level":"error"`) || strings.HasPrefix(line, "E") && len(line) > 5 && line[1] >= '0' && line[1] <= '9' {
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			out = append(out, line)
		}
	}
	return out
}

func printFindings(w io.Writer, r doctor.Report, st *output.Styles) error {
	if len(r.Findings) == 0 {
		_, err := fmt.Fprintln(w, st.OK("No problem found."))
		return err
	}
	for _, f := range r.Findings {
		sev := strings.ToUpper(f.Severity)
		switch f.Severity {
		case doctor.Error:
			sev = st.Bad(sev)
		case doctor.Warning:
			sev = st.Warn(sev)
		default:
			sev = st.Dim(sev)
		}
		fmt.Fprintf(w, "%-7s [%s] %s\n", sev, f.Check, f.Message)
		if f.Fix != "" {
			fmt.Fprintf(w, "        fix: %s\n", f.Fix)
		}
	}
	_, err := fmt.Fprintf(w, "\n%d error(s), %d warning(s), %d info\n", r.Summary[doctor.Error], r.Summary[doctor.Warning], r.Summary[doctor.Info])
	return err
}
