package upgrade

import (
	"maps"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) string { return strconv.FormatInt(now.Add(-d).Unix(), 10) }

func defaults() Policy { return PolicyFor(&v1alpha1.NVIDIADriverSpec{}) }

var (
	stale   = &DriverPod{Name: "old", InSync: false, Ready: true}
	fresh   = &DriverPod{Name: "new", InSync: true, Ready: true}
	booting = &DriverPod{Name: "new", InSync: true, Ready: false}
	looping = &DriverPod{Name: "new", InSync: true, Ready: false, Restarts: 11}
	// sameDigest: out of date, but only in what does not touch the install.
	sameDigest = &DriverPod{Name: "old", InSync: false, Ready: true, RestartOnly: true}
)

// TestNext covers every state under every condition that moves it.
func TestNext(t *testing.T) {
	withSelector := defaults()
	withSelector.WaitForJobsSelector = "app=train"
	withSelector.WaitForJobsTimeout = time.Hour
	noAuto := defaults()
	noAuto.AutoUpgrade = false
	drain := defaults()
	drain.DrainEnabled = true

	cases := []struct {
		name    string
		node    Node
		policy  Policy
		to      string
		actions []Action
		ann     map[string]string
		failed  bool
	}{
		{"unknown, pod in sync -> done", Node{DriverPod: fresh}, defaults(), StateDone, nil, nil, false},
		{"unknown, pod stale -> required", Node{DriverPod: stale}, defaults(), StateRequired, nil, nil, false},
		{"unknown, no pod -> stays", Node{}, defaults(), StateUnknown, nil, nil, false},
		{"done, pod stale -> required", Node{State: StateDone, DriverPod: stale}, defaults(), StateRequired, nil, nil, false},
		{"done, in sync -> stays", Node{State: StateDone, DriverPod: fresh}, defaults(), StateDone, nil, nil, false},
		{"done, stale, cordoned before -> required, remembered", Node{State: StateDone, DriverPod: stale, Unschedulable: true}, defaults(), StateRequired, nil, map[string]string{AnnotationInitialUnsched: "true"}, false},
		{"autoUpgrade off: stale alone does nothing", Node{State: StateDone, DriverPod: stale}, noAuto, StateDone, nil, nil, false},
		{"autoUpgrade off: requested -> required", Node{State: StateDone, DriverPod: stale, Annotations: map[string]string{AnnotationRequested: "true"}}, noAuto, StateRequired, nil, nil, false},
		{"requested even in sync -> required", Node{State: StateDone, DriverPod: fresh, Annotations: map[string]string{AnnotationRequested: "true"}}, defaults(), StateRequired, nil, nil, false},
		{"cordon -> wait-for-jobs, cordoning", Node{State: StateCordon}, defaults(), StateWaitForJobs, []Action{ActCordon}, nil, false},
		{"cordon with a job selector stamps the wait", Node{State: StateCordon}, withSelector, StateWaitForJobs, []Action{ActCordon}, map[string]string{AnnotationWaitStart: strconv.FormatInt(now.Unix(), 10)}, false},
		{"wait, no selector -> pod-deletion", Node{State: StateWaitForJobs, Unschedulable: true}, defaults(), StatePodDeletion, nil, map[string]string{AnnotationWaitStart: ""}, false},
		{"wait, jobs running -> stays", Node{State: StateWaitForJobs, Unschedulable: true, JobPods: 2, Annotations: map[string]string{AnnotationWaitStart: ago(time.Minute)}}, withSelector, StateWaitForJobs, nil, nil, false},
		{"wait, jobs done -> pod-deletion", Node{State: StateWaitForJobs, Unschedulable: true, Annotations: map[string]string{AnnotationWaitStart: ago(time.Minute)}}, withSelector, StatePodDeletion, nil, map[string]string{AnnotationWaitStart: ""}, false},
		{"wait, timeout -> pod-deletion", Node{State: StateWaitForJobs, Unschedulable: true, JobPods: 1, Annotations: map[string]string{AnnotationWaitStart: ago(2 * time.Hour)}}, withSelector, StatePodDeletion, nil, map[string]string{AnnotationWaitStart: ""}, false},
		{"wait, uncordoned by someone -> re-cordon", Node{State: StateWaitForJobs, JobPods: 1, Annotations: map[string]string{AnnotationWaitStart: ago(time.Minute)}}, withSelector, StateWaitForJobs, []Action{ActCordon}, nil, false},
		{"pod-deletion, GPU pods -> evict, stamp", Node{State: StatePodDeletion, GPUPods: 2}, defaults(), StatePodDeletion, []Action{ActEvictGPUPods}, map[string]string{AnnotationDeletionStart: strconv.FormatInt(now.Unix(), 10)}, false},
		{"pod-deletion, no GPU pods -> pod-restart", Node{State: StatePodDeletion, Annotations: map[string]string{AnnotationDeletionStart: ago(time.Minute)}}, defaults(), StatePodRestart, nil, map[string]string{AnnotationDeletionStart: ""}, false},
		{"pod-deletion timeout, no drain -> failed", Node{State: StatePodDeletion, GPUPods: 1, Annotations: map[string]string{AnnotationDeletionStart: ago(10 * time.Minute)}}, defaults(), StateFailed, nil, map[string]string{AnnotationDeletionStart: ""}, true},
		{"pod-deletion timeout, drain -> drain", Node{State: StatePodDeletion, GPUPods: 1, Annotations: map[string]string{AnnotationDeletionStart: ago(10 * time.Minute)}}, drain, StateDrain, nil, map[string]string{AnnotationDeletionStart: ""}, false},
		{"drain, pods left -> drain action", Node{State: StateDrain, GPUPods: 1, Annotations: map[string]string{AnnotationDeletionStart: ago(time.Second)}}, drain, StateDrain, []Action{ActDrain}, nil, false},
		{"drain, empty -> pod-restart", Node{State: StateDrain}, drain, StatePodRestart, nil, map[string]string{AnnotationDeletionStart: ""}, false},
		{"pod-deletion, a pod the policy keeps, no drain -> failed, nothing evicted", Node{State: StatePodDeletion, Unschedulable: true, GPUPods: 2, Refused: []string{"default/job (emptyDir)"}}, defaults(), StateFailed, nil, nil, true},
		{"pod-deletion, a pod the policy keeps, drain on -> drain", Node{State: StatePodDeletion, GPUPods: 1, Refused: []string{"default/job (no controller)"}, Annotations: map[string]string{AnnotationDeletionStart: ago(time.Second)}}, drain, StateDrain, nil, map[string]string{AnnotationDeletionStart: ""}, false},
		{"drain, a pod the policy keeps -> failed, nothing evicted", Node{State: StateDrain, GPUPods: 1, Refused: []string{"default/job (emptyDir)"}}, drain, StateFailed, nil, nil, true},
		{"drain timeout -> failed", Node{State: StateDrain, GPUPods: 1, Annotations: map[string]string{AnnotationDeletionStart: ago(time.Hour)}}, drain, StateFailed, nil, map[string]string{AnnotationDeletionStart: ""}, true},
		{"pod-restart, a GPU pod arrived -> back to pod-deletion", Node{State: StatePodRestart, DriverPod: stale, GPUPods: 1}, defaults(), StatePodDeletion, nil, nil, false},
		{"pod-restart, stale pod -> delete it", Node{State: StatePodRestart, DriverPod: stale}, defaults(), StatePodRestart, []Action{ActDeleteDriverPod}, nil, false},
		{"pod-restart, stale pod terminating -> wait", Node{State: StatePodRestart, DriverPod: &DriverPod{InSync: false, Deleting: true}}, defaults(), StatePodRestart, nil, nil, false},
		{"pod-restart, no pod yet -> wait", Node{State: StatePodRestart}, defaults(), StatePodRestart, nil, nil, false},
		{"pod-restart, new pod booting -> wait, clock starts", Node{State: StatePodRestart, DriverPod: booting}, defaults(), StatePodRestart, nil, map[string]string{AnnotationValidationStart: strconv.FormatInt(now.Unix(), 10)}, false},
		{"pod-restart, new pod booting within the timeout -> wait", Node{State: StatePodRestart, DriverPod: booting, Annotations: map[string]string{AnnotationValidationStart: ago(time.Minute)}}, defaults(), StatePodRestart, nil, nil, false},
		{"pod-restart, new pod never Ready -> failed", Node{State: StatePodRestart, DriverPod: booting, Annotations: map[string]string{AnnotationValidationStart: ago(11 * time.Minute)}}, defaults(), StateFailed, nil, map[string]string{AnnotationValidationStart: ""}, true},
		{"pod-restart, new pod ready -> validation", Node{State: StatePodRestart, DriverPod: fresh}, defaults(), StateValidation, nil, map[string]string{AnnotationValidationStart: strconv.FormatInt(now.Unix(), 10)}, false},
		{"pod-restart, crash looping -> failed", Node{State: StatePodRestart, DriverPod: looping}, defaults(), StateFailed, nil, map[string]string{AnnotationValidationStart: ""}, true},
		{"validation, ready -> uncordon", Node{State: StateValidation, DriverPod: fresh, Annotations: map[string]string{AnnotationValidationStart: ago(time.Second)}}, defaults(), StateUncordon, nil, map[string]string{AnnotationValidationStart: ""}, false},
		{"validation, ready, cordoned before -> done", Node{State: StateValidation, DriverPod: fresh, Annotations: map[string]string{AnnotationValidationStart: ago(time.Second), AnnotationInitialUnsched: "true"}}, defaults(), StateDone, nil, map[string]string{AnnotationValidationStart: "", AnnotationInitialUnsched: ""}, false},
		{"validation, not ready -> wait", Node{State: StateValidation, DriverPod: booting, Annotations: map[string]string{AnnotationValidationStart: ago(time.Minute)}}, defaults(), StateValidation, nil, nil, false},
		{"validation timeout -> failed", Node{State: StateValidation, DriverPod: booting, Annotations: map[string]string{AnnotationValidationStart: ago(11 * time.Minute)}}, defaults(), StateFailed, nil, map[string]string{AnnotationValidationStart: ""}, true},
		{"validation, driver ready, validator pending -> wait", Node{State: StateValidation, DriverPod: fresh, ValidatorsPending: true, Annotations: map[string]string{AnnotationValidationStart: ago(time.Minute)}}, defaults(), StateValidation, nil, nil, false},
		{"validation, validator pending past timeout -> failed", Node{State: StateValidation, DriverPod: fresh, ValidatorsPending: true, Annotations: map[string]string{AnnotationValidationStart: ago(11 * time.Minute)}}, defaults(), StateFailed, nil, map[string]string{AnnotationValidationStart: ""}, true},
		{"uncordon -> done", Node{State: StateUncordon, Unschedulable: true}, defaults(), StateDone, []Action{ActUncordon}, nil, false},
		{"failed, pod fixed -> uncordon", Node{State: StateFailed, DriverPod: fresh, Unschedulable: true}, defaults(), StateUncordon, nil, nil, false},
		{"failed, pod still bad -> stays", Node{State: StateFailed, DriverPod: booting, Unschedulable: true}, defaults(), StateFailed, nil, nil, false},
		{"move requested -> required", Node{State: StateDone, DriverPod: fresh, Annotations: map[string]string{AnnotationMoveTo: "gold"}}, noAuto, StateRequired, nil, nil, false},
		{"move with no driver pod -> move at once", Node{State: StateDone, Annotations: map[string]string{AnnotationMoveTo: "gold"}}, defaults(), StateDone, []Action{ActMove}, nil, false},
		{"move at pod-restart, emptied -> move", Node{State: StatePodRestart, DriverPod: fresh, Annotations: map[string]string{AnnotationMoveTo: "gold"}}, defaults(), StatePodRestart, []Action{ActMove}, nil, false},
		{"move at pod-restart, GPU pod back -> pod-deletion", Node{State: StatePodRestart, DriverPod: fresh, GPUPods: 1, Annotations: map[string]string{AnnotationMoveTo: "gold"}}, defaults(), StatePodDeletion, nil, nil, false},
		{"skip label -> untouched", Node{State: StateDone, DriverPod: stale, Skip: true}, defaults(), StateDone, nil, nil, false},
		{"unknown foreign state -> restart", Node{State: "node-maintenance-required"}, defaults(), StateUnknown, nil, nil, false},
		{"a failed node an admin set back to upgrade-required loses its failure reason", Node{State: StateRequired, DriverPod: stale,
			Annotations: map[string]string{AnnotationFailure: "old reason"}}, defaults(), StateCordon, nil, map[string]string{AnnotationFailure: ""}, false},
		{"a failed node is retried once the spec changed (undo, a fixed version)", Node{State: StateFailed, DriverPod: stale, Unschedulable: true,
			Annotations: map[string]string{AnnotationFailure: "old reason", AnnotationFailedRevision: "older"}}, defaults(), StateRequired, nil,
			map[string]string{AnnotationFailure: "", AnnotationFailedRevision: ""}, false},
		{"a node failed on this revision is not retried", Node{State: StateFailed, DriverPod: stale, Unschedulable: true,
			Annotations: map[string]string{AnnotationFailure: "reason", AnnotationFailedRevision: defaults().Revision}}, defaults(), StateFailed, nil, nil, false},
		{"required, but the spec came back to what the node runs -> done", Node{State: StateRequired, DriverPod: fresh,
			Annotations: map[string]string{AnnotationInitialUnsched: "true"}}, defaults(), StateDone, nil, map[string]string{AnnotationInitialUnsched: ""}, false},
		{"same config digest: straight to pod-restart, no cordon", Node{State: StateRequired, DriverPod: sameDigest}, defaults(), StatePodRestart, nil,
			map[string]string{AnnotationRestartOnly: "true"}, false},
		{"same digest but requested by an admin: the whole machine", Node{State: StateRequired, DriverPod: sameDigest,
			Annotations: map[string]string{AnnotationRequested: "true"}}, defaults(), StateCordon, nil, map[string]string{AnnotationRequested: ""}, false},
		{"same digest but moving: the whole machine", Node{State: StateRequired, DriverPod: sameDigest,
			Annotations: map[string]string{AnnotationMoveTo: "gold"}}, defaults(), StateCordon, nil, nil, false},
		{"restart-only, GPU pods running: the driver pod is replaced anyway", Node{State: StatePodRestart, DriverPod: sameDigest, GPUPods: 3,
			Annotations: map[string]string{AnnotationRestartOnly: "true"}}, defaults(), StatePodRestart, []Action{ActDeleteDriverPod}, nil, false},
		{"restart-only, old pod gone, GPU pods running: wait for the new one", Node{State: StatePodRestart, GPUPods: 3,
			Annotations: map[string]string{AnnotationRestartOnly: "true"}}, defaults(), StatePodRestart, nil, nil, false},
		{"restart-only, and the spec became an install change: the whole machine", Node{State: StatePodRestart, DriverPod: stale,
			Annotations: map[string]string{AnnotationRestartOnly: "true"}}, defaults(), StateCordon, nil, map[string]string{AnnotationRestartOnly: ""}, false},
		{"restart-only, validated: done, never uncordoned (never cordoned)", Node{State: StateValidation, DriverPod: fresh,
			Annotations: map[string]string{AnnotationRestartOnly: "true", AnnotationValidationStart: ago(time.Second)}}, defaults(), StateDone, nil,
			map[string]string{AnnotationRestartOnly: "", AnnotationValidationStart: ""}, false},
		{"a node held by the rollout does not start", Node{State: StateRequired, DriverPod: stale, Held: "rollout paused"}, defaults(), StateRequired, nil, nil, false},
		{"a cordoned node held by the rollout does not start either", Node{State: StateRequired, DriverPod: stale, Unschedulable: true, Held: "waiting for the canary"}, defaults(), StateRequired, nil, nil, false},
		{"a failed node keeps its reason", Node{State: StateFailed, DriverPod: stale, Unschedulable: true,
			Annotations: map[string]string{AnnotationFailure: "old reason"}}, defaults(), StateFailed, nil, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.node.Name = "n"
			if tc.node.Annotations == nil {
				tc.node.Annotations = map[string]string{}
			}
			ds := Decide([]Node{tc.node}, tc.policy, now)
			d := ds[0]
			if tc.node.State != StateRequired {
				// Decided alone, as the controller decides a node once the
				// pods on it are listed: the same decision.
				if s := Step(tc.node, tc.policy, now); !reflect.DeepEqual(s, d) {
					t.Errorf("Step %+v, Decide %+v", s, d)
				}
			}
			if d.To != tc.to {
				t.Errorf("to %q, want %q", d.To, tc.to)
			}
			if !reflect.DeepEqual(d.Actions, tc.actions) {
				t.Errorf("actions %v, want %v", d.Actions, tc.actions)
			}
			want := maps.Clone(tc.ann)
			if want == nil {
				want = map[string]string{}
			}
			if d.From != d.To {
				want[AnnotationStateSince] = strconv.FormatInt(now.Unix(), 10)
				if d.To == StateUnknown {
					want[AnnotationStateSince] = ""
				}
			}
			if tc.failed {
				// The reason stays on the node until it leaves upgrade-failed.
				want[AnnotationFailure] = d.Reason
				want[AnnotationFailedRevision] = tc.policy.Revision
			}
			if !maps.Equal(d.Annotations, want) {
				t.Errorf("annotations %v, want %v", d.Annotations, want)
			}
			if tc.failed != (d.Reason != "") {
				t.Errorf("reason %q, failed want %v", d.Reason, tc.failed)
			}
		})
	}
}

func required(name string) Node {
	return Node{Name: name, State: StateRequired, DriverPod: stale, Annotations: map[string]string{}}
}

// TestBudget: how many upgrade-required nodes may enter the machine at once.
func TestBudget(t *testing.T) {
	pol := func(parallel int, unavail intstr.IntOrString) Policy {
		p := defaults()
		p.MaxParallelUpgrades, p.MaxUnavailable = parallel, unavail
		return p
	}
	busy := func(name string) Node {
		return Node{Name: name, State: StatePodRestart, Annotations: map[string]string{}}
	}
	cordoned := func(name string) Node { n := required(name); n.Unschedulable = true; return n }
	notReady := func(name string) Node {
		return Node{Name: name, State: StateDone, NotReady: true, DriverPod: fresh, Annotations: map[string]string{}}
	}
	many := func(n int) []Node {
		var out []Node
		for i := 0; i < n; i++ {
			out = append(out, required("n"+strconv.Itoa(100+i)))
		}
		return out
	}
	cases := []struct {
		name   string
		nodes  []Node
		policy Policy
		enter  int
	}{
		{"defaults: one at a time", many(10), defaults(), 1},
		{"parallel 3, 25% of 10 rounds up to 3", many(10), pol(3, intstr.FromString("25%")), 3},
		{"parallel 5, 25% of 10 = 3 caps it", many(10), pol(5, intstr.FromString("25%")), 3},
		{"parallel 0 = unlimited, 100%", many(10), pol(0, intstr.FromString("100%")), 10},
		{"1% of 10 rounds up to 1", many(10), pol(0, intstr.FromString("1%")), 1},
		{"0% still allows 1", many(10), pol(0, intstr.FromString("0%")), 1},
		{"absolute maxUnavailable 4", many(10), pol(0, intstr.FromInt32(4)), 4},
		{"one busy takes the only slot", append(many(5), busy("a-busy")), pol(1, intstr.FromString("100%")), 0},
		{"busy node counts against parallel", append(many(5), busy("a-busy")), pol(3, intstr.FromString("100%")), 2},
		{"a NotReady node counts as unavailable", append(many(3), notReady("a-down")), pol(0, intstr.FromInt32(2)), 1},
		{"already cordoned nodes enter without a slot", []Node{cordoned("c1"), cordoned("c2"), required("r1"), required("r2")}, pol(1, intstr.FromString("100%")), 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			entered := 0
			for _, d := range Decide(tc.nodes, tc.policy, now) {
				if d.From == StateRequired && d.To == StateCordon {
					entered++
				}
			}
			if entered != tc.enter {
				t.Errorf("%d node(s) entered, want %d", entered, tc.enter)
			}
		})
	}
}

func TestMaxUnavailableNodes(t *testing.T) {
	cases := []struct {
		v     intstr.IntOrString
		total int
		want  int
	}{
		{intstr.FromString("25%"), 10, 3}, {intstr.FromString("25%"), 4, 1}, {intstr.FromString("25%"), 5, 2},
		{intstr.FromString("100%"), 7, 7}, {intstr.FromString("0%"), 7, 1}, {intstr.FromInt32(0), 7, 1},
		{intstr.FromInt32(3), 7, 3}, {intstr.FromString("33%"), 1000, 330}, {intstr.FromString("10%"), 1001, 101},
	}
	for _, tc := range cases {
		if got := MaxUnavailableNodes(tc.v, tc.total); got != tc.want {
			t.Errorf("MaxUnavailableNodes(%s, %d) = %d, want %d", tc.v.String(), tc.total, got, tc.want)
		}
	}
}

func TestPolicyFor(t *testing.T) {
	p := PolicyFor(&v1alpha1.NVIDIADriverSpec{UpgradePolicy: &v1alpha1.DriverUpgradePolicySpec{
		AutoUpgrade: false, MaxParallelUpgrades: 4, MaxUnavailable: ptr.To(intstr.FromString("50%")),
		PodDeletion: &v1alpha1.PodDeletionSpec{TimeoutSecond: 30, Force: true}, DrainSpec: &v1alpha1.DrainSpec{Enable: true, TimeoutSecond: 60, DeleteEmptyDir: true, PodSelector: "team=ml"},
		WaitForCompletion: &v1alpha1.WaitForCompletionSpec{PodSelector: "a=b", TimeoutSecond: 5}}})
	if p.AutoUpgrade || p.MaxParallelUpgrades != 4 || p.MaxUnavailable.StrVal != "50%" || p.PodDeletionTimeout != 30*time.Second ||
		!p.DrainEnabled || p.DrainTimeout != time.Minute || p.WaitForJobsSelector != "a=b" || p.WaitForJobsTimeout != 5*time.Second {
		t.Errorf("policy = %+v", p)
	}
	if p.PodDeletion != (Removal{Force: true}) || p.Drain != (Removal{DeleteEmptyDir: true, PodSelector: "team=ml"}) {
		t.Errorf("removal rules dropped: pod deletion %+v, drain %+v", p.PodDeletion, p.Drain)
	}
	d := defaults()
	if !d.AutoUpgrade || d.MaxParallelUpgrades != 1 || d.MaxUnavailable.StrVal != "25%" {
		t.Errorf("defaults = %+v", d)
	}
}

// A full rollout driven by Decide alone ends with every node done, never more
// than the budget in progress, and no node restarted before it was emptied.
func TestRolloutSimulation(t *testing.T) {
	p := defaults()
	p.MaxParallelUpgrades = 2
	p.MaxUnavailable = intstr.FromString("100%")
	nodes := map[string]*Node{}
	for i := 0; i < 7; i++ {
		name := "n" + strconv.Itoa(i)
		nodes[name] = &Node{Name: name, State: StateDone, DriverPod: &DriverPod{Name: name, InSync: false, Ready: true}, GPUPods: 1, Annotations: map[string]string{}}
	}
	nodes["n3"].Unschedulable = true // cordoned by the admin beforehand
	clock := now
	for round := 0; round < 100; round++ {
		var list []Node
		for _, n := range nodes {
			list = append(list, *n)
		}
		inFlight := 0
		for _, n := range list {
			if InProgress(n.State) && n.Name != "n3" {
				inFlight++
			}
		}
		if inFlight > 2 {
			t.Fatalf("round %d: %d nodes in progress, budget 2", round, inFlight)
		}
		for _, d := range Decide(list, p, clock) {
			n := nodes[d.Node]
			for _, a := range d.Actions {
				switch a {
				case ActCordon:
					n.Unschedulable = true
				case ActUncordon:
					n.Unschedulable = false
				case ActEvictGPUPods:
					if !n.Unschedulable {
						t.Fatalf("%s: evicting on a schedulable node", n.Name)
					}
					n.GPUPods = 0
				case ActDeleteDriverPod:
					if n.GPUPods != 0 || !n.Unschedulable {
						t.Fatalf("%s: driver pod deleted with GPU pods present or node schedulable", n.Name)
					}
					n.DriverPod = &DriverPod{Name: n.Name + "-new", InSync: true, Ready: true}
				}
			}
			for k, v := range d.Annotations {
				if v == "" {
					delete(n.Annotations, k)
				} else {
					n.Annotations[k] = v
				}
			}
			n.State = d.To
		}
		clock = clock.Add(time.Second)
	}
	for _, n := range nodes {
		if n.State != StateDone {
			t.Errorf("%s ended %q", n.Name, n.State)
		}
		if n.Unschedulable != (n.Name == "n3") {
			t.Errorf("%s unschedulable = %v", n.Name, n.Unschedulable)
		}
		if !n.DriverPod.InSync {
			t.Errorf("%s runs the old driver", n.Name)
		}
	}
}

func TestRunBy(t *testing.T) {
	for _, tc := range []struct{ owner, moveTo, want string }{
		{"gold", "", "gold"},
		{"gold", "silver", "silver"}, // the destination's budget
		{"gold", MoveRelease, "gold"},
		{"", "", ""},
	} {
		if got := RunBy(tc.owner, tc.moveTo); got != tc.want {
			t.Errorf("RunBy(%q, %q) = %q, want %q", tc.owner, tc.moveTo, got, tc.want)
		}
	}
}

// A pod-deletion timeout names what the API said when it refused the
// eviction (a PodDisruptionBudget), and says so when nothing was refused.
func TestTimeoutNamesTheEvictionRefusal(t *testing.T) {
	now := time.Now()
	n := Node{Name: "n", State: StatePodDeletion, GPUPods: 1, Unschedulable: true,
		Annotations:     map[string]string{AnnotationDeletionStart: stamp(now.Add(-10 * time.Minute))},
		EvictionRefused: "eviction of ml/job-0 refused: The disruption budget job-pdb needs 1 healthy pods and has 1 currently"}
	d := Decide([]Node{n}, PolicyFor(&v1alpha1.NVIDIADriverSpec{}), now)[0]
	if d.To != StateFailed || !strings.Contains(d.Reason, "after 5m0s of eviction (eviction of ml/job-0 refused: The disruption budget job-pdb needs") ||
		d.Annotations[AnnotationFailure] != d.Reason {
		t.Fatalf("%s: %q, annotation %q", d.To, d.Reason, d.Annotations[AnnotationFailure])
	}
	n.EvictionRefused = ""
	if d := Decide([]Node{n}, PolicyFor(&v1alpha1.NVIDIADriverSpec{}), now)[0]; !strings.Contains(d.Reason, "no eviction was refused") {
		t.Fatalf("%q", d.Reason)
	}
}

// Decide and Track read nodes already in name order as they are, and sort a
// copy of any others: the caller's slice is never reordered.
func TestByName(t *testing.T) {
	sorted := []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	if got := byName(sorted); &got[0] != &sorted[0] {
		t.Error("nodes already in order were copied")
	}
	unsorted := []Node{{Name: "c"}, {Name: "a"}, {Name: "b"}}
	got := byName(unsorted)
	if got[0].Name != "a" || got[1].Name != "b" || got[2].Name != "c" {
		t.Errorf("byName = %v", got)
	}
	if unsorted[0].Name != "c" {
		t.Error("the caller's slice was reordered")
	}
}

// TestStepIsDecideOfOneNode: in a pass whose budget is spent, and with
// skipped and waiting nodes around, every node not entering the machine is
// decided by Step alone exactly as Decide decides it; a skipped or waiting
// node gets no change from Step.
func TestStepIsDecideOfOneNode(t *testing.T) {
	p := defaults()
	p.MaxParallelUpgrades = 1
	nodes := []Node{
		{Name: "a", State: StateCordon},
		{Name: "b", State: StatePodDeletion, GPUPods: 2},
		{Name: "c", State: StatePodRestart, DriverPod: fresh},
		{Name: "d", State: StateValidation, DriverPod: fresh, ValidatorsPending: true},
		{Name: "e", State: StateUncordon, Unschedulable: true},
		{Name: "f", State: StateRequired, DriverPod: stale},
		{Name: "g", State: StateDone, DriverPod: stale},
		{Name: "h", State: StatePodDeletion, Skip: true},
		{Name: "i", State: StateFailed, DriverPod: fresh, Annotations: map[string]string{AnnotationFailure: "x"}},
	}
	for i := range nodes {
		if nodes[i].Annotations == nil {
			nodes[i].Annotations = map[string]string{}
		}
	}
	for _, d := range Decide(nodes, p, now) {
		var n Node
		for _, c := range nodes {
			if c.Name == d.Node {
				n = c
			}
		}
		s := Step(n, p, now)
		if n.Skip || n.State == StateRequired {
			if s.Changed() {
				t.Errorf("%s: Step changed a node that is Decide's alone: %+v", n.Name, s)
			}
			continue
		}
		if !reflect.DeepEqual(s, d) {
			t.Errorf("%s: Step %+v, Decide %+v", n.Name, s, d)
		}
	}
}
