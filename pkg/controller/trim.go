package controller

import (
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	out := &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: intern(n.Name), UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: internLabels(n.Labels),
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
		},
		Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
	}
	for k, v := range n.Annotations {
		if isOurAnnotation(k) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
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
