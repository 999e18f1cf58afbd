package controller

import (
	"maps"
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nvdriver/nvdriver/pkg/render"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// The cache's transforms (CacheOptions): what the controller keeps of each
// node, driver pod and revision it watches (docs/design.md, "Node cache").

// trimRevision keeps a ControllerRevision's name, owner, labels and number.
func trimRevision(obj any) (any, error) {
	cr, ok := obj.(*appsv1.ControllerRevision)
	if !ok {
		return obj, nil
	}
	return &appsv1.ControllerRevision{TypeMeta: cr.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: cr.Name, Namespace: intern(cr.Namespace), UID: cr.UID, ResourceVersion: cr.ResourceVersion, Labels: internLabels(cr.Labels),
		OwnerReferences: internOwners(cr.OwnerReferences)}, Revision: cr.Revision}, nil
}

// trimNode drops everything of a Node the controller never reads.
func trimNode(obj any) (any, error) { return nodeTrim{}.trim(obj) }

// nodeTrim is trimNode sharing with the node's cached version what is
// unchanged (docs/design.md, "Node cache"): most node events are status
// heartbeats, which change nothing the cache keeps but the
// resourceVersion, and each allocated a node's labels and annotations
// afresh, a tenth of what the controller allocates at rest. The cached
// objects are never modified (cachedReads), so a map or slice may be
// shared by the old and the new version. Without a store it is trimNode.
type nodeTrim struct{ cached toolscache.Store }

func (t nodeTrim) trim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	var old *corev1.Node
	if t.cached != nil {
		if o, exists, err := t.cached.GetByKey(n.Name); err == nil && exists {
			if o, ok := o.(*corev1.Node); ok && o.UID == n.UID {
				old = o
			}
		}
	}
	out := &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			UID: n.UID, ResourceVersion: n.ResourceVersion,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
		},
		Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
	}
	if old != nil {
		out.Name = old.Name
	} else {
		out.Name = intern(n.Name)
	}
	if old != nil && maps.Equal(old.Labels, n.Labels) {
		out.Labels = old.Labels
	} else {
		out.Labels = internLabels(n.Labels)
	}
	if old != nil && ourAnnotationsEqual(n.Annotations, old.Annotations) {
		out.Annotations = old.Annotations
	} else {
		for k, v := range n.Annotations {
			if isOurAnnotation(k) {
				if out.Annotations == nil {
					out.Annotations = map[string]string{}
				}
				out.Annotations[k] = v
			}
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if old != nil && len(old.Status.Conditions) == 1 && old.Status.Conditions[0].Status == c.Status {
			out.Status.Conditions = old.Status.Conditions
		} else {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
}

// ourAnnotationsEqual: full (a decoded node's annotations) holds exactly
// the annotations of ours that kept (a trimmed node's) holds.
func ourAnnotationsEqual(full, kept map[string]string) bool {
	n := 0
	for k, v := range full {
		if isOurAnnotation(k) {
			if w, ok := kept[k]; !ok || w != v {
				return false
			}
			n++
		}
	}
	return n == len(kept)
}

// trimPod keeps of a driver pod what the upgrade machine and the node
// labeller read, as a driverPod: identity, labels, owner, node, phase,
// readiness, the most restarts of a container, and the driver's config
// digest (for a restart-only change, docs/design.md, "Rollouts"). A driver
// pod's spec (containers, volumes, env) is most of its size, and there is
// one per GPU node.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &driverPod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: intern(p.Namespace), UID: p.UID, ResourceVersion: p.ResourceVersion, Labels: internLabels(p.Labels),
			OwnerReferences: internOwners(p.OwnerReferences), CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		},
		NodeName: intern(p.Spec.NodeName),
		Phase:    p.Status.Phase,
		Ready:    podIsReady(p),
		Digest:   intern(render.PodConfigDigest(&p.Spec)),
	}
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range statuses {
			out.Restarts = max(out.Restarts, statuses[i].RestartCount)
		}
	}
	return out, nil
}

// intern returns the one shared copy of s. A decoded object holds its own
// copy of every string, and thousands of cached nodes and driver pods carry
// the same few dozen label keys and values, namespace and owners, and a
// node's name three times (its name, its hostname label, its driver pod's
// node): shared, they are a tenth of the live heap less at 5,000 nodes
// (docs/design.md, "Node cache"). Not the unique package: it forgets a
// string once no handle is held, though objects still hold its value, and
// the next decode would start a second copy.
func intern(s string) string {
	interned.Lock()
	defer interned.Unlock()
	return internLocked(s)
}

// internLocked is intern with the pool's lock held: a transform takes it
// once per object, not once per string.
func internLocked(s string) string {
	if s == "" {
		return s
	}
	if c, ok := interned.m[s]; ok {
		return c
	}
	// Bounded: a pool that only grows would keep the names of nodes long
	// gone. Emptied, it starts again; objects keep the copies they hold.
	if len(interned.m) >= internMax {
		clear(interned.m)
	}
	interned.m[s] = s
	return s
}

// internMax bounds the pool: a 5,000-node cluster interns about 5,300
// strings (a name per node, the rest shared).
const internMax = 1 << 15

var interned = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// internLabels copies a label map with its keys and values interned.
func internLabels(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	interned.Lock()
	defer interned.Unlock()
	for k, v := range m {
		out[internLocked(k)] = internLocked(v)
	}
	return out
}

// internOwners interns the owner references' strings in place: every
// driver pod of a DaemonSet names the same owner.
func internOwners(refs []metav1.OwnerReference) []metav1.OwnerReference {
	interned.Lock()
	defer interned.Unlock()
	for i := range refs {
		r := &refs[i]
		r.APIVersion, r.Kind, r.Name, r.UID = internLocked(r.APIVersion), internLocked(r.Kind), internLocked(r.Name), types.UID(internLocked(string(r.UID)))
	}
	return refs
}

func isOurAnnotation(k string) bool { return slices.Contains(upgrade.NodeAnnotations, k) }
