package controller

import (
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

func ds(gen, observed int64, desired, updated, available int32) *appsv1.DaemonSet {
	d := &appsv1.DaemonSet{}
	d.Generation = gen
	d.Status = appsv1.DaemonSetStatus{ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: available, NumberReady: available}
	return d
}

func TestComputeStatus(t *testing.T) {
	pool := plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "ds", Image: "img", Nodes: []string{"a", "b"}}
	cases := []struct {
		name       string
		plan       plan.Driver
		dss        map[string]*appsv1.DaemonSet
		states     map[string]string
		failure    error
		wantState  v1alpha1.State
		wantReady  metav1.ConditionStatus
		wantReason string
		wantError  string // reason of Error=True, "" for Error=False
	}{
		{"rolled out", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(2, 2, 2, 2, 2)}, nil, nil, v1alpha1.Ready, metav1.ConditionTrue, ReasonReconciled, ""},
		{"desired 0 is ready", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(1, 1, 0, 0, 0)}, nil, nil, v1alpha1.Ready, metav1.ConditionTrue, ReasonReconciled, ""},
		{"DaemonSet missing", plan.Driver{Pools: []plan.Pool{pool}}, nil, nil, nil, v1alpha1.NotReady, metav1.ConditionFalse, ReasonDriverNotReady, ""},
		{"not observed yet", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(3, 2, 2, 2, 2)}, nil, nil, v1alpha1.NotReady, metav1.ConditionFalse, ReasonDriverNotReady, ""},
		{"pods not updated (OnDelete)", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(2, 2, 2, 1, 2)}, nil, nil, v1alpha1.NotReady, metav1.ConditionFalse, ReasonDriverNotReady, ""},
		{"pods not available", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(2, 2, 2, 2, 1)}, nil, nil, v1alpha1.NotReady, metav1.ConditionFalse, ReasonDriverNotReady, ""},
		{"a node upgrading", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(2, 2, 2, 2, 2)}, map[string]string{"a": "cordon-required", "b": plan.UpgradeDone}, nil, v1alpha1.NotReady, metav1.ConditionFalse, ReasonUpgrading, ""},
		{"all nodes upgrade-done", plan.Driver{Pools: []plan.Pool{pool}}, map[string]*appsv1.DaemonSet{"ds": ds(2, 2, 2, 2, 2)}, map[string]string{"a": plan.UpgradeDone, "b": plan.UpgradeDone}, nil, v1alpha1.Ready, metav1.ConditionTrue, ReasonReconciled, ""},
		{"no nodes", plan.Driver{}, nil, nil, nil, v1alpha1.Ready, metav1.ConditionTrue, ReasonNoMatchingNodes, ""},
		{"conflict", plan.Driver{Error: &plan.Problem{Reason: plan.ReasonConflictingNodeSelector, Message: "m"}}, nil, nil, nil, v1alpha1.NotReady, metav1.ConditionFalse, "Error", plan.ReasonConflictingNodeSelector},
		{"API failure", plan.Driver{Pools: []plan.Pool{pool}}, nil, nil, errors.New("boom"), v1alpha1.NotReady, metav1.ConditionFalse, "Error", ReasonReconcileFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &v1alpha1.NVIDIADriver{}
			d.Generation = 4
			pd := tc.plan
			st := computeStatus(statusInput{Driver: d, Plan: &pd, DaemonSets: tc.dss, Nodes: nodesFor(&pd, d.Name, tc.states, nil), Failure: tc.failure})
			if st.State != tc.wantState || st.ObservedGeneration != 4 {
				t.Errorf("state %q observedGeneration %d, want %q 4", st.State, st.ObservedGeneration, tc.wantState)
			}
			r := meta.FindStatusCondition(st.Conditions, CondReady)
			if r == nil || r.Status != tc.wantReady || r.Reason != tc.wantReason {
				t.Errorf("Ready = %+v, want %s/%s", r, tc.wantReady, tc.wantReason)
			}
			e := meta.FindStatusCondition(st.Conditions, CondError)
			if tc.wantError == "" && (e == nil || e.Status != metav1.ConditionFalse) {
				t.Errorf("Error = %+v, want False", e)
			}
			if tc.wantError != "" && (e == nil || e.Status != metav1.ConditionTrue || e.Reason != tc.wantError) {
				t.Errorf("Error = %+v, want True/%s", e, tc.wantError)
			}
		})
	}
}

func TestPoolNodeNotYetLabelledIsNotReady(t *testing.T) {
	pool := plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "ds", Nodes: []string{"a", "b"}}
	d := &v1alpha1.NVIDIADriver{}
	d.Name = "gold"
	pd := &plan.Driver{Pools: []plan.Pool{pool}}
	st := computeStatus(statusInput{Driver: d, Plan: pd, DaemonSets: map[string]*appsv1.DaemonSet{"ds": ds(1, 1, 1, 1, 1)},
		Nodes: nodesFor(pd, d.Name, nil, map[string]string{"a": "gold", "b": "silver"})})
	if st.State != v1alpha1.NotReady {
		t.Errorf("state %q with a node still owned by another driver", st.State)
	}
}

func TestStatusIsStableAcrossReconciles(t *testing.T) {
	pool := plan.Pool{OSTag: "ubuntu22.04", DaemonSet: "ds", Nodes: []string{"a"}}
	d := &v1alpha1.NVIDIADriver{}
	in := statusInput{Driver: d, Plan: &plan.Driver{Pools: []plan.Pool{pool}}, DaemonSets: map[string]*appsv1.DaemonSet{"ds": ds(1, 1, 1, 1, 1)}}
	d.Status = computeStatus(in)
	again := computeStatus(in)
	if !metaEqual(d.Status, again) {
		t.Errorf("status changed with identical inputs: a reconcile would write:\n%+v\n%+v", d.Status, again)
	}
}

func metaEqual(a, b v1alpha1.NVIDIADriverStatus) bool {
	if len(a.Conditions) != len(b.Conditions) || a.State != b.State {
		return false
	}
	for i := range a.Conditions {
		if a.Conditions[i] != b.Conditions[i] {
			return false
		}
	}
	return true
}

// nodesFor is what the driver pass hands computeStatus for nodes with
// these labels: upgrade states and owners by node name (nil owners: every
// pool node is already the driver's).
func nodesFor(pd *plan.Driver, driver string, states, owners map[string]string) []poolNodes {
	s := &snapshot{}
	for _, pool := range pd.Pools {
		for _, n := range pool.Nodes {
			l := map[string]string{}
			if st, ok := states[n]; ok {
				l[plan.LabelUpgradeState] = st
			}
			owner := driver
			if owners != nil {
				owner = owners[n]
			}
			if owner != "" {
				l[plan.LabelOwner] = owner
			}
			s.nodes = append(s.nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, ResourceVersion: "1", Labels: l}})
		}
	}
	return s.poolNodesOf(pd, driver)
}
