package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/cli/output"
	"github.com/nvdriver/nvdriver/pkg/doctor"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
)

// StatusReport is the stable JSON/YAML shape of `status` (documented in README).
type StatusReport struct {
	Drivers []DriverStatus `json:"drivers"`
}

// DriverStatus is one NVIDIADriver.
type DriverStatus struct {
	Name       string             `json:"name"`
	State      string             `json:"state"`
	DriverType string             `json:"driverType"`
	Version    string             `json:"version"`
	Conditions []metav1.Condition `json:"conditions"`
	Pools      []PoolStatus       `json:"pools"`
	// Paused is spec.upgradePolicy.paused; Rollout the controller's
	// status.rollout (absent with NVIDIA's operator).
	Paused  bool                    `json:"paused,omitempty"`
	Rollout *v1alpha1.RolloutStatus `json:"rollout,omitempty"`
	// Nodes is filled with --nodes.
	Nodes []NodeView `json:"nodes,omitempty"`
}

// PoolStatus is one driver DaemonSet with its live counts.
type PoolStatus struct {
	OSTag     string           `json:"osTag"`
	Kernel    string           `json:"kernel"`
	DaemonSet string           `json:"daemonSet"`
	Image     string           `json:"image"`
	Desired   int32            `json:"desired"`
	Ready     int32            `json:"ready"`
	Updated   int32            `json:"updated"`
	Available int32            `json:"available"`
	Upgrade   map[string]int32 `json:"upgrade"`
}

// StatusOptions holds the flags of `kubectl nvdriver status`.
type StatusOptions struct {
	Flags   *genericclioptions.ConfigFlags
	Streams streams
	NoColor *bool
	Name    string
	Output  string
	Watch   bool
	// Nodes adds one row per node (status --nodes).
	Nodes bool
	// watchLost is set while -w's informers cannot reach the API server.
	watchLost atomic.Bool
}

// NewCmdStatus builds the status command.
func NewCmdStatus(flags *genericclioptions.ConfigFlags, s streams, noColor *bool) *cobra.Command {
	o := &StatusOptions{Flags: flags, Streams: s, NoColor: noColor, Output: "table"}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show each NVIDIADriver's state, pools, DaemonSet counts and upgrade progress",
		Long: `Status reads the NVIDIADrivers, their driver DaemonSets and the nodes' upgrade states and
shows per driver: state, type, version, one row per pool with the DaemonSet's desired,
ready, updated and available pods, the nodes per upgrade state, and the message of a
failing condition. It works with the nvdriver controller and with NVIDIA's GPU Operator.

With --nodes it adds one row per node: its pool, the image its driver pod runs and the
pod's age, its upgrade state and for how long, who cordoned it (nvdriver or an admin),
and what it waits for (a canary, a pause, a halt, a job, a pod that is not Ready).`,
		Example: `  kubectl nvdriver status
  kubectl nvdriver status demo-gold -o wide
  kubectl nvdriver status demo-gold --nodes
  kubectl nvdriver status -w`,
		Args:              maxArgs(1, "NAME"),
		ValidArgsFunction: completeDrivers(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.Name = args[0]
			}
			if err := o.Validate(); err != nil {
				return asUsage(err)
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table, wide, json or yaml")
	cmd.Flags().BoolVarP(&o.Watch, "watch", "w", false, "redraw whenever a driver, DaemonSet or node changes")
	cmd.Flags().BoolVar(&o.Nodes, "nodes", false, "one row per node: pool, image, pod age, upgrade state and time in it, who cordoned it, what it waits for")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion("table", "wide", "json", "yaml"))
	return cmd
}

// Validate rejects bad flags.
func (o *StatusOptions) Validate() error {
	return oneOf("--output", o.Output, "table", "wide", "json", "yaml")
}

// Run prints the status once, or on every change with -w.
func (o *StatusOptions) Run(ctx context.Context) error {
	c, cfg, err := clientFor(o.Flags)
	if err != nil {
		return err
	}
	if !o.Watch {
		report, err := o.read(ctx, c)
		if err != nil {
			return err
		}
		return o.print(o.Streams.Out, report)
	}
	return o.watch(ctx, cfg)
}

// watch follows drivers, driver DaemonSets and nodes through informers: they
// list, watch, and list again whenever the server closes a watch (an API
// server restart, a compacted resource version), so -w never freezes. A frame
// is printed only when it differs from the last one.
// watchCache is the cache status -w reads, not yet started (the
// NVIDIADrivers, the driver DaemonSets and node metadata) and a channel that
// ticks on any change to them.
func (o *StatusOptions) watchCache(ctx context.Context, cfg *rest.Config) (cache.Cache, <-chan struct{}, error) {
	sel, _ := metav1.LabelSelectorAsSelector(&doctor.DriverPodSelector)
	dsOpts := cache.ByObject{Label: sel}
	if ns := namespaceFlag(o.Flags); ns != "" {
		dsOpts.Namespaces = map[string]cache.Config{ns: {}}
	}
	nodeMeta := &metav1.PartialObjectMetadata{}
	nodeMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	// Every request of the informers passes observeAPI: they retry failed
	// lists and watches by themselves, and tell no one.
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(o.observeAPI)
	// With --nodes, the driver pods too (by their label, as the DaemonSets).
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme, Mapper: restMapper(),
		ByObject: map[client.Object]cache.ByObject{&appsv1.DaemonSet{}: dsOpts, &corev1.Pod{}: dsOpts}})
	if err != nil {
		return nil, nil, err
	}
	changes := make(chan struct{}, 1)
	notify := func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	watched := []client.Object{&v1alpha1.NVIDIADriver{}, &appsv1.DaemonSet{}, nodeMeta}
	if o.Nodes {
		watched = append(watched, &corev1.Node{}, &corev1.Pod{})
	}
	for _, obj := range watched {
		inf, err := informers.GetInformer(ctx, obj)
		if err != nil {
			return nil, nil, fmt.Errorf("watching: %w", err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, nil, err
		}
	}
	return informers, changes, nil
}

// observeAPI says once on stderr that the API server stopped answering (a
// transport error, 429 or 5xx) and once when a request succeeds again.
func (o *StatusOptions) observeAPI(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		switch {
		case err != nil && req.Context().Err() == nil:
			if o.watchLost.CompareAndSwap(false, true) {
				fmt.Fprintf(o.Streams.ErrOut, "warning: watching the API server failed (%v); still following\n", err)
			}
		case err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500):
			if o.watchLost.CompareAndSwap(false, true) {
				fmt.Fprintf(o.Streams.ErrOut, "warning: watching the API server failed (HTTP %d); still following\n", resp.StatusCode)
			}
		case err == nil && resp.StatusCode < 300:
			if o.watchLost.CompareAndSwap(true, false) {
				fmt.Fprintln(o.Streams.ErrOut, "warning: API server back; following again")
			}
		}
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (o *StatusOptions) watch(ctx context.Context, cfg *rest.Config) error {
	informers, changes, err := o.watchCache(ctx, cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	tty := output.IsTerminal(o.Streams.Out)
	last := ""
	// Bursts (a rollout changes many objects at once) are coalesced into one
	// frame per interval.
	const coalesce = 200 * time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	pending := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			if !pending {
				pending = true
				timer.Reset(coalesce)
			}
		case <-timer.C:
			pending = false
			report, err := o.read(ctx, informers)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			var frame bytes.Buffer
			if err := o.print(&frame, report); err != nil {
				return err
			}
			if frame.String() == last {
				continue
			}
			last = frame.String()
			if tty {
				fmt.Fprint(o.Streams.Out, "\033[H\033[2J")
			} else {
				fmt.Fprintf(o.Streams.Out, "--- %s\n", time.Now().Format(time.RFC3339))
			}
			if _, err := o.Streams.Out.Write(frame.Bytes()); err != nil {
				return err
			}
		}
	}
}

func (o *StatusOptions) print(w io.Writer, r *StatusReport) error {
	switch o.Output {
	case "json":
		return output.JSON(w, r)
	case "yaml":
		return output.YAML(w, r)
	}
	// Colour follows the real output stream, not the frame buffer.
	if err := PrintStatusTable(w, r, o.Output == "wide", output.NewStyles(o.Streams.Out, *o.NoColor)); err != nil {
		return err
	}
	return printNodeTables(w, r)
}

// readStatus builds the report from one LIST each of drivers, driver
// DaemonSets and node metadata.
func readStatus(ctx context.Context, c client.Reader, name, namespace string) (*StatusReport, error) {
	in, err := readInputs(ctx, c, namespace)
	if err != nil {
		return nil, err
	}
	return buildStatus(in, name)
}

// read is readStatus, with the nodes when asked.
func (o *StatusOptions) read(ctx context.Context, c client.Reader) (*StatusReport, error) {
	in, err := readInputs(ctx, c, namespaceFlag(o.Flags))
	if err != nil {
		return nil, err
	}
	r, err := buildStatus(in, o.Name)
	if err != nil || !o.Nodes {
		return r, err
	}
	return r, readNodeViews(ctx, c, r, in.drivers, namespaceFlag(o.Flags), time.Now())
}

func buildStatus(in *inputs, name string) (*StatusReport, error) {
	r := &StatusReport{Drivers: []DriverStatus{}}
	dsByOwner := map[string][]appsv1.DaemonSet{}
	for _, ds := range in.daemonSets {
		if ref := metav1.GetControllerOf(&ds); ref != nil && ref.Kind == "NVIDIADriver" {
			dsByOwner[string(ref.UID)] = append(dsByOwner[string(ref.UID)], ds)
		}
	}
	found := false
	for _, d := range in.drivers {
		if name != "" && d.Name != name {
			continue
		}
		found = true
		state := string(d.Status.State)
		if state == "" {
			state = "unknown"
		}
		ds := DriverStatus{Name: d.Name, State: state, DriverType: string(d.Spec.Type()), Version: d.Spec.Version,
			Conditions: d.Status.Conditions, Pools: []PoolStatus{}, Rollout: d.Status.Rollout,
			Paused: d.Spec.UpgradePolicy != nil && d.Spec.UpgradePolicy.Paused}
		if ds.Conditions == nil {
			ds.Conditions = []metav1.Condition{}
		}
		owned := dsByOwner[string(d.UID)]
		sort.Slice(owned, func(i, j int) bool { return owned[i].Name < owned[j].Name })
		for _, set := range owned {
			p := PoolStatus{OSTag: set.Labels[render.LabelOSVersion], DaemonSet: set.Name,
				Kernel:  set.Spec.Template.Spec.NodeSelector[plan.LabelKernel],
				Desired: set.Status.DesiredNumberScheduled, Ready: set.Status.NumberReady,
				Updated: set.Status.UpdatedNumberScheduled, Available: set.Status.NumberAvailable, Upgrade: map[string]int32{}}
			if cs := set.Spec.Template.Spec.Containers; len(cs) > 0 {
				p.Image = cs[0].Image
			}
			sel := labels.SelectorFromSet(set.Spec.Template.Spec.NodeSelector)
			var states []string
			for _, n := range in.nodes {
				if sel.Matches(labels.Set(n.Labels)) {
					states = append(states, n.Labels[plan.LabelUpgradeState])
				}
			}
			p.Upgrade = plan.UpgradeCounts(states)
			ds.Pools = append(ds.Pools, p)
		}
		r.Drivers = append(r.Drivers, ds)
	}
	if name != "" && !found {
		return nil, fmt.Errorf("NVIDIADriver %q not found", name)
	}
	return r, nil
}

// PrintStatusTable renders the report for people.
func PrintStatusTable(w io.Writer, r *StatusReport, wide bool, st *output.Styles) error {
	if len(r.Drivers) == 0 {
		_, err := fmt.Fprintln(w, "No NVIDIADriver found. Create one with `kubectl nvdriver assign NAME --nodes ... --version ...`.")
		return err
	}
	headers := []string{"name", "state", "type", "version", "pool", "daemonset", "desired", "ready", "updated", "available", "upgrade"}
	if wide {
		headers = append(headers, "image")
	}
	var rows [][]string
	var messages []string
	for _, d := range r.Drivers {
		state := d.State
		switch state {
		case "ready":
			state = st.OK(state)
		case "notReady":
			state = st.Bad(state)
		}
		first := []string{d.Name, state, d.DriverType, d.Version}
		if len(d.Pools) == 0 {
			row := append(first, "<none>", "-", "0", "0", "0", "0", "-")
			if wide {
				row = append(row, "-")
			}
			rows = append(rows, row)
		}
		for i, p := range d.Pools {
			lead := first
			if i > 0 {
				lead = []string{"", "", "", ""}
			}
			pool := p.OSTag
			if p.Kernel != "" {
				pool += "/" + p.Kernel
			}
			row := append(append([]string{}, lead...), pool, p.DaemonSet, fmt.Sprint(p.Desired), fmt.Sprint(p.Ready), fmt.Sprint(p.Updated), fmt.Sprint(p.Available), upgradeSummary(p.Upgrade))
			if wide {
				row = append(row, p.Image)
			}
			rows = append(rows, row)
		}
		if c := failing(d.Conditions); c != nil {
			messages = append(messages, fmt.Sprintf("%s: %s=%s (%s): %s", d.Name, c.Type, c.Status, c.Reason, c.Message))
		}
		if m := rolloutLine(d); m != "" {
			messages = append(messages, m)
		}
	}
	if err := output.Table(w, headers, rows); err != nil {
		return err
	}
	if len(messages) > 0 {
		fmt.Fprintln(w)
		for _, m := range messages {
			fmt.Fprintln(w, st.Warn(m))
		}
	}
	return nil
}

// rolloutLine tells of a rollout that is not simply done: its phase, wave
// counts and what it waits for ("" when complete or unknown).
func rolloutLine(d DriverStatus) string {
	r := d.Rollout
	if r == nil || (r.Phase == v1alpha1.RolloutComplete && !d.Paused) {
		return ""
	}
	phase := r.Phase
	if d.Paused && phase != v1alpha1.RolloutPaused && phase != v1alpha1.RolloutHalted {
		phase = "PAUSED, " + phase
	} else if phase == v1alpha1.RolloutPaused {
		phase = "PAUSED"
	}
	line := fmt.Sprintf("%s: rollout %s: %d/%d node(s) done, %d in flight, %d failed", d.Name, phase, r.Done, r.Total, r.InFlight, r.Failed)
	for _, p := range r.Pools {
		line += fmt.Sprintf("; %s %s (%d to go)", p.DaemonSet, p.Change, p.Pending)
	}
	if r.Message != "" {
		line += "; " + r.Message
	}
	return line
}

// failing returns the condition that explains a driver that is not fine.
func failing(conds []metav1.Condition) *metav1.Condition {
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionError); c != nil && c.Status == metav1.ConditionTrue {
		return c
	}
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		return c
	}
	return nil
}

func upgradeSummary(m map[string]int32) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

// readDriverNames lists NVIDIADriver names (for completion).
func readDriverNames(ctx context.Context, c client.Client) ([]string, error) {
	list := &v1alpha1.NVIDIADriverList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	out := make([]string, len(list.Items))
	for i := range list.Items {
		out[i] = list.Items[i].Name
	}
	return out, nil
}
