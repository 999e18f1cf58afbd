package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// templateGenerationAnnotation is set by the DaemonSet controller on the
// DaemonSet; its pods carry the generation they were made from.
const (
	templateGenerationAnnotation = "deprecated.daemonset.template.generation"
	podTemplateGenerationLabel   = "pod-template-generation"
)

// requeueWhileUpgrading re-checks timeouts while a rollout is in flight.
const requeueWhileUpgrading = 2 * time.Second

// PassWorkers bounds the concurrent API calls of one upgrade pass. A pass
// at maxParallelUpgrades 100 has up to a hundred nodes to act on, and the
// next pass (every node's next step) waits for its last call: with 16 at a
// time the pass was several answer times long (BENCHMARKS.md, "Rollout
// pass width"). The client's rate limit (--kube-api-qps, --kube-api-burst)
// still bounds what reaches the API server.
const PassWorkers = 64

// cacheCatchUp is how soon a pass that found the cache behind our own node
// writes runs again (the watch event is usually milliseconds away).
const cacheCatchUp = 100 * time.Millisecond

// UpgradeReconciler carries one CR's nodes through the upgrade state machine
// (pkg/upgrade), one CR per reconcile, so one CR's stuck node never blocks
// another CR's rollout.
type UpgradeReconciler struct {
	// written: the nodes this machine patched, until the cache has seen
	// our write (ownWrites): a pass on an older copy could hand a node's
	// budget slot out twice, so it waits for the cache instead.
	written ownWrites
	// refusals holds, per node, the API's last refusal of an eviction there
	// (a PodDisruptionBudget): the reason a pod-deletion timeout names.
	refusals sync.Map
	// entered holds, per node, the state this process last moved it into
	// and when (stateEntry), for nvdriver_upgrade_state_seconds.
	entered sync.Map
	// lastListed holds, per node whose driver pod is being replaced, when
	// its pods were last listed (recheckDue).
	lastListed sync.Map
	// latencyClock times the transitions (time.Now when nil; tests set it).
	latencyClock func() time.Time

	Client    client.Client
	APIReader client.Reader // uncached: GPU pods are listed per node only when needed
	// Pods is the clientset kubectl's drain helper chooses and evicts pods with.
	Pods     kubernetes.Interface
	Recorder events.EventRecorder
	Options  Options
	Now      func() time.Time

	pacer *statusPacer
	// reads is the node informer's store (the CR's nodes, uncopied).
	reads *cachedReads
}

// Reconcile implements reconcile.Reconciler.
func (r *UpgradeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	d := &v1alpha1.NVIDIADriver{}
	if err := r.Client.Get(ctx, req.NamespacedName, d); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// A CR being deleted still runs: its nodes leave through the machine
	// (cordon, evict, then the move), and its finalizer waits for them.
	passStart := r.latencyNow()
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	policy := upgrade.PolicyFor(&d.Spec)
	if r.Options.ValidationTimeout > 0 {
		policy.ValidationTimeout = r.Options.ValidationTimeout
	}

	// The nodes this CR's machine carries: its own, less those moving to
	// another CR, plus those moving in (a move counts against the destination).
	// Read only (no copy of every node each pass: at 1,000 nodes that copy
	// was a fifth of the controller's CPU); execute copies the few nodes it
	// patches.
	nodes, err := r.reads.nodesRunBy(d.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(nodes) == 0 {
		return ctrl.Result{}, nil
	}
	// In name order, as the machine decides: it then need not copy and sort
	// them itself, twice per pass.
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	if len(r.written.behind(nodes)) > 0 {
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil
	}
	facts := r.reads.memo.facts(nodes, false)
	pods, podObjs, err := r.driverPods(ctx, d, nodes, facts)
	if err != nil {
		return ctrl.Result{}, err
	}

	ps := r.observe(policy, nodes, facts, pods, podObjs)
	gate, err := r.trackRollout(ctx, d, ps, policy, now)
	if errors.Is(err, errStatusConflict) {
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	res, err := r.carryOut(ctx, d, ps, policy, now, passStart)
	if !gate.WakeAt.IsZero() {
		// A bake time ends: nothing else would wake the rollout then.
		after := max(gate.WakeAt.Sub(now), time.Second)
		if res.RequeueAfter == 0 || after < res.RequeueAfter {
			res.RequeueAfter = after
		}
	}
	return res, err
}

// pass is what one pass of the machine observed: its inputs per node and
// the nodes and driver pods by node name. The pods on a node are not in it:
// those are listed by the node's own step (carryOut).
type pass struct {
	inputs  []upgrade.Node
	nodes   []*corev1.Node // nodes[i] is inputs[i]'s
	index   map[string]int // by name, made on first need (at)
	podObjs map[string]*driverPod
	// listPods[i]: node i's decision reads the pods on it (needsPods).
	listPods []bool
}

// at is the position of the named node in inputs and nodes; the index is
// made on the first call, which most passes (deciding nothing) never make.
func (ps *pass) at(name string) int {
	if ps.index == nil {
		ps.index = make(map[string]int, len(ps.inputs))
		for i := range ps.inputs {
			ps.index[ps.inputs[i].Name] = i
		}
	}
	return ps.index[name]
}

// observe builds the machine's inputs from the caches: each node's state
// and driver pod, and which nodes need their pods listed.
func (r *UpgradeReconciler) observe(policy upgrade.Policy, nodes []*corev1.Node, facts []*nodeFact, pods map[string]*upgrade.DriverPod, podObjs map[string]*driverPod) *pass {
	ps := &pass{inputs: make([]upgrade.Node, len(nodes)), nodes: nodes, podObjs: podObjs, listPods: make([]bool, len(nodes))}
	for i, n := range nodes {
		in := upgrade.Node{
			Name: n.Name, State: facts[i].state, Skip: facts[i].skip,
			Unschedulable: n.Spec.Unschedulable, NotReady: !facts[i].ready, Annotations: n.Annotations, DriverPod: pods[n.Name],
			Labels: n.Labels,
		}
		if po := podObjs[n.Name]; po != nil {
			if ref := metav1.GetControllerOfNoCopy(po); ref != nil {
				in.Pool = ref.Name
			}
		}
		ps.inputs[i] = in
		ps.listPods[i] = !in.Skip && r.needsPods(in, policy)
	}
	return ps
}

// needsPods: the pods on a node are listed (uncached, per node) only where
// the decision reads them: each LIST costs a round trip against the
// client's rate limit, and a rollout at maxParallelUpgrades 100 has a
// hundred nodes in these states at once.
func (r *UpgradeReconciler) needsPods(in upgrade.Node, policy upgrade.Policy) bool {
	switch in.State {
	case upgrade.StateValidation:
		return r.Options.ValidationPodSelector != ""
	case upgrade.StateWaitForJobs:
		return policy.WaitForJobsSelector != ""
	case upgrade.StatePodDeletion, upgrade.StateDrain:
		return true
	case upgrade.StatePodRestart:
		// Once the new driver pod runs, a GPU pod arriving changes nothing;
		// on the restart-only path GPU pods stay by design.
		if in.Annotations[upgrade.AnnotationRestartOnly] == "true" {
			return false
		}
		if in.DriverPod != nil && in.DriverPod.InSync {
			return false
		}
		if in.DriverPod != nil && !in.DriverPod.Deleting {
			return true // the pass may delete the driver pod: look now
		}
		// The old pod is going or gone and the DaemonSet controller makes
		// the new one, which takes seconds: a GPU pod binding meanwhile is
		// looked for once per restartRecheck, not on every pass. At
		// maxParallelUpgrades 100 most of a rollout's pod LISTs were these.
		return r.recheckDue(in.Name)
	}
	return false
}

// restartRecheck is how often the pods on a node whose driver pod is being
// replaced are listed again (needsPods).
const restartRecheck = 5 * time.Second

// recheckDue says whether the node's pods were last listed, while its
// driver pod is replaced, restartRecheck ago or more (or never), and if so
// counts this pass as the listing.
func (r *UpgradeReconciler) recheckDue(node string) bool {
	now := time.Now()
	if v, ok := r.lastListed.Load(node); ok && now.Sub(v.(time.Time)) < restartRecheck {
		return false
	}
	r.lastListed.Store(node, now)
	return true
}

// carryOut decides and carries out the pass, each node's decision
// concurrently; it asks to run again while any node is in the machine.
//
// A node whose decision reads the pods on it is decided by its own step,
// once they are listed (upgrade.Step: its decision depends on it alone),
// and the others at once: no node waits for another node's listing
// (docs/design.md, "One node's step"). The budget's entries are Decide's,
// and read no pods.
func (r *UpgradeReconciler) carryOut(ctx context.Context, d *v1alpha1.NVIDIADriver, ps *pass, policy upgrade.Policy, now, passStart time.Time) (ctrl.Result, error) {
	busy := false
	var (
		mu       sync.Mutex
		firstErr error
		exec     errgroup.Group
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	exec.SetLimit(PassWorkers)
	// carry runs in the pass's goroutines: it takes the node's position,
	// read from the index before they start, and the step's clock.
	carry := func(st *stepClock, i int, dec upgrade.Decision, pods *stepPods) {
		node := ps.nodes[i]
		if err := r.execute(st.ctx, d, node.DeepCopy(), ps.podObjs[dec.Node], pods, dec); err != nil {
			log.FromContext(ctx).Error(err, "upgrade step", "node", dec.Node, "from", dec.From, "to", dec.To)
			fail(err)
			return
		}
		st.observe(dec.To, passStart)
	}
	// A node the rollout holds waits for an event (a resume, a spec
	// change, a node finishing), not for a timer: a paused rollout costs
	// nothing while it waits.
	keepsBusy := func(dec upgrade.Decision, i int) {
		if upgrade.InProgress(dec.To) || (dec.To == upgrade.StateRequired && ps.inputs[i].Held == "") {
			mu.Lock()
			busy = true
			mu.Unlock()
		}
	}
	var listing []int
	decs := upgrade.Decide(ps.inputs, policy, now)
	// Every step waits for a worker from here: the loops below hand them
	// out in turn, and block while all workers are busy.
	decided := r.latencyNow()
	goStep := func(step func(st *stepClock)) {
		st := r.newStepClock(ctx, decided)
		exec.Go(func() error {
			defer excludeFromCost(ctx)()
			st.start()
			step(st)
			return nil
		})
	}
	for _, dec := range decs {
		i := ps.at(dec.Node)
		if ps.listPods[i] {
			listing = append(listing, i) // decided below, with its pods
			continue
		}
		keepsBusy(dec, i)
		if !dec.Changed() {
			continue
		}
		// Each decision touches its own node only: carried out concurrently.
		goStep(func(st *stepClock) { carry(st, i, dec, nil) })
	}
	for _, i := range listing {
		goStep(func(st *stepClock) {
			in := ps.inputs[i] // a copy: the listing fills it
			pods, err := r.observePods(st.ctx, &in, policy)
			if err != nil {
				// Not decided: it runs again soon (an error requeues).
				fail(fmt.Errorf("pods on %s: %w", in.Name, err))
				return
			}
			dec := upgrade.Step(in, policy, now)
			keepsBusy(dec, i)
			if dec.Changed() {
				carry(st, i, dec, pods)
			}
		})
	}
	_ = exec.Wait()
	if busy {
		return ctrl.Result{RequeueAfter: requeueWhileUpgrading}, firstErr
	}
	return ctrl.Result{}, firstErr
}

// execute carries out one decision: actions first, then the state label and
// annotations in one patch (so the state never runs ahead of what was done),
// then the Events.
func (r *UpgradeReconciler) execute(ctx context.Context, d *v1alpha1.NVIDIADriver, node *corev1.Node, dpod *driverPod, pods *stepPods, dec upgrade.Decision) error {
	// Patches update node in place with the server's answer: a new
	// resourceVersion means we wrote it.
	pre := node.ResourceVersion
	defer func() {
		r.written.wrote(node.Name, pre, node.ResourceVersion)
	}()
	done, unsched, err := r.runActions(ctx, node, dpod, pods, dec)
	if err != nil || !done {
		return err
	}
	moved, err := r.writeState(ctx, node, dec, unsched)
	if err != nil {
		return err
	}
	r.transitioned(node.Name, dec)
	r.recordEvents(d, node, dec, moved)
	return nil
}

// runActions does the decision's actions; done is false when the decision
// must wait for the next pass (a GPU pod arrived before the driver restart).
// A cordon or uncordon that no later action waits for is not done here but
// returned (unsched), for writeState to set with the state in one patch
// (docs/design.md, "Cordon with the state").
func (r *UpgradeReconciler) runActions(ctx context.Context, node *corev1.Node, dpod *driverPod, pods *stepPods, dec upgrade.Decision) (done bool, unsched *bool, err error) {
	for i, a := range dec.Actions {
		var err error
		switch a {
		case upgrade.ActCordon, upgrade.ActUncordon:
			v := a == upgrade.ActCordon
			if node.Spec.Unschedulable == v {
				break
			}
			if onlyTheMove(dec.Actions[i+1:]) {
				unsched = &v
				break
			}
			err = r.setUnschedulable(ctx, node, v)
		case upgrade.ActEvictGPUPods, upgrade.ActDrain:
			// The machine decides to evict only after this pass's helper
			// found every target removable (its Refused was empty).
			if pods != nil {
				err = r.evictPods(ctx, node.Name, pods.evictable)
			}
		case upgrade.ActMove:
			// Done in the metadata patch below, with the state, so the owner label
			// and the machine's state change together.
		case upgrade.ActDeleteDriverPod:
			// Last look before the driver goes: no GPU pod may have arrived since
			// the decision (the node is cordoned, but a bind can race the
			// cordon). A restart-only change keeps its GPU pods by design.
			// The step's own listing is that look when it has one: it was
			// answered just before this call, with nothing waited for in
			// between (docs/design.md, "One node's step"), and the decision
			// to delete read it.
			if !dec.RestartOnly {
				var onNode []corev1.Pod
				if pods != nil {
					onNode = pods.onNode
				} else {
					var lerr error
					if onNode, lerr = r.podsOnNode(ctx, node.Name); lerr != nil {
						return false, nil, lerr
					}
				}
				if len(gpuPods(onNode)) > 0 {
					return false, nil, nil // the next pass sends the node back to pod-deletion-required
				}
			}
			// The machine only asks for this when the pod is out of sync.
			if dpod != nil && dpod.DeletionTimestamp == nil {
				if err = r.Client.Delete(ctx, dpod.podRef(), client.Preconditions{UID: &dpod.UID}); apierrors.IsNotFound(err) {
					err = nil
				}
			}
		}
		if err != nil {
			return false, nil, fmt.Errorf("%s on %s: %w", a, node.Name, err)
		}
	}
	return true, unsched, nil
}

// onlyTheMove says whether the actions after a cordon or uncordon are at
// most the move, which the state's patch carries too: no call in between
// needs the node cordoned (or uncordoned) first.
func onlyTheMove(rest []upgrade.Action) bool {
	for _, a := range rest {
		if a != upgrade.ActMove {
			return false
		}
	}
	return true
}

// stateEntry is a state a node was moved into, and when.
type stateEntry struct {
	state string
	at    time.Time
}

// transitioned keeps the per-node memory of a written transition: it
// observes how long the node stayed in the state it leaves (when this
// process moved it there) and remembers the one it enters, and a node that
// leaves pod-restart-required forgets when its pods were last listed there
// (recheckDue).
func (r *UpgradeReconciler) transitioned(node string, dec upgrade.Decision) {
	if dec.From == dec.To {
		return
	}
	if dec.From == upgrade.StatePodRestart {
		r.lastListed.Delete(node)
	}
	now := time.Now()
	if v, ok := r.entered.Load(node); ok {
		if e := v.(stateEntry); e.state == dec.From {
			upgradeStateTime.WithLabelValues(dec.From).Observe(now.Sub(e.at).Seconds())
		}
	}
	if dec.To == upgrade.StateRequired || upgrade.InProgress(dec.To) {
		r.entered.Store(node, stateEntry{state: dec.To, at: now})
	} else {
		r.entered.Delete(node) // at rest: nothing more to time
	}
}

// writeState patches the state label, the owner label of a move, the
// machine's annotations and the cordon runActions left to it (unsched, nil:
// none) in one merge patch; it returns where a moved node went.
func (r *UpgradeReconciler) writeState(ctx context.Context, node *corev1.Node, dec upgrade.Decision, unsched *bool) (moved string, err error) {
	meta := map[string]any{}
	labels := map[string]any{}
	if dec.From != dec.To {
		if dec.To == upgrade.StateUnknown {
			labels[upgrade.LabelState] = nil
		} else {
			labels[upgrade.LabelState] = dec.To
		}
	}
	for _, a := range dec.Actions {
		if a != upgrade.ActMove {
			continue
		}
		moved = node.Annotations[upgrade.AnnotationMoveTo]
		if moved == upgrade.MoveRelease {
			labels[plan.LabelOwner] = nil
		} else {
			labels[plan.LabelOwner] = moved
		}
		dec.Annotate(upgrade.AnnotationMoveTo, "")
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	if len(dec.Annotations) > 0 {
		ann := map[string]any{}
		for k, v := range dec.Annotations {
			if v == "" {
				if _, ok := node.Annotations[k]; !ok {
					continue
				}
				ann[k] = nil
			} else {
				ann[k] = v
			}
		}
		if len(ann) > 0 {
			meta["annotations"] = ann
		}
	}
	patch := map[string]any{}
	if len(meta) > 0 {
		patch["metadata"] = meta
	}
	if unsched != nil {
		patch["spec"] = map[string]any{"unschedulable": *unsched}
	}
	if len(patch) > 0 {
		body, _ := json.Marshal(patch)
		if err := r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager)); err != nil {
			return "", fmt.Errorf("setting upgrade state of %s: %w", node.Name, err)
		}
	}
	return moved, nil
}

func (r *UpgradeReconciler) recordEvents(d *v1alpha1.NVIDIADriver, node *corev1.Node, dec upgrade.Decision, moved string) {
	if moved != "" {
		to := moved
		if to == upgrade.MoveRelease {
			to = "no driver"
		}
		r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, upgrade.EventReason, "Move", "node %s: cordoned and emptied of GPU pods, handed to %s", node.Name, to)
	}
	// A node's first upgrade-done (its first driver pod, in sync) is no news:
	// one Event per new node was a seventh of the requests of a fleet coming up.
	if dec.From != dec.To && !(dec.From == upgrade.StateUnknown && dec.To == upgrade.StateDone) {
		if dec.To == upgrade.StateFailed {
			r.Recorder.Eventf(d, nil, corev1.EventTypeWarning, upgrade.EventReason, "Upgrade", "node %s: upgrade failed: %s", node.Name, dec.Reason)
		} else {
			r.Recorder.Eventf(d, nil, corev1.EventTypeNormal, upgrade.EventReason, "Upgrade", "node %s: %s -> %s", node.Name, stateName(dec.From), dec.To)
		}
	}
}

func stateName(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func (r *UpgradeReconciler) setUnschedulable(ctx context.Context, node *corev1.Node, v bool) error {
	if node.Spec.Unschedulable == v {
		return nil
	}
	body := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, v))
	return r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager))
}
