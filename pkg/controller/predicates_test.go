package controller

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

func rawDriverPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-driver-ubuntu22.04-x", Namespace: "gpu-operator", ResourceVersion: "10",
			Labels:          map[string]string{"controller-revision-hash": "abc", "pod-template-generation": "1"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", UID: "u", Controller: boolPtr(true)}}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "nvidia-driver-ctr",
			Image: "nvcr.io/nvidia/driver:550", Env: []corev1.EnvVar{{Name: render.ConfigDigestEnv, Value: "d1"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "nvidia-driver-ctr", Ready: true, RestartCount: 0, ImageID: "sha256:1"}}},
	}
}

func boolPtr(b bool) *bool { return &b }

// cachedPod is p as the cache keeps it.
func cachedPod(p *corev1.Pod) *driverPod {
	o, _ := trimPod(p)
	return o.(*driverPod)
}

// The pod predicate drops exactly the updates trimPod makes invisible, and
// passes every change of a field the machine reads: the cases run through
// trimPod as the cache does.
func TestDriverPodMatters(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*corev1.Pod)
		want   bool
	}{
		{"only the resourceVersion", func(*corev1.Pod) {}, false},
		{"pod IP", func(p *corev1.Pod) { p.Status.PodIP = "10.0.0.2" }, false},
		{"another condition", func(p *corev1.Pod) { p.Status.Conditions[1].Status = corev1.ConditionFalse }, false},
		{"image ID", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].ImageID = "sha256:2" }, false},
		{"ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		// The machine reads the pod's Ready condition, not each container's.
		{"a container's readiness alone", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].Ready = false }, false},
		{"restart", func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount = 1 }, true},
		{"init container restart", func(p *corev1.Pod) {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "k8s-driver-manager", RestartCount: 2}}
		}, true},
		{"phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, true},
		{"deleting", func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }, true},
		{"revision label", func(p *corev1.Pod) { p.Labels["controller-revision-hash"] = "def" }, true},
		{"bound to a node", func(p *corev1.Pod) { p.Spec.NodeName = "n2" }, true},
		{"config digest", func(p *corev1.Pod) { p.Spec.Containers[0].Env[0].Value = "d2" }, true},
		{"owner", func(p *corev1.Pod) { p.OwnerReferences[0].UID = "v" }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old, cur := rawDriverPod(), rawDriverPod()
			cur.ResourceVersion = "11"
			c.mutate(cur)
			got := driverPodMatters(func(*driverPod) bool { return false }).Update(event.UpdateEvent{ObjectOld: cachedPod(old), ObjectNew: cachedPod(cur)})
			if got != c.want {
				t.Errorf("update passed = %v, want %v", got, c.want)
			}
		})
	}
}

// A driver pod is settled only where the cache shows, for sure, that the
// upgrade machine has nothing to do for it; settled pods' events do not wake
// the machine, any other's do.
func TestSettledPod(t *testing.T) {
	ds := func() *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ds", Namespace: "gpu-operator", UID: "u", Generation: 2,
			Annotations: map[string]string{templateGenerationAnnotation: "1"}}, Status: appsv1.DaemonSetStatus{ObservedGeneration: 2}}
	}
	node := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{plan.LabelUpgradeState: upgrade.StateDone}}}
	}
	cases := []struct {
		name    string
		pod     func(*corev1.Pod)
		node    func(*corev1.Node)
		ds      func(*appsv1.DaemonSet)
		noNode  bool
		noDS    bool
		settled bool
	}{
		{name: "in sync on an upgrade-done node", settled: true},
		{name: "not bound to a node yet", pod: func(p *corev1.Pod) { p.Spec.NodeName = "" }, settled: true},
		{name: "node with no state", node: func(n *corev1.Node) { delete(n.Labels, plan.LabelUpgradeState) }},
		{name: "node in the machine", node: func(n *corev1.Node) { n.Labels[plan.LabelUpgradeState] = upgrade.StatePodRestart }},
		{name: "node failed", node: func(n *corev1.Node) { n.Labels[plan.LabelUpgradeState] = upgrade.StateFailed }},
		{name: "node moving", node: func(n *corev1.Node) { n.Annotations = map[string]string{upgrade.AnnotationMoveTo: "other"} }},
		{name: "upgrade requested", node: func(n *corev1.Node) { n.Annotations = map[string]string{upgrade.AnnotationRequested: "true"} }},
		{name: "older template", pod: func(p *corev1.Pod) { p.Labels[podTemplateGenerationLabel] = "0" }},
		{name: "template not observed", ds: func(d *appsv1.DaemonSet) { d.Generation = 3 }},
		{name: "another DaemonSet of that name", ds: func(d *appsv1.DaemonSet) { d.UID = "v" }},
		{name: "DaemonSet not cached", noDS: true},
		{name: "node not cached", noNode: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nodes := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
			if !c.noNode {
				n := node()
				if c.node != nil {
					c.node(n)
				}
				if err := nodes.Add(n); err != nil {
					t.Fatal(err)
				}
			}
			daemonSets := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
			if !c.noDS {
				d := ds()
				if c.ds != nil {
					c.ds(d)
				}
				if err := daemonSets.Add(d); err != nil {
					t.Fatal(err)
				}
			}
			p := rawDriverPod()
			if c.pod != nil {
				c.pod(p)
			}
			if got := settledPod(daemonSets, nodes)(cachedPod(p)); got != c.settled {
				t.Errorf("settled = %v, want %v", got, c.settled)
			}
		})
	}

	// The predicate: a settled pod's coming, going and readiness do not
	// wake the machine; a change that unsettles it does.
	settled := func(p *driverPod) bool { return p.Labels[podTemplateGenerationLabel] == "1" }
	pred := driverPodMatters(settled)
	rawNotReady, rawStale := rawDriverPod(), rawDriverPod()
	rawNotReady.Status.Conditions[0].Status = corev1.ConditionFalse
	rawStale.Labels[podTemplateGenerationLabel] = "0"
	ready, notReady, stale := cachedPod(rawDriverPod()), cachedPod(rawNotReady), cachedPod(rawStale)
	if pred.Create(event.CreateEvent{Object: ready}) || pred.Delete(event.DeleteEvent{Object: ready}) ||
		pred.Update(event.UpdateEvent{ObjectOld: notReady, ObjectNew: ready}) {
		t.Error("a settled pod's event woke the machine")
	}
	if !pred.Create(event.CreateEvent{Object: stale}) || !pred.Delete(event.DeleteEvent{Object: stale}) ||
		!pred.Update(event.UpdateEvent{ObjectOld: ready, ObjectNew: stale}) {
		t.Error("an unsettled pod's event did not wake the machine")
	}
}

func TestDaemonSetMattersToUpgrade(t *testing.T) {
	base := func() *appsv1.DaemonSet {
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "ds", Generation: 2, ResourceVersion: "5",
				Annotations: map[string]string{templateGenerationAnnotation: "2"}, Labels: map[string]string{"app": "x"}},
			Status: appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 10, NumberReady: 3},
		}
	}
	cases := []struct {
		name   string
		mutate func(*appsv1.DaemonSet)
		want   bool
	}{
		{"a pod became ready", func(d *appsv1.DaemonSet) { d.Status.NumberReady = 4; d.Status.NumberAvailable = 4 }, false},
		{"new template", func(d *appsv1.DaemonSet) { d.Generation = 3 }, true},
		{"generation observed", func(d *appsv1.DaemonSet) { d.Status.ObservedGeneration = 3 }, true},
		{"template generation annotation", func(d *appsv1.DaemonSet) { d.Annotations[templateGenerationAnnotation] = "3" }, true},
		{"label", func(d *appsv1.DaemonSet) { d.Labels["app"] = "y" }, true},
		{"owner", func(d *appsv1.DaemonSet) {
			d.OwnerReferences = []metav1.OwnerReference{{Kind: "NVIDIADriver", Name: "other", UID: "w"}}
		}, true},
		{"deleting", func(d *appsv1.DaemonSet) { now := metav1.Now(); d.DeletionTimestamp = &now }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old, cur := base(), base()
			cur.ResourceVersion = "6"
			c.mutate(cur)
			if got := daemonSetMattersToUpgrade().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}); got != c.want {
				t.Errorf("update passed = %v, want %v", got, c.want)
			}
		})
	}
}

func annotated(n *corev1.Node, k, v string) *corev1.Node {
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[k] = v
	return n
}

// The node labeller sleeps through the upgrade machine's state writes on
// nodes that keep their owner, and wakes for everything else it reads.
func TestLabellerNodeChanged(t *testing.T) {
	node := func(owner, state string, extra ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
		if owner != "" {
			n.Labels[plan.LabelOwner] = owner
		}
		if state != "" {
			n.Labels[plan.LabelUpgradeState] = state
		}
		for i := 0; i+1 < len(extra); i += 2 {
			n.Labels[extra[i]] = extra[i+1]
		}
		return n
	}
	cases := []struct {
		name     string
		old, new *corev1.Node
		selector map[string]string // of the one CR
		want     bool
	}{
		{"a step of an owned node", node("gold", "upgrade-required"), node("gold", "cordon-required"), nil, false},
		{"an owned node's first upgrade-done", node("gold", ""), node("gold", "upgrade-done"), nil, false},
		{"the state of a node without owner", node("", "upgrade-done"), node("", ""), nil, true},
		{"the owner released with the state", node("gold", "pod-restart-required"), node("", "upgrade-done"), nil, true},
		{"the owner changed", node("gold", "upgrade-done"), node("silver", "upgrade-done"), nil, true},
		{"a selection label with the state", node("gold", "upgrade-done", "tier", "a"), node("gold", "upgrade-required", "tier", "b"), nil, true},
		{"a state a CR selects by", node("gold", "upgrade-required"), node("gold", "upgrade-done"), map[string]string{plan.LabelUpgradeState: "upgrade-done"}, true},
		{"a step with the machine's annotations", node("gold", "cordon-required"),
			annotated(node("gold", "wait-for-jobs-required"), upgrade.AnnotationStateSince, "2026-12-07T00:00:00Z"), nil, false},
		{"a move asked for with the state", node("gold", "upgrade-done"),
			annotated(node("gold", "upgrade-required"), upgrade.AnnotationMoveTo, "silver"), nil, true},
		{"a move called off", annotated(node("gold", "cordon-required"), upgrade.AnnotationMoveTo, "silver"),
			node("gold", "uncordon-required"), nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = v1alpha1.AddToScheme(scheme)
			d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"}}
			d.Spec.NodeSelector = tc.selector
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d).Build()
			if got := labellerNodeChanged(c).Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// The upgrade machine wakes when a driver DaemonSet's newest revision
// appears or is renumbered, since that decides which pods are in sync.
func TestRevisionMattersToUpgrade(t *testing.T) {
	rev := func(n int64) *appsv1.ControllerRevision {
		return &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "ds-abc", ResourceVersion: fmt.Sprint(n)}, Revision: n}
	}
	p := revisionMattersToUpgrade()
	if !p.Create(event.CreateEvent{Object: rev(1)}) {
		t.Error("a new revision: want a pass")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: rev(1), ObjectNew: rev(3)}) {
		t.Error("a revision renumbered (an undo): want a pass")
	}
	if p.Update(event.UpdateEvent{ObjectOld: rev(3), ObjectNew: rev(3)}) {
		t.Error("an update that keeps the number: want none")
	}
	if p.Delete(event.DeleteEvent{Object: rev(1)}) {
		t.Error("a pruned revision: want none")
	}
}

// A DaemonSet update that moves only its counts wakes the driver
// reconciler when the CR's next counts-only status write is due; anything
// else, at once.
func TestDaemonSetToDriver(t *testing.T) {
	ds := func() *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ds", Namespace: "gpu-operator", Generation: 2,
			OwnerReferences: []metav1.OwnerReference{{Kind: "NVIDIADriver", Name: "gold", UID: "g", Controller: boolPtr(true)}}},
			Status: appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 10, UpdatedNumberScheduled: 10, NumberAvailable: 3, NumberReady: 3}}
	}
	cases := []struct {
		name   string
		mutate func(*appsv1.DaemonSet)
		later  bool
	}{
		{"a pod became available", func(d *appsv1.DaemonSet) { d.Status.NumberAvailable, d.Status.NumberReady = 4, 4 }, true},
		{"rolled out", func(d *appsv1.DaemonSet) { d.Status.NumberAvailable = 10 }, false},
		{"new template", func(d *appsv1.DaemonSet) { d.Generation = 3 }, false},
		{"observed", func(d *appsv1.DaemonSet) { d.Status.ObservedGeneration = 1 }, false},
		{"edited label", func(d *appsv1.DaemonSet) { d.Labels = map[string]string{"x": "y"} }, false},
		{"deleting", func(d *appsv1.DaemonSet) { now := metav1.Now(); d.DeletionTimestamp = &now }, false},
	}
	last := time.Now()
	pacer := &statusPacer{}
	pacer.wrote("g", writerDriver, last)
	h := daemonSetToDriver(pacer, func() time.Time { return last.Add(statusEvery - time.Second) })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			old, cur := ds(), ds()
			c.mutate(cur)
			h.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: cur}, q)
			if c.later == (q.Len() == 1) {
				t.Fatalf("queued at once: %v, want %v", q.Len() == 1, !c.later)
			}
			if !c.later {
				return
			}
			got := make(chan reconcile.Request, 1)
			go func() {
				if item, shutdown := q.Get(); !shutdown {
					got <- item
				}
			}()
			select {
			case req := <-got:
				if req.Name != "gold" {
					t.Errorf("woke %q, want gold", req.Name)
				}
			case <-time.After(5 * time.Second):
				t.Error("the counts-only update never woke the CR")
			}
		})
	}
	// Nothing written yet: at once.
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	old, cur := ds(), ds()
	cur.Status.NumberAvailable = 4
	daemonSetToDriver(&statusPacer{}, time.Now).Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: cur}, q)
	if q.Len() != 1 {
		t.Error("a counts-only update with no write to pace did not wake the CR at once")
	}
}

// The upgrade machine wakes for a node's label change only when it reads
// that label: its own, or one a CR selects nodes or canaries by.
func TestMachineLabelsChanged(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"}}
	d.Spec.NodeSelector = map[string]string{"pool": "gold"}
	d.Spec.UpgradePolicy = &v1alpha1.DriverUpgradePolicySpec{Canary: &v1alpha1.CanarySpec{Selector: &metav1.LabelSelector{
		MatchLabels:      map[string]string{"canary": "yes"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: metav1.LabelSelectorOpExists}}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d).Build()
	base := map[string]string{plan.LabelOwner: "gold", "pool": "gold", "kubernetes.io/os": "linux", "team": "a"}
	cases := []struct {
		name  string
		edit  func(map[string]string)
		wakes bool
	}{
		{"nothing", func(map[string]string) {}, false},
		{"beta os/arch added (kube-controller-manager)", func(l map[string]string) { l["beta.kubernetes.io/os"], l["beta.kubernetes.io/arch"] = "linux", "amd64" }, false},
		{"an unrelated label removed", func(l map[string]string) {
			delete(l, "kubernetes.io/os")
			l["kubernetes.io/os"] = "linux"
			l["team"] = "x"
		}, false},
		{"owner", func(l map[string]string) { l[plan.LabelOwner] = "silver" }, true},
		{"upgrade state", func(l map[string]string) { l[plan.LabelUpgradeState] = upgrade.StateRequired }, true},
		{"skip", func(l map[string]string) { l[upgrade.LabelSkip] = "true" }, true},
		{"platform", func(l map[string]string) { l["kubernetes.io/arch"] = "arm64" }, true},
		{"platform label removed", func(l map[string]string) { delete(l, "kubernetes.io/os") }, true},
		{"a label a nodeSelector names", func(l map[string]string) { l["pool"] = "silver" }, true},
		{"a canary matchLabels key", func(l map[string]string) { l["canary"] = "yes" }, true},
		{"a canary expression key", func(l map[string]string) { l["rack"] = "r1" }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := maps.Clone(base)
			tc.edit(n)
			if got := machineLabelsChanged(c, base, n); got != tc.wakes {
				t.Errorf("wakes = %v, want %v", got, tc.wakes)
			}
		})
	}
}

// samePodToMachine compares field by field: every metadata field trimPod
// keeps must be one it compares, or a change to it would not wake the
// machine.
func TestSamePodToMachineComparesWhatTrimPodKeeps(t *testing.T) {
	compared := map[string]bool{"Name": true, "Namespace": true, "UID": true, "Labels": true, "OwnerReferences": true,
		"CreationTimestamp": true, "DeletionTimestamp": true, "ResourceVersion": true}
	full := rawDriverPod()
	now := metav1.Now()
	full.UID, full.CreationTimestamp, full.DeletionTimestamp, full.DeletionGracePeriodSeconds = "pod-uid", now, &now, ptr.To[int64](30)
	full.Annotations, full.Generation, full.Finalizers = map[string]string{"a": "b"}, 4, []string{"f"}
	full.GenerateName, full.ManagedFields = "nvidia-gpu-driver-", []metav1.ManagedFieldsEntry{{Manager: "m"}}
	kept := reflect.ValueOf(cachedPod(full).ObjectMeta)
	for i := 0; i < kept.NumField(); i++ {
		if name := kept.Type().Field(i).Name; !kept.Field(i).IsZero() && !compared[name] {
			t.Errorf("trimPod keeps %s, which samePodToMachine does not compare", name)
		}
	}
	base := cachedPod(rawDriverPod())
	for _, c := range []struct {
		name   string
		mutate func(*driverPod)
	}{
		{"name", func(p *driverPod) { p.Name = "other" }},
		{"namespace", func(p *driverPod) { p.Namespace = "other" }},
		{"UID", func(p *driverPod) { p.UID = "other" }},
		{"created", func(p *driverPod) { p.CreationTimestamp = metav1.NewTime(now.Add(time.Second)) }},
		{"owner controller flag", func(p *driverPod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", UID: "u"}}
		}},
		{"owner added", func(p *driverPod) {
			p.OwnerReferences = append(slices.Clone(p.OwnerReferences), metav1.OwnerReference{Kind: "X"})
		}},
		{"label removed", func(p *driverPod) { p.Labels = map[string]string{"pod-template-generation": "1"} }},
	} {
		n := *base
		c.mutate(&n)
		if samePodToMachine(base, &n) {
			t.Errorf("%s: the same pod to the machine", c.name)
		}
	}
	if n := *base; !samePodToMachine(base, &n) {
		t.Error("a copy is not the same pod")
	}
}

// The labeller's node handler hurries its next pass for an update that
// changes a label a CR selects nodes by (an admin's relabel, which may move
// the node), and for nothing else; every update is timed for the move
// clock, and each event queues the labeller.
func TestLabellerWakesHurriesARelabel(t *testing.T) {
	node := func(labels ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}}}
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	d := &v1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "gold"}}
	d.Spec.NodeSelector = map[string]string{"tier": "gold"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(d).Build()
	cases := []struct {
		name     string
		old, new *corev1.Node
		want     bool
	}{
		{"relabelled out of the selector", node("tier", "gold"), node("tier", "silver"), true},
		{"given the selector's label", node(), node("tier", "gold"), true},
		{"its owner changed", node("tier", "gold", plan.LabelOwner, "a"), node("tier", "gold", plan.LabelOwner, "gold"), false},
		{"a label no CR selects by", node("tier", "gold"), node("tier", "gold", "rack", "7"), false},
		{"no label changed", node("tier", "gold"), node("tier", "gold"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hurried := false
			moves := &moveClock{}
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			labellerWakes(c, moves, func() { hurried = true }).Update(context.Background(), event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}, q)
			if hurried != tc.want {
				t.Errorf("hurried %v, want %v", hurried, tc.want)
			}
			if q.Len() != 1 {
				t.Errorf("queued %d requests, want the labeller's one", q.Len())
			}
			if _, ok := moves.take()["n1"]; !ok {
				t.Error("the update was not noted for the move clock")
			}
		})
	}
}
