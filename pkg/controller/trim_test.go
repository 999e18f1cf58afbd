package controller

import (
	"bytes"
	"reflect"
	"strconv"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/randfill"

	"github.com/nvdriver/nvdriver/pkg/nodewire"
	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// decoded returns obj as the informer would hand it to the transform: a
// fresh protobuf decode (the controller's wire format), every string its own
// copy.
func decoded[T runtime.Object](t testing.TB, obj T) T {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	codec := serializer.NewCodecFactory(scheme).CodecForVersions(protobuf.NewSerializer(scheme, scheme), protobuf.NewSerializer(scheme, scheme), corev1.SchemeGroupVersion, corev1.SchemeGroupVersion)
	b, err := runtime.Encode(codec, obj)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runtime.Decode(codec, b)
	if err != nil {
		t.Fatal(err)
	}
	return out.(T)
}

func sameBytes(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// Two nodes or two driver pods decoded apart keep one copy of the strings
// they share once trimmed (docs/design.md, "Node cache"), and keep every
// value the controller reads.
func TestTrimSharesStrings(t *testing.T) {
	node := func(name string) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7", Labels: map[string]string{
				"feature.node.kubernetes.io/system-os_release.ID": "ubuntu", "nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
				Annotations: map[string]string{"someone.else/note": "dropped"}},
			Spec:   corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
	}
	a, err := trimNode(decoded(t, node("gpu-1")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := trimNode(decoded(t, node("gpu-2")))
	na, nb := a.(*corev1.Node), b.(*corev1.Node)
	if got := na.Labels["kubernetes.io/hostname"]; got != "gpu-1" || len(na.Labels) != 3 || !na.Spec.Unschedulable || len(na.Spec.Taints) != 1 ||
		len(na.Annotations) != 0 || len(na.Status.Conditions) != 1 || na.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Fatalf("trimmed node lost or kept the wrong fields: %+v", na)
	}
	for k, v := range na.Labels {
		if k == "kubernetes.io/hostname" {
			continue
		}
		var kb string
		for k2 := range nb.Labels {
			if k2 == k {
				kb = k2
			}
		}
		if !sameBytes(k, kb) || !sameBytes(v, nb.Labels[k]) {
			t.Errorf("label %s=%s: two copies, want one shared", k, v)
		}
	}

	pod := func(name, nodeName string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-operator", Labels: map[string]string{"app": "nvidia-gpu-driver-ubuntu22.04", "controller-revision-hash": "5f7d"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "nvidia-gpu-driver-ubuntu22.04-abc", UID: "u-1", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Image: "nvcr.io/nvidia/driver:550",
				Env: []corev1.EnvVar{{Name: render.ConfigDigestEnv, Value: "d1"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				Conditions:            []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}},
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "k8s-driver-manager", RestartCount: 3}},
				ContainerStatuses:     []corev1.ContainerStatus{{Name: "nvidia-driver-ctr", RestartCount: 2, Ready: true}}},
		}
	}
	pa, _ := trimPod(decoded(t, pod("p-1", "gpu-1")))
	pb, _ := trimPod(decoded(t, pod("p-2", "gpu-2")))
	ppa, ppb := pa.(*driverPod), pb.(*driverPod)
	ref := metav1.GetControllerOfNoCopy(ppa)
	if ref == nil || ref.UID != "u-1" || ppa.NodeName != "gpu-1" || ppa.Restarts != 3 || !ppa.Ready || ppa.Phase != corev1.PodRunning ||
		ppa.Digest != "d1" || ppa.Namespace != "gpu-operator" || ppa.Name != "p-1" {
		t.Fatalf("trimmed pod lost what the upgrade machine reads: %+v", ppa)
	}
	if c := ppa.DeepCopyObject().(*driverPod); c == ppa || c.Labels["app"] != ppa.Labels["app"] || c.Restarts != 3 {
		t.Errorf("DeepCopyObject: %+v", c)
	} else if c.Labels["app"] = "changed"; ppa.Labels["app"] == "changed" {
		t.Error("DeepCopyObject shares the labels")
	}
	if ref := ppa.podRef(); ref.Name != "p-1" || ref.Namespace != "gpu-operator" || ref.UID != ppa.UID {
		t.Errorf("podRef: %+v", ref.ObjectMeta)
	}
	if !sameBytes(ppa.Namespace, ppb.Namespace) || !sameBytes(ppa.Labels["app"], ppb.Labels["app"]) ||
		!sameBytes(ppa.OwnerReferences[0].Name, ppb.OwnerReferences[0].Name) || !sameBytes(string(ppa.OwnerReferences[0].UID), string(ppb.OwnerReferences[0].UID)) {
		t.Error("two driver pods of one DaemonSet keep two copies of their namespace, labels or owner")
	}
	// A node and the pod on it share the node's name.
	if !sameBytes(na.Name, ppa.NodeName) || !sameBytes(ppa.Digest, ppb.Digest) {
		t.Error("a driver pod keeps its own copy of its node's name or of its config digest")
	}
}

// A node event trimmed against the node's cached version shares with it
// what did not change, so a status heartbeat allocates one Node and no
// maps; anything the cache keeps that changed is the new value, and the
// cached version is left as it was (docs/design.md, "Node cache").
func TestNodeTrimSharesWhatDidNotChange(t *testing.T) {
	full := func(edit func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", UID: "u1", ResourceVersion: "1",
				Labels:      map[string]string{"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": "gpu-1"},
				Annotations: map[string]string{upgrade.AnnotationStateSince: "t0", "someone.else/note": "a"}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastHeartbeatTime: metav1.Unix(100, 0)},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Unix(100, 0)}}},
		}
		if edit != nil {
			edit(n)
		}
		return decoded(t, n)
	}
	store := toolscache.NewStore(toolscache.MetaNamespaceKeyFunc)
	trim := nodeTrim{cached: store}
	first, err := trim.trim(full(nil))
	if err != nil {
		t.Fatal(err)
	}
	cached := first.(*corev1.Node)
	if err := store.Add(cached); err != nil {
		t.Fatal(err)
	}
	samePtr := func(a, b any) bool { return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer() }
	heartbeat := func(n *corev1.Node) {
		n.ResourceVersion = "2"
		n.Status.Conditions[1].LastHeartbeatTime = metav1.Unix(400, 0)
		n.Annotations["someone.else/note"] = "b" // not ours: not kept
	}

	cases := []struct {
		name                       string
		edit                       func(*corev1.Node)
		labels, annotations, ready bool // shared with the cached version
		check                      func(*corev1.Node) bool
	}{
		{"a heartbeat", heartbeat, true, true, true,
			func(n *corev1.Node) bool { return n.ResourceVersion == "2" }},
		{"a label changed", func(n *corev1.Node) { heartbeat(n); n.Labels["pool"] = "gold" }, false, true, true,
			func(n *corev1.Node) bool { return n.Labels["pool"] == "gold" && len(n.Labels) == 3 }},
		{"a label removed", func(n *corev1.Node) { heartbeat(n); delete(n.Labels, "nvidia.com/gpu.present") }, false, true, true,
			func(n *corev1.Node) bool {
				_, ok := n.Labels["nvidia.com/gpu.present"]
				return !ok && len(n.Labels) == 1
			}},
		{"one of our annotations changed", func(n *corev1.Node) { heartbeat(n); n.Annotations[upgrade.AnnotationStateSince] = "t1" }, true, false, true,
			func(n *corev1.Node) bool {
				return n.Annotations[upgrade.AnnotationStateSince] == "t1" && len(n.Annotations) == 1
			}},
		{"one of our annotations added", func(n *corev1.Node) { heartbeat(n); n.Annotations[upgrade.AnnotationMoveTo] = "gold" }, true, false, true,
			func(n *corev1.Node) bool {
				return n.Annotations[upgrade.AnnotationMoveTo] == "gold" && len(n.Annotations) == 2
			}},
		{"one of our annotations removed", func(n *corev1.Node) { heartbeat(n); delete(n.Annotations, upgrade.AnnotationStateSince) }, true, false, true,
			func(n *corev1.Node) bool { return len(n.Annotations) == 0 }},
		{"not ready", func(n *corev1.Node) { heartbeat(n); n.Status.Conditions[1].Status = corev1.ConditionFalse }, true, true, false,
			func(n *corev1.Node) bool { return !nodeReady(n) }},
		{"the node made again under its name", func(n *corev1.Node) { heartbeat(n); n.UID = "u2" }, false, false, false,
			func(n *corev1.Node) bool { return n.UID == "u2" && nodeReady(n) && len(n.Labels) == 2 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := trim.trim(full(c.edit))
			if err != nil {
				t.Fatal(err)
			}
			n := out.(*corev1.Node)
			if n == cached || !c.check(n) {
				t.Fatalf("trimmed: %+v", n)
			}
			if got := samePtr(n.Labels, cached.Labels); got != c.labels {
				t.Errorf("labels shared: %v, want %v", got, c.labels)
			}
			if got := samePtr(n.Annotations, cached.Annotations); got != c.annotations {
				t.Errorf("annotations shared: %v, want %v", got, c.annotations)
			}
			if got := samePtr(n.Status.Conditions, cached.Status.Conditions); got != c.ready {
				t.Errorf("Ready condition shared: %v, want %v", got, c.ready)
			}
			if !sameBytes(n.Name, cached.Name) {
				t.Error("the node's name: a copy of its own, want the cached one's")
			}
			if cached.ResourceVersion != "1" || len(cached.Labels) != 2 || len(cached.Annotations) != 1 || cached.Annotations[upgrade.AnnotationStateSince] != "t0" || !nodeReady(cached) {
				t.Fatalf("the cached version changed: %+v", cached)
			}
		})
	}

	// What a heartbeat costs the transform: the Node and nothing else.
	hb := full(heartbeat)
	if allocs := testing.AllocsPerRun(100, func() { _, _ = trim.trim(hb) }); allocs != 1 {
		t.Errorf("a heartbeat allocates %v objects in the transform, want 1 (the Node)", allocs)
	}
}

// The wire trimming (nodewire) must keep everything trimNode keeps: the
// cache holds the same node whether the event was trimmed on the wire or
// not. Random nodes, every field filled, through both paths.
func TestWireTrimKeepsWhatTheCacheKeeps(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	codec := protobuf.NewSerializer(scheme, scheme)
	f := randfill.NewWithSeed(16).NilChance(0.2).NumElements(0, 4).Funcs(
		// The random Quantities and FieldsV1 are not what an API server
		// encodes (and do not survive a round trip); what matters here is
		// that they are present and dropped.
		func(q *resource.Quantity, c randfill.Continue) { *q = resource.MustParse(strconv.Itoa(c.Intn(64))) },
		func(fv *metav1.FieldsV1, c randfill.Continue) { fv.Raw = []byte(`{"f:status":{}}`) },
		func(tm *metav1.Time, c randfill.Continue) { *tm = metav1.Unix(c.Int63n(1<<31), 0) },
	)
	var tr nodewire.Trimmer
	for i := range 300 {
		n := &corev1.Node{}
		f.Fill(n)
		n.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
		if i%2 == 0 { // half of them Ready, as the trimming looks for it by name
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionUnknown}[i%3]})
		}
		var full bytes.Buffer
		if err := codec.Encode(n, &full); err != nil {
			t.Fatal(err)
		}
		wire, ok := tr.Object(nil, full.Bytes(), "Node")
		if !ok {
			t.Fatalf("node %d: not trimmed", i)
		}
		if len(n.ManagedFields)+len(n.Status.Images) > 0 && len(wire) >= full.Len() {
			t.Errorf("node %d: %d bytes trimmed into %d", i, full.Len(), len(wire))
		}
		whole, _, err := codec.Decode(full.Bytes(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cut, _, err := codec.Decode(wire, nil, nil)
		if err != nil {
			t.Fatalf("node %d: decoding the trimmed node: %v", i, err)
		}
		want, _ := trimNode(whole)
		got, _ := trimNode(cut)
		if !equality.Semantic.DeepEqual(want, got) {
			t.Fatalf("node %d: the cache would keep\n%+v\nwhen trimmed on the wire, not\n%+v", i, got, want)
		}
	}
}
