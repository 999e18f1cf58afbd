package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	"sigs.k8s.io/kwok/pkg/apis/internalversion"
	"sigs.k8s.io/kwok/pkg/apis/v1alpha1"
	"sigs.k8s.io/kwok/pkg/utils/gotpl"
	"sigs.k8s.io/kwok/pkg/utils/lifecycle"
	"sigs.k8s.io/yaml"
)

const every = 5 * time.Minute

// The stages are evaluated by kwok's own code: its stage parser, its timer
// (Stage.Delay) and its template renderer, with the functions kwok's node
// controller adds.
func parse(t *testing.T, doc string) (*v1alpha1.Stage, lifecycle.Lifecycle) {
	t.Helper()
	st := &v1alpha1.Stage{}
	if err := yaml.UnmarshalStrict([]byte(doc), st); err != nil {
		t.Fatalf("stage does not parse: %v\n%s", err, doc)
	}
	in, err := internalversion.ConvertToInternalStage(st)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lifecycle.NewLifecycle([]*internalversion.Stage{in})
	if err != nil {
		t.Fatal(err)
	}
	return st, lc
}

// delay is the timer kwok sets for node: the stage must match it, as kwok
// matches a node before it sets a timer.
func delay(t *testing.T, lc lifecycle.Lifecycle, node *corev1.Node, now time.Time) time.Duration {
	t.Helper()
	event := &lifecycle.Event{Data: node}
	stage, err := lc.Match(context.Background(), event)
	if err != nil || stage == nil {
		t.Fatalf("the stage does not match %s: %v", node.Name, err)
	}
	d, ok, err := stage.Delay(context.Background(), event, now)
	if err != nil || !ok {
		t.Fatalf("Delay: %v, %v", ok, err)
	}
	return d
}

func render(t *testing.T, st *v1alpha1.Stage, node *corev1.Node) corev1.NodeStatus {
	t.Helper()
	r := gotpl.NewRenderer(gotpl.FuncMap{
		"NodeConditions": func() []map[string]string {
			return []map[string]string{{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}}
		},
		"NodeIP":   func() string { return "10.0.0.1" },
		"NodeName": func() string { return node.Name },
		"NodePort": func() int { return 10250 },
	})
	out, err := r.ToJSON(st.Spec.Next.StatusTemplate, node)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	var status corev1.NodeStatus
	if err := json.Unmarshal(out, &status); err != nil {
		t.Fatalf("rendered status: %v\n%s", err, out)
	}
	return status
}

func readyBeat(t *testing.T, s corev1.NodeStatus) time.Time {
	t.Helper()
	for _, c := range s.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	t.Fatalf("no Ready condition in %+v", s.Conditions)
	return time.Time{}
}

func readyNode(name string, created, beat time.Time) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Status: corev1.NodeStatus{
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(beat),
			}},
		},
	}
}

// The first post is the creation time less up to a tenth of the period, the
// same whenever kwok renders it, and different nodes created together get
// different times.
func TestFirstBeatIsTheNodesOwn(t *testing.T) {
	doc, err := withBeat(nodefast.DefaultNodeInit, firstBeat(every))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := parse(t, doc)
	created := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	seen := map[time.Time]bool{}
	for _, name := range []string{"gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		beat := readyBeat(t, render(t, st, node))
		if again := readyBeat(t, render(t, st, node)); !again.Equal(beat) {
			t.Errorf("%s: rendered %v, then %v: a second timer would post again", name, beat, again)
		}
		if d := created.Sub(beat); d < 0 || d >= every/10 {
			t.Errorf("%s: first heartbeat %v is %v before creation, want [0, %v)", name, beat, d, every/10)
		}
		seen[beat] = true
	}
	if len(seen) < 2 {
		t.Errorf("four nodes created together all post at %v", seen)
	}
}

// Each timer is set for the last heartbeat plus the period, and the post
// writes the last grid time not after now: a late timer catches up without
// posting each missed period, and an early one posts what the node holds.
func TestHeartbeatStaysOnTheNodesGrid(t *testing.T) {
	doc, err := onGrid(nodeheartbeat.DefaultNodeHeartbeatWithLease, every)
	if err != nil {
		t.Fatal(err)
	}
	st, lc := parse(t, doc)
	now := time.Now().Truncate(time.Second)
	created := now.Add(-time.Hour)
	for _, tc := range []struct {
		name      string
		last      time.Duration // heartbeat, from now
		wantDelay time.Duration
		wantBeat  time.Duration // posted heartbeat, from the last one
	}{
		{"due", -every - 40*time.Second, -40 * time.Second, every},
		{"three periods late", -3*every - 10*time.Second, -2*every - 10*time.Second, 3 * every},
		{"early", -time.Minute, every - time.Minute, 0},
		{"from the future", 2 * time.Minute, every + 2*time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			last := now.Add(tc.last)
			node := readyNode("gpu-node-1", created, last)
			if d := delay(t, lc, node, now); d != tc.wantDelay {
				t.Errorf("timer in %v, want %v (the last heartbeat plus %v)", d, tc.wantDelay, every)
			}
			if got := readyBeat(t, render(t, st, node)).Sub(last); got != tc.wantBeat {
				t.Errorf("posted the last heartbeat plus %v, want plus %v", got, tc.wantBeat)
			}
		})
	}
	// A node without a heartbeat yet waits one period.
	node := readyNode("gpu-node-1", created, now)
	node.Status.Conditions[0].LastHeartbeatTime = metav1.Time{}
	if d := delay(t, lc, node, now); d != every {
		t.Errorf("without a heartbeat: timer in %v, want %v", d, every)
	}
}

func TestStageShapeChecked(t *testing.T) {
	if _, err := withBeat("no heartbeat here", firstBeat(every)); err == nil {
		t.Error("a stage without kwok's heartbeat line: want an error")
	}
}
