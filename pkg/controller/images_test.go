package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/imagecheck"
	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func running(image string, desired, updated, available int32) *appsv1.DaemonSet {
	d := ds(1, 1, desired, updated, available)
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "nvidia-driver-ctr", Image: image}}
	return d
}

// The gate against a real registry: which pools are held in which mode, what
// the condition says, and that a settled pool costs no registry request.
func TestImageGate(t *testing.T) {
	reg, err := registrytest.Start("127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	down, err := registrytest.Start("127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	down.SetDown(true)
	oldImg, newImg := reg.Host+"/nvidia/driver:550.90.07-ubuntu22.04", reg.Host+"/nvidia/driver:570.1-ubuntu22.04"
	if err := reg.Push(oldImg); err != nil {
		t.Fatal(err)
	}
	pool := func(img string) plan.Pool {
		return plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "nvidia-gpu-driver-ubuntu22.04-abc", Image: img, Nodes: []string{"gpu-1", "gpu-2"}}
	}
	cases := []struct {
		name      string
		mode      string
		pool      plan.Pool
		live      *appsv1.DaemonSet
		wantHeld  bool
		wantCond  metav1.ConditionStatus
		wantRsn   string
		wantMsg   string
		noRequest bool
	}{
		{name: "new pool, missing image", mode: ImageCheckEnforce, pool: pool(newImg), wantHeld: true, wantCond: metav1.ConditionFalse, wantRsn: imagecheck.ReasonMissing,
			wantMsg: "Image not found in the registry: " + newImg + " for nvidia-gpu-driver-ubuntu22.04-abc, 2 node(s): gpu-1, gpu-2; the pool waits: no node is cordoned or restarted for it"},
		{name: "upgrade to a missing image", mode: ImageCheckEnforce, pool: pool(newImg), live: running(oldImg, 2, 2, 2), wantHeld: true, wantCond: metav1.ConditionFalse, wantRsn: imagecheck.ReasonMissing},
		{name: "upgrade to a missing image, warn", mode: ImageCheckWarn, pool: pool(newImg), live: running(oldImg, 2, 2, 2), wantCond: metav1.ConditionFalse, wantRsn: imagecheck.ReasonMissing,
			wantMsg: "imageCheck is warn: rolling anyway"},
		{name: "upgrade to an image that exists", mode: ImageCheckEnforce, pool: pool(oldImg), live: running(reg.Host+"/nvidia/driver:535.1-ubuntu22.04", 2, 2, 2), wantCond: metav1.ConditionTrue, wantRsn: imagecheck.ReasonFound},
		{name: "already applied, still rolling, image gone", mode: ImageCheckEnforce, pool: pool(newImg), live: running(newImg, 2, 1, 2), wantCond: metav1.ConditionFalse, wantRsn: imagecheck.ReasonMissing,
			wantMsg: "the DaemonSet already runs it, so nothing is held"},
		{name: "registry down holds nothing", mode: ImageCheckEnforce, pool: pool(down.Host + "/nvidia/driver:1-ubuntu22.04"), wantCond: metav1.ConditionUnknown, wantRsn: imagecheck.ReasonUnreachable,
			wantMsg: "not holding"},
		{name: "applied, not yet observed by the DaemonSet controller", mode: ImageCheckWarn, pool: pool(newImg), live: func() *appsv1.DaemonSet { d := running(newImg, 2, 2, 2); d.Generation = 2; return d }(),
			wantCond: metav1.ConditionFalse, wantRsn: imagecheck.ReasonMissing},
		{name: "settled pool: nothing asked", mode: ImageCheckEnforce, pool: pool(newImg), live: running(newImg, 2, 2, 2), wantCond: metav1.ConditionTrue, wantRsn: v1alpha1.ReasonNothingToCheck, noRequest: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &imageGate{mode: tc.mode, checker: &imagecheck.Checker{Timeout: 5 * time.Second}, namespace: "gpu-operator"}
			owned := map[string]*appsv1.DaemonSet{}
			if tc.live != nil {
				owned[tc.pool.DaemonSet] = tc.live
			}
			before := reg.Requests.Load()
			d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold", Generation: 3}}
			v := g.check(context.Background(), d, []plan.Pool{tc.pool}, owned, func(plan.Pool) []string { return []string{"linux/amd64"} })
			if got := v.isHeld(tc.pool.DaemonSet); got != tc.wantHeld {
				t.Errorf("held = %v, want %v", got, tc.wantHeld)
			}
			c := v.condition(3)
			if c.Status != tc.wantCond || c.Reason != tc.wantRsn || !strings.Contains(c.Message, tc.wantMsg) {
				t.Errorf("condition = %s/%s %q, want %s/%s containing %q", c.Status, c.Reason, c.Message, tc.wantCond, tc.wantRsn, tc.wantMsg)
			}
			if tc.noRequest && reg.Requests.Load() != before {
				t.Errorf("a settled pool made %d registry request(s)", reg.Requests.Load()-before)
			}
			if c.Status != metav1.ConditionTrue && v.next.IsZero() {
				t.Error("no re-check time for an image that was not found")
			}
		})
	}

	// Held on "not found", then the registry stops answering: still held
	// (only "it exists" releases a pool).
	flaky, err := registrytest.Start("127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer flaky.Close()
	now := time.Unix(1_000_000, 0)
	g := &imageGate{mode: ImageCheckEnforce, checker: &imagecheck.Checker{Timeout: 5 * time.Second, Now: func() time.Time { return now }}}
	held := pool(flaky.Host + "/nvidia/driver:570.1-ubuntu22.04")
	live := map[string]*appsv1.DaemonSet{held.DaemonSet: running(oldImg, 2, 2, 2)}
	check := func() *imageVerdict {
		return g.check(context.Background(), &v1alpha1.NVIDIADriver{}, []plan.Pool{held}, live, func(plan.Pool) []string { return []string{"linux/amd64"} })
	}
	if v := check(); !v.isHeld(held.DaemonSet) {
		t.Fatal("not held on not found")
	}
	flaky.SetDown(true)
	now = now.Add(time.Hour)
	v := check()
	if !v.isHeld(held.DaemonSet) {
		t.Fatalf("released when the registry went down: %+v", v.pools)
	}
	if c := v.condition(1); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "last answer: not found; the registry cannot be asked now") {
		t.Errorf("condition while held and unreachable: %s %q", c.Status, c.Message)
	}
	flaky.SetDown(false)
	if err := flaky.Push("nvidia/driver:570.1-ubuntu22.04"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if v := check(); v.isHeld(held.DaemonSet) {
		t.Fatal("still held after the registry said the image exists")
	}

	off := &imageGate{mode: ImageCheckOff, checker: &imagecheck.Checker{}}
	if v := off.check(context.Background(), &v1alpha1.NVIDIADriver{}, []plan.Pool{pool(newImg)}, nil, nil); v != nil || v.isHeld("x") {
		t.Fatal("off must check and hold nothing")
	}
}

// A held pool makes the driver NotReady with the reason, and turning the
// check off removes the condition.
func TestStatusOfHeldPool(t *testing.T) {
	p := plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "ds", Image: "reg/driver:2-ubuntu22.04", Nodes: []string{"a", "b"}}
	v := &imageVerdict{mode: ImageCheckEnforce, held: map[string]bool{"ds": true}, next: time.Unix(100, 0),
		pools: []poolImages{{DaemonSet: "ds", Nodes: p.Nodes, Held: true, Results: []imagecheck.Result{{Image: p.Image, Status: imagecheck.Missing, Reason: imagecheck.ReasonMissing, Message: "not found in the registry"}}}}}
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold", Generation: 2}}
	st := computeStatus(statusInput{Driver: d, Plan: &plan.Driver{Pools: []plan.Pool{p}}, DaemonSets: map[string]*appsv1.DaemonSet{"ds": running("reg/driver:1-ubuntu22.04", 2, 2, 2)}, Images: v})
	ready := meta.FindStatusCondition(st.Conditions, CondReady)
	if st.State != v1alpha1.NotReady || ready.Reason != imagecheck.ReasonMissing || !strings.HasPrefix(ready.Message, "Holding ds: Image not found in the registry: reg/driver:2-ubuntu22.04") {
		t.Fatalf("state %s, Ready %s %q", st.State, ready.Reason, ready.Message)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionImageAvailable); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("ImageAvailable = %v", c)
	}
	d.Status = st
	// A CR in error is not checked (nothing is applied): the condition stays.
	kept := computeStatus(statusInput{Driver: d, Plan: &plan.Driver{Pools: []plan.Pool{p}, Error: &plan.Problem{Reason: "ConflictingNodeSelector", Message: "x"}}, Images: &imageVerdict{keep: true}})
	if c := meta.FindStatusCondition(kept.Conditions, v1alpha1.ConditionImageAvailable); c == nil || c.Reason != imagecheck.ReasonMissing {
		t.Fatalf("a CR in error lost its ImageAvailable condition: %v", c)
	}
	st = computeStatus(statusInput{Driver: d, Plan: &plan.Driver{Pools: []plan.Pool{p}}, DaemonSets: map[string]*appsv1.DaemonSet{"ds": running(p.Image, 2, 2, 2)}})
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionImageAvailable); c != nil {
		t.Fatalf("with the check off the condition stays: %v", c)
	}
	if st.State != v1alpha1.Ready {
		t.Fatalf("state %s after the hold ended", st.State)
	}
}
