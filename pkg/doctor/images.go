package doctor

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// checkImages: does each pool's image exist in its registry? From the
// registry's answers when doctor asked (Snapshot.ImagePlan), else from the
// controller's ImageAvailable condition.
func checkImages(s *Snapshot, _ *plan.Plan) []Finding {
	if s.ImagePlan == nil {
		return imagesFromConditions(s)
	}
	var out []Finding
	for _, d := range s.ImagePlan.Drivers {
		if !s.wants(d.Name) {
			continue
		}
		obj := []string{"nvidiadriver/" + d.Name}
		seen := map[string]bool{}
		for _, pool := range d.Pools {
			for _, c := range pool.ImageCheck {
				if seen[c.Image] {
					continue
				}
				seen[c.Image] = true
				switch c.Status {
				case plan.ImageStatusMissing:
					why := ""
					if c.Message != "" && c.Message != "not found in the registry" {
						why = " (" + c.Message + ")"
					}
					out = append(out, Finding{Severity: Error, Objects: append(obj, nodeObjs(first(pool.Nodes, 10))...),
						Message: fmt.Sprintf("%s: image %s is not in the registry%s: %s's %d node(s) cannot run it; under imageCheck=enforce (the default) the controller rolls none of them onto it until it exists; push the image, or choose a version that exists", d.Name, c.Image, why, pool.DaemonSet, len(pool.Nodes)),
						Fix:     "kubectl nvdriver preview " + d.Name})
				case plan.ImageStatusUnknown:
					out = append(out, Finding{Severity: Warning, Objects: obj,
						Message: fmt.Sprintf("%s: could not check image %s from here (%s: %s); %s", d.Name, c.Image, c.Reason, c.Message, unknownAdvice(c.Reason))})
				}
			}
		}
		for _, k := range d.KernelImages {
			if k.Check.Status != plan.ImageStatusMissing || k.Selected > 0 {
				continue // a selected kernel's pool is reported above
			}
			out = append(out, Finding{Severity: Warning, Objects: obj,
				Message: fmt.Sprintf("%s: no precompiled image for kernel %s on %s (%s): %d GPU node(s) run that kernel; moved to this driver, they would wait for the image", d.Name, k.Kernel, k.OSTag, k.Check.Image, k.Nodes),
				Fix:     "kubectl nvdriver preview " + d.Name})
		}
	}
	return out
}

func imagesFromConditions(s *Snapshot) []Finding {
	var out []Finding
	for _, d := range s.Drivers {
		if !s.wants(d.Name) {
			continue
		}
		c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionImageAvailable)
		switch {
		case c == nil || c.Status == metav1.ConditionTrue:
		case c.Status == metav1.ConditionFalse:
			out = append(out, Finding{Severity: Error, Objects: []string{"nvidiadriver/" + d.Name}, Message: d.Name + ": " + c.Message + "; push the image, or choose a version that exists",
				Fix: "kubectl nvdriver preview " + d.Name})
		default:
			out = append(out, Finding{Severity: Warning, Objects: []string{"nvidiadriver/" + d.Name}, Message: d.Name + ": the controller " + lowerFirst(c.Message),
				Fix: "kubectl describe nvidiadriver " + d.Name})
		}
	}
	return out
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]|0x20) + s[1:]
}

// unknownAdvice is what to do about a check that got no answer, by reason.
func unknownAdvice(reason string) string {
	switch reason {
	case v1alpha1.ReasonRegistryAuthFailed:
		return "log in to the registry (docker login) or check the NVIDIADriver's imagePullSecrets; --check-images=false skips this check"
	case v1alpha1.ReasonRegistryUnreachable:
		return "the registry cannot be reached from this machine (it may still be from the nodes); --check-images=false skips this check"
	case v1alpha1.ReasonInvalidReference:
		return "the image reference does not parse: check spec.repository, spec.image and spec.version"
	}
	return "the registry answered with an error; try again later, or --check-images=false skips this check"
}
