package nodewire

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restwatch "k8s.io/client-go/rest/watch"
)

var (
	objectCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	rawCodec    = protobuf.NewRawSerializer(scheme.Scheme, scheme.Scheme)
)

// fullNode has something in every part of a node the trimming drops or
// keeps, as a kubelet and the managers that write a node fill it.
func fullNode(name string) *corev1.Node {
	t0 := metav1.NewTime(time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC))
	return &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: "uid-" + "1", ResourceVersion: "42", Generation: 3, CreationTimestamp: t0,
			Labels:      map[string]string{"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
			Annotations: map[string]string{"nvidia.com/gpu-driver-upgrade-state.move-to": "a", "node.alpha.kubernetes.io/ttl": "0"},
			Finalizers:  []string{"x/y"},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &t0,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{}}}`)}, Subresource: "status",
			}},
		},
		Spec: corev1.NodeSpec{
			PodCIDR: "10.0.0.0/24", ProviderID: "kwok://" + name, Unschedulable: true,
			Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastHeartbeatTime: t0, Reason: "KubeletHasSufficientMemory"},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: t0, LastTransitionTime: t0, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse},
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
			NodeInfo:  corev1.NodeSystemInfo{KernelVersion: "5.15.0-84-generic", OSImage: "Ubuntu 22.04"},
			Images:    []corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/driver:550.90.07-ubuntu22.04"}, SizeBytes: 1 << 30}},
		},
	}
}

// trimmedNode is what the trimming must leave of fullNode(name).
func trimmedNode(name string) *corev1.Node {
	n := fullNode(name)
	n.ManagedFields = nil
	n.Status = corev1.NodeStatus{Conditions: []corev1.NodeCondition{n.Status.Conditions[1]}}
	return n
}

func encode(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := objectCodec.Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func decodeNode(t *testing.T, b []byte) *corev1.Node {
	t.Helper()
	obj, _, err := objectCodec.Decode(b, nil, nil)
	if err != nil {
		t.Fatalf("decoding the trimmed node: %v", err)
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		t.Fatalf("decoded a %T", obj)
	}
	return n
}

func TestObjectTrimsANode(t *testing.T) {
	cases := map[string]struct {
		in, want *corev1.Node
	}{
		"everything filled": {fullNode("a"), trimmedNode("a")},
		"no Ready condition": {
			func() *corev1.Node { n := fullNode("b"); n.Status.Conditions = n.Status.Conditions[:1]; return n }(),
			func() *corev1.Node { n := trimmedNode("b"); n.Status.Conditions = nil; return n }(),
		},
		"no status, no managed fields": {
			func() *corev1.Node {
				n := fullNode("c")
				n.Status = corev1.NodeStatus{}
				n.ManagedFields = nil
				return n
			}(),
			func() *corev1.Node { n := trimmedNode("c"); n.Status = corev1.NodeStatus{}; return n }(),
		},
		// A watch-list's bookmark: only the resourceVersion and the
		// annotation that ends the initial events.
		"a bookmark": {
			&corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7", Annotations: map[string]string{"k8s.io/initial-events-end": "true"}}},
			&corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7", Annotations: map[string]string{"k8s.io/initial-events-end": "true"}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			full := encode(t, tc.in)
			var tr Trimmer
			out, ok := tr.Object(nil, full, "Node")
			if !ok {
				t.Fatal("a protobuf Node was not trimmed")
			}
			got := decodeNode(t, out)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("trimmed node (-want +got):\n%s", d)
			}
			if tc.in.ManagedFields != nil && len(out) >= len(full) {
				t.Errorf("trimmed %d bytes into %d", len(full), len(out))
			}
			// The scratch buffers are reused: a second node through the
			// same Trimmer comes out as whole as the first.
			again, _ := tr.Object(nil, encode(t, fullNode("z")), "Node")
			if d := cmp.Diff(trimmedNode("z"), decodeNode(t, again)); d != "" {
				t.Errorf("second node through the same Trimmer (-want +got):\n%s", d)
			}
		})
	}
}

func TestObjectLeavesOtherObjectsAlone(t *testing.T) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Message: "too old resource version", Code: 410}
	node := encode(t, fullNode("a"))
	for name, b := range map[string][]byte{
		"a pod":                          encode(t, pod),
		"a Status (a watch's error)":     encode(t, status),
		"JSON":                           []byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"a"}}`),
		"truncated":                      node[:len(node)/2],
		"a node asked for as a list":     node,
		"garbage after the magic":        append(append([]byte{}, protobufMagic...), 0xff, 0xff, 0xff),
		"nothing":                        nil,
		"a node with a content encoding": encodedWith(t, node, "gzip"),
	} {
		t.Run(name, func(t *testing.T) {
			kind := "Node"
			if name == "a node asked for as a list" {
				kind = "NodeList"
			}
			dst := []byte("kept")
			var tr Trimmer
			out, ok := tr.Object(dst, b, kind)
			if ok || string(out) != "kept" {
				t.Errorf("Object = %q, %v; want dst untouched and false", out, ok)
			}
		})
	}
}

// encodedWith is node's envelope claiming its raw bytes are encoded.
func encodedWith(t *testing.T, node []byte, enc string) []byte {
	t.Helper()
	u := runtime.Unknown{}
	if err := u.Unmarshal(node[len(protobufMagic):]); err != nil {
		t.Fatal(err)
	}
	u.ContentEncoding = enc
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(append([]byte{}, protobufMagic...), b...)
}

// watchStream is a protobuf watch response body as the API server writes
// it: each event framed by its length, its object encoded in protobuf.
func watchStream(t *testing.T, events ...watch.Event) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := streaming.NewEncoder(protobuf.LengthDelimitedFramer.NewFrameWriter(&b), rawCodec)
	for _, ev := range events {
		if err := enc.Encode(&metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: encode(t, ev.Object)}}); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// decodeStream decodes body as client-go's watch does.
func decodeStream(body io.ReadCloser) ([]watch.Event, error) {
	dec := restwatch.NewDecoder(streaming.NewDecoder(protobuf.LengthDelimitedFramer.NewFrameReader(body), rawCodec), objectCodec)
	var out []watch.Event
	for {
		typ, obj, err := dec.Decode()
		if err != nil {
			return out, err
		}
		out = append(out, watch.Event{Type: typ, Object: obj})
	}
}

func TestWatchReaderTrimsEachNodeEvent(t *testing.T) {
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Message: "too old resource version", Code: 410}
	bookmark := &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9", Annotations: map[string]string{"k8s.io/initial-events-end": "true"}}}
	in := []watch.Event{
		{Type: watch.Added, Object: fullNode("a")},
		{Type: watch.Modified, Object: fullNode("b")},
		{Type: watch.Bookmark, Object: bookmark},
		{Type: watch.Deleted, Object: fullNode("a")},
		{Type: watch.Error, Object: status},
	}
	want := []watch.Event{
		{Type: watch.Added, Object: trimmedNode("a")},
		{Type: watch.Modified, Object: trimmedNode("b")},
		{Type: watch.Bookmark, Object: bookmark},
		{Type: watch.Deleted, Object: trimmedNode("a")},
		{Type: watch.Error, Object: status},
	}
	body := watchStream(t, in...)
	r := &watchReader{body: io.NopCloser(bytes.NewReader(body))}
	got, err := decodeStream(r)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("the stream ended with %v, want io.EOF", err)
	}
	for i := range got {
		got[i].Object.GetObjectKind().SetGroupVersionKind(want[i].Object.GetObjectKind().GroupVersionKind())
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}

	// Cut short inside a frame, the stream says so, after the whole frames.
	cut := &watchReader{body: io.NopCloser(bytes.NewReader(body[:len(body)-3]))}
	got, err = decodeStream(cut)
	if err == nil || errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a stream cut inside a frame ended with %v, want an unexpected EOF", err)
	}
	if len(got) != len(in)-1 {
		t.Errorf("%d events before the cut, want %d", len(got), len(in)-1)
	}
}

// The trimming allocates nothing for a heartbeat once its buffers grew.
func TestWatchReaderHeartbeatAllocatesNothing(t *testing.T) {
	frame := watchStream(t, watch.Event{Type: watch.Modified, Object: fullNode("a")})
	src := bytes.NewReader(frame)
	r := &watchReader{body: io.NopCloser(src)}
	buf := make([]byte, 64<<10)
	read := func() {
		src.Reset(frame)
		r.err, r.off, r.out = nil, 0, r.out[:0]
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Errorf("a heartbeat's frame allocated %.0f objects, want 0", n)
	}
}

type respond func(*http.Request) *http.Response

func (f respond) RoundTrip(r *http.Request) (*http.Response, error) { return f(r), nil }

func TestTransportTrimsOnlyNodeCollections(t *testing.T) {
	node := encode(t, fullNode("a"))
	list := encode(t, &corev1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}, ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []corev1.Node{*fullNode("a"), *fullNode("b")}})
	stream := watchStream(t, watch.Event{Type: watch.Modified, Object: fullNode("a")})
	const watchType = "application/vnd.kubernetes.protobuf;stream=watch"
	cases := []struct {
		name, path, query, contentType string
		body                           []byte
		trimmed                        bool
	}{
		{"a node list", "/api/v1/nodes", "limit=500", protobufMediaType, list, true},
		{"a node list behind a path prefix", "/k8s/clusters/c-1/api/v1/nodes", "", protobufMediaType, list, true},
		{"a node watch", "/api/v1/nodes", "watch=true&resourceVersion=5", watchType, stream, true},
		{"one node", "/api/v1/nodes/a", "", protobufMediaType, node, false},
		{"a node list in JSON", "/api/v1/nodes", "", "application/json", []byte(`{"kind":"NodeList"}`), false},
		{"a pod watch", "/api/v1/pods", "watch=true", watchType, stream, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := Transport(respond(func(*http.Request) *http.Response {
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {tc.contentType}}, Body: io.NopCloser(bytes.NewReader(tc.body)), ContentLength: int64(len(tc.body))}
			}))
			req := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: tc.path, RawQuery: tc.query}}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.trimmed {
				if !bytes.Equal(got, tc.body) {
					t.Error("the body was changed")
				}
				return
			}
			if len(got) >= len(tc.body) {
				t.Errorf("the body was not trimmed: %d bytes, %d before", len(got), len(tc.body))
			}
			if resp.ContentLength >= 0 && resp.ContentLength != int64(len(got)) {
				t.Errorf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(got))
			}
			if tc.query == "limit=500" || tc.query == "" {
				obj, _, err := objectCodec.Decode(got, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				l := obj.(*corev1.NodeList)
				l.TypeMeta = metav1.TypeMeta{}
				want := &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []corev1.Node{*trimmedNode("a"), *trimmedNode("b")}}
				for i := range want.Items {
					want.Items[i].TypeMeta = metav1.TypeMeta{}
				}
				if d := cmp.Diff(want, l); d != "" {
					t.Errorf("list (-want +got):\n%s", d)
				}
			}
		})
	}
}
