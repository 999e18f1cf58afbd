package controller

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// defaultRevisionHistoryLimit is how many revisions older than the newest are kept.
const defaultRevisionHistoryLimit = 10

// RevisionName is the ControllerRevision of a CR's revision hash.
func RevisionName(driver, hash string) string {
	if len(driver) > 200 {
		driver = driver[:200]
	}
	return driver + "-" + hash
}

// recordRevision keeps the spec that just rolled out to every node as a
// ControllerRevision owned by the CR, numbered after the newest (a revision
// rolled out again, after an undo, is renumbered as DaemonSets do), and
// prunes the oldest beyond revisionHistoryLimit. Read uncached: it runs once
// per completed rollout.
func (r *UpgradeReconciler) recordRevision(ctx context.Context, d *v1alpha1.NVIDIADriver, st v1alpha1.RolloutStatus) error {
	list := &appsv1.ControllerRevisionList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(r.Options.Namespace), client.MatchingLabels{v1alpha1.RevisionLabel: d.Name}); err != nil {
		return fmt.Errorf("listing revisions: %w", err)
	}
	var mine []appsv1.ControllerRevision
	newest := int64(0)
	for _, cr := range list.Items {
		if ref := metav1.GetControllerOf(&cr); ref == nil || ref.UID != d.UID {
			continue // a CR of the same name before this one
		}
		mine = append(mine, cr)
		newest = max(newest, cr.Revision)
	}
	data, hash := upgrade.RevisionOf(&d.Spec)
	name := RevisionName(d.Name, hash)
	ann := map[string]string{
		v1alpha1.RevisionStartedAnnotation:   st.StartedAt.UTC().Format(time.RFC3339),
		v1alpha1.RevisionCompletedAnnotation: time.Now().UTC().Format(time.RFC3339),
		v1alpha1.RevisionNodesAnnotation:     strconv.Itoa(int(st.Total)),
		v1alpha1.RevisionImagesAnnotation:    driverImages(d),
	}
	if st.CompletedAt != nil {
		ann[v1alpha1.RevisionCompletedAnnotation] = st.CompletedAt.UTC().Format(time.RFC3339)
	}
	var cur *appsv1.ControllerRevision
	for i := range mine {
		if mine[i].Name == name {
			cur = &mine[i]
		}
	}
	if cur == nil {
		cr := &appsv1.ControllerRevision{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Options.Namespace, Labels: map[string]string{v1alpha1.RevisionLabel: d.Name},
				Annotations: ann, OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, v1alpha1.GroupVersion.WithKind("NVIDIADriver"))}},
			Data:     runtime.RawExtension{Raw: data},
			Revision: newest + 1,
		}
		if err := r.Client.Create(ctx, cr, client.FieldOwner(FieldManager)); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("recording revision %s: %w", name, err)
		}
		mine = append(mine, *cr)
	} else {
		patch := client.MergeFrom(cur.DeepCopy())
		if cur.Revision < newest {
			cur.Revision = newest + 1
		}
		for k, v := range ann {
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[k] = v
		}
		if err := r.Client.Patch(ctx, cur, patch, client.FieldOwner(FieldManager)); err != nil {
			return fmt.Errorf("renumbering revision %s: %w", name, err)
		}
	}
	limit := defaultRevisionHistoryLimit
	if up := d.Spec.UpgradePolicy; up != nil && up.RevisionHistoryLimit != nil {
		limit = int(*up.RevisionHistoryLimit)
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].Revision > mine[j].Revision })
	for i := range mine {
		if i <= limit || mine[i].Name == name {
			continue
		}
		if err := r.Client.Delete(ctx, &mine[i], client.Preconditions{UID: &mine[i].UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("pruning revision %s: %w", mine[i].Name, err)
		}
	}
	return nil
}

// driverImages are the driver images of the CR's pools, for the history.
func driverImages(d *v1alpha1.NVIDIADriver) string {
	seen := map[string]bool{}
	var out []string
	for _, p := range d.Status.Pools {
		if p.Image != "" && !seen[p.Image] {
			seen[p.Image] = true
			out = append(out, p.Image)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
