package upgrade

import (
	"reflect"
	"testing"
)

// chain runs Decide for one node, then Follow as the controller does while
// there is a step to follow, and returns the states written in order.
func chain(t *testing.T, n Node, p Policy) ([]string, Node) {
	t.Helper()
	d := Decide([]Node{n}, p, now)[0]
	var states []string
	if d.From != d.To {
		states = append(states, d.To)
	}
	for {
		var ok bool
		before := d
		n, d, ok = Follow(n, d, p, now)
		if !ok {
			return states, n
		}
		if d.From != before.To {
			t.Fatalf("followed decision starts from %q, the step before went to %q", d.From, before.To)
		}
		if d.Annotations[AnnotationStateSince] != stamp(now) {
			t.Errorf("step %s -> %s does not stamp its state's start: %v", d.From, d.To, d.Annotations)
		}
		states = append(states, d.To)
		if len(states) > 10 {
			t.Fatal("the chain does not end")
		}
	}
}

// TestFollow: the steps that wait on nothing the pass has not seen are taken
// in the same pass, every state still written in order; a step that reads
// pods, waits for the cluster or may fail ends the chain.
func TestFollow(t *testing.T) {
	jobs := defaults()
	jobs.WaitForJobsSelector = "app=train"
	cases := []struct {
		name   string
		node   Node
		policy Policy
		want   []string
	}{
		{"entry: cordon, then wait for jobs without a selector, then stop at pod deletion (reads pods)",
			Node{Name: "n", State: StateRequired, DriverPod: stale}, defaults(),
			[]string{StateCordon, StateWaitForJobs, StatePodDeletion}},
		{"with a job selector the chain stops at wait-for-jobs (counts pods)",
			Node{Name: "n", State: StateRequired, DriverPod: stale}, jobs,
			[]string{StateCordon, StateWaitForJobs}},
		{"new driver Ready: validated, uncordoned, done",
			Node{Name: "n", State: StatePodRestart, DriverPod: fresh, Unschedulable: true}, defaults(),
			[]string{StateValidation, StateUncordon, StateDone}},
		{"cordoned before the upgrade: validated and done, left cordoned",
			Node{Name: "n", State: StatePodRestart, DriverPod: fresh, Unschedulable: true, Annotations: map[string]string{AnnotationInitialUnsched: "true"}}, defaults(),
			[]string{StateValidation, StateDone}},
		{"restart-only path: validated and done",
			Node{Name: "n", State: StatePodRestart, DriverPod: fresh, Annotations: map[string]string{AnnotationRestartOnly: "true"}}, defaults(),
			[]string{StateValidation, StateDone}},
		{"new driver not Ready: waits in pod-restart, nothing to follow",
			Node{Name: "n", State: StatePodRestart, DriverPod: booting, Unschedulable: true}, defaults(),
			nil},
		{"pod deletion evicts and waits: nothing follows an action without a state change",
			Node{Name: "n", State: StatePodDeletion, DriverPod: stale, Unschedulable: true, GPUPods: 1}, defaults(),
			nil},
		{"no GPU pods: to pod-restart, which waits for the cluster",
			Node{Name: "n", State: StatePodDeletion, DriverPod: stale, Unschedulable: true}, defaults(),
			[]string{StatePodRestart}},
		{"a recovered failed node is uncordoned and done",
			Node{Name: "n", State: StateFailed, DriverPod: fresh, Unschedulable: true}, defaults(),
			[]string{StateUncordon, StateDone}},
		{"skipped node: nothing",
			Node{Name: "n", State: StateCordon, Skip: true, DriverPod: stale}, defaults(),
			nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ann := map[string]string{}
			for k, v := range c.node.Annotations {
				ann[k] = v
			}
			got, _ := chain(t, c.node, c.policy)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("states written %v, want %v", got, c.want)
			}
			if !reflect.DeepEqual(ann, c.node.Annotations) && !(len(ann) == 0 && c.node.Annotations == nil) {
				t.Errorf("Follow wrote to the node's annotations (the cache's map): %v -> %v", ann, c.node.Annotations)
			}
		})
	}
}

// The node Follow hands on is the node as the decision left it: the new
// state, the annotations set and removed, cordoned or not.
func TestFollowAppliesTheDecision(t *testing.T) {
	n := Node{Name: "n", State: StatePodRestart, DriverPod: fresh, Unschedulable: true,
		Annotations: map[string]string{AnnotationValidationStart: ago(0)}}
	d := Decide([]Node{n}, defaults(), now)[0] // -> validation
	after, f, ok := Follow(n, d, defaults(), now)
	if !ok || after.State != StateValidation || f.To != StateUncordon {
		t.Fatalf("after %+v, follow %+v, %v", after, f, ok)
	}
	if after.Annotations[AnnotationStateSince] != stamp(now) {
		t.Errorf("the decision's annotations were not applied: %v", after.Annotations)
	}
	after, f, ok = Follow(after, f, defaults(), now) // uncordon -> done
	if !ok || f.To != StateDone || !reflect.DeepEqual(f.Actions, []Action{ActUncordon}) {
		t.Fatalf("follow %+v, %v", f, ok)
	}
	if _, ok := after.Annotations[AnnotationValidationStart]; ok {
		t.Errorf("an annotation the decision removed is still there: %v", after.Annotations)
	}
	after, _, ok = Follow(after, f, defaults(), now)
	if ok || after.Unschedulable || after.State != StateDone {
		t.Errorf("after the uncordon: %+v (ok %v)", after, ok)
	}
}
