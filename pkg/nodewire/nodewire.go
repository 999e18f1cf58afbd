// Package nodewire trims the Nodes of the controller's node LIST and WATCH
// responses on the wire, in protobuf, before client-go decodes them
// (docs/design.md, "Node cache"). At rest almost every event the controller
// receives is a node's status heartbeat, and decoding it was most of what
// the controller's idle CPU was spent on; the controller keeps a handful of
// a node's fields (controller.trimNode), so decoding the rest (the managed
// fields, the images, the system info, every condition but Ready) is work
// thrown away at once.
//
// What a Node keeps here is a superset of what the node cache keeps: its
// metadata but the managed fields, its spec, and the Ready condition of its
// status. Anything this package does not recognise (JSON, another kind, an
// encoded object, a frame it cannot parse) passes through untouched, so the
// worst it can do is not help.
package nodewire

import (
	"bytes"
	"encoding/binary"
	"io"
	"mime"
	"net/http"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
)

// Field numbers of the Kubernetes protobuf messages this package reads
// (k8s.io/api/core/v1 and k8s.io/apimachinery generated.proto).
const (
	watchEventObject   protowire.Number = 2 // metav1.WatchEvent.object (RawExtension)
	rawExtensionRaw    protowire.Number = 1 // runtime.RawExtension.raw
	unknownTypeMeta    protowire.Number = 1 // runtime.Unknown.typeMeta
	unknownRaw         protowire.Number = 2 // runtime.Unknown.raw
	unknownEncoding    protowire.Number = 3 // runtime.Unknown.contentEncoding
	typeMetaAPIVersion protowire.Number = 1 // runtime.TypeMeta.apiVersion
	typeMetaKind       protowire.Number = 2 // runtime.TypeMeta.kind
	listItems          protowire.Number = 2 // NodeList.items
	nodeMetadata       protowire.Number = 1 // Node.metadata
	nodeStatus         protowire.Number = 3 // Node.status
	metaManagedFields  protowire.Number = 17
	statusConditions   protowire.Number = 4
	conditionType      protowire.Number = 1
)

// protobufMagic starts every object the API server encodes in protobuf
// (runtime.Unknown follows).
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

const protobufMediaType = "application/vnd.kubernetes.protobuf"

// Transport returns rt with the Nodes of node LIST and WATCH responses in
// protobuf trimmed. Only GETs of the cluster's node collection are touched:
// a single node read (kept whole, e.g. before a write) never is.
func Transport(rt http.RoundTripper) http.RoundTripper {
	return transport{rt}
}

type transport struct{ next http.RoundTripper }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || req.Method != http.MethodGet || !isNodeCollection(req.URL.Path) {
		return resp, err
	}
	media, params, perr := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if perr != nil || media != protobufMediaType {
		return resp, nil
	}
	switch w := req.URL.Query().Get("watch"); {
	case w == "true" || w == "1":
		if params["stream"] == "watch" {
			resp.Body = &watchReader{body: resp.Body}
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	case w == "" || w == "false" || w == "0":
		return trimListResponse(resp)
	}
	return resp, nil
}

// isNodeCollection: the path of the core API's node collection, after any
// prefix the server's URL carries.
func isNodeCollection(path string) bool {
	return strings.HasSuffix(strings.TrimSuffix(path, "/"), "/api/v1/nodes")
}

// trimListResponse trims a NodeList body; on any error reading it, the
// error reaches the caller as the body's.
func trimListResponse(resp *http.Response) (*http.Response, error) {
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		return resp, nil
	}
	var t Trimmer
	if out, ok := t.Object(nil, body, "NodeList"); ok {
		body = out
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// watchReader trims each frame of a protobuf watch stream (a 4-byte
// big-endian length, then a metav1.WatchEvent) as it reads it. Its
// buffers are reused from frame to frame: a heartbeat allocates nothing
// here once they have grown.
type watchReader struct {
	body io.ReadCloser
	in   []byte // the frame read
	out  []byte // the frame to hand out, its length first
	off  int
	err  error
	t    Trimmer
	// header is read into here: a local array would escape to the heap
	// through the body's Read, once per frame.
	header [4]byte
}

func (r *watchReader) Read(p []byte) (int, error) {
	for r.off == len(r.out) {
		if r.err != nil {
			return 0, r.err
		}
		r.next()
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	return n, nil
}

// next reads one frame into out, trimmed if it can be.
func (r *watchReader) next() {
	if _, err := io.ReadFull(r.body, r.header[:]); err != nil {
		r.err = err // io.EOF between frames: the stream ended cleanly
		return
	}
	n := int(binary.BigEndian.Uint32(r.header[:]))
	if cap(r.in) < n {
		r.in = make([]byte, n)
	}
	r.in = r.in[:n]
	if _, err := io.ReadFull(r.body, r.in); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		r.err = err
		return
	}
	r.out = append(r.out[:0], 0, 0, 0, 0)
	out, ok := r.t.watchEvent(r.out, r.in)
	if !ok {
		out = append(r.out[:4], r.in...)
	}
	binary.BigEndian.PutUint32(out[:4], uint32(len(out)-4))
	r.out, r.off = out, 0
}

func (r *watchReader) Close() error { return r.body.Close() }

// Trimmer rewrites protobuf-encoded Nodes. Its scratch buffers are reused
// from call to call; it is not safe for concurrent use.
type Trimmer struct {
	node, field, unknown, ext []byte
}

// watchEvent appends to dst the metav1.WatchEvent ev with its Node
// trimmed. It returns false, and dst as it was, when ev does not carry a
// Node in protobuf or cannot be parsed.
func (t *Trimmer) watchEvent(dst, ev []byte) ([]byte, bool) {
	obj, ok := field(ev, watchEventObject)
	if !ok {
		return dst, false
	}
	raw, ok := field(obj, rawExtensionRaw)
	if !ok {
		return dst, false
	}
	unknown, ok := t.Object(t.unknown[:0], raw, "Node")
	if !ok {
		return dst, false
	}
	t.unknown = unknown
	t.ext = appendReplaced(t.ext[:0], obj, rawExtensionRaw, unknown)
	return appendReplaced(dst, ev, watchEventObject, t.ext), true
}

// Object appends to dst the encoded object obj (the protobuf magic, then a
// runtime.Unknown) with its Node, or each Node of its NodeList, trimmed;
// kind says which of the two obj must be. It returns false, and dst as it
// was, for anything else.
func (t *Trimmer) Object(dst, obj []byte, kind string) ([]byte, bool) {
	u, ok := bytes.CutPrefix(obj, protobufMagic)
	if !ok {
		return dst, false
	}
	tm, ok := field(u, unknownTypeMeta)
	if !ok {
		return dst, false
	}
	if v, _ := field(tm, typeMetaAPIVersion); string(v) != "v1" {
		return dst, false
	}
	if v, _ := field(tm, typeMetaKind); string(v) != kind {
		return dst, false
	}
	if v, _ := field(u, unknownEncoding); len(v) != 0 {
		return dst, false
	}
	raw, ok := field(u, unknownRaw)
	if !ok {
		return dst, false
	}
	var trimmed []byte
	if kind == "Node" {
		trimmed, ok = t.appendNode(t.node[:0], raw)
		if ok {
			t.node = trimmed
		}
	} else {
		// A list's items are trimmed into a buffer of their own: the
		// list is read once, the heartbeats' buffer stays small.
		trimmed, ok = t.list(raw)
	}
	if !ok {
		return dst, false
	}
	dst = append(dst, protobufMagic...)
	return appendReplaced(dst, u, unknownRaw, trimmed), true
}

// list trims each Node of a NodeList.
func (t *Trimmer) list(list []byte) ([]byte, bool) {
	out := make([]byte, 0, len(list)/2)
	var item []byte
	for b := list; len(b) > 0; {
		num, typ, v, n := next(b)
		if n < 0 {
			return nil, false
		}
		if num == listItems && typ == protowire.BytesType {
			var ok bool
			if item, ok = t.appendNode(item[:0], v); !ok {
				return nil, false
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendBytes(out, item)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out, true
}

// appendNode appends to dst the Node message node with its managed fields and
// all of its status but the Ready condition left out.
func (t *Trimmer) appendNode(dst, node []byte) ([]byte, bool) {
	for b := node; len(b) > 0; {
		num, typ, v, n := next(b)
		if n < 0 {
			return dst, false
		}
		var keep func(protowire.Number, protowire.Type, []byte) bool
		if typ == protowire.BytesType {
			switch num {
			case nodeMetadata:
				keep = notManagedFields
			case nodeStatus:
				keep = readyCondition
			}
		}
		if keep == nil {
			dst = append(dst, b[:n]...)
		} else {
			var ok bool
			if t.field, ok = appendKept(t.field[:0], v, keep); !ok {
				return dst, false
			}
			dst = protowire.AppendTag(dst, num, typ)
			dst = protowire.AppendBytes(dst, t.field)
		}
		b = b[n:]
	}
	return dst, true
}

// notManagedFields keeps every field of an ObjectMeta but its managed fields.
func notManagedFields(num protowire.Number, _ protowire.Type, _ []byte) bool {
	return num != metaManagedFields
}

// readyCondition keeps, of a NodeStatus, its Ready condition.
func readyCondition(num protowire.Number, typ protowire.Type, v []byte) bool {
	if num != statusConditions || typ != protowire.BytesType {
		return false
	}
	ct, _ := field(v, conditionType)
	return string(ct) == string(corev1.NodeReady)
}

// appendKept appends to dst the fields of msg that keep keeps.
func appendKept(dst, msg []byte, keep func(protowire.Number, protowire.Type, []byte) bool) ([]byte, bool) {
	for len(msg) > 0 {
		num, typ, v, n := next(msg)
		if n < 0 {
			return dst, false
		}
		if keep(num, typ, v) {
			dst = append(dst, msg[:n]...)
		}
		msg = msg[n:]
	}
	return dst, true
}

// next parses the field at the start of b: its number, type, value (for a
// length-delimited field, the bytes inside) and the whole field's length,
// negative when b does not start with a valid field.
func next(b []byte) (protowire.Number, protowire.Type, []byte, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, -1
	}
	m := protowire.ConsumeFieldValue(num, typ, b[n:])
	if m < 0 {
		return 0, 0, nil, -1
	}
	var v []byte
	if typ == protowire.BytesType {
		v, _ = protowire.ConsumeBytes(b[n:])
	}
	return num, typ, v, n + m
}

// field is the value of the last length-delimited field num of msg (the
// last wins, as in decoding).
func field(msg []byte, num protowire.Number) ([]byte, bool) {
	var out []byte
	found := false
	for len(msg) > 0 {
		fnum, typ, v, n := next(msg)
		if n < 0 {
			return nil, false
		}
		if fnum == num && typ == protowire.BytesType {
			out, found = v, true
		}
		msg = msg[n:]
	}
	return out, found
}

// appendReplaced appends msg to dst with its length-delimited field num
// replaced by value (msg is known to parse: field read it).
func appendReplaced(dst, msg []byte, num protowire.Number, value []byte) []byte {
	for len(msg) > 0 {
		fnum, typ, _, n := next(msg)
		if fnum == num && typ == protowire.BytesType {
			dst = protowire.AppendTag(dst, num, typ)
			dst = protowire.AppendBytes(dst, value)
		} else {
			dst = append(dst, msg[:n]...)
		}
		msg = msg[n:]
	}
	return dst
}
