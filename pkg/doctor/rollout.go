package doctor

import (
	"fmt"
	"strings"

	"github.com/nvdriver/nvdriver/pkg/apis/nvidia/v1alpha1"
	"github.com/nvdriver/nvdriver/pkg/plan"
)

// rolloutWaits: the rollout itself holds the CR's nodes (a pause, a canary
// waiting, a halt): its own finding explains it, better than "not ready".
func rolloutWaits(d *v1alpha1.NVIDIADriver) bool {
	if d.Status.Rollout == nil {
		return false
	}
	switch d.Status.Rollout.Phase {
	case v1alpha1.RolloutHalted, v1alpha1.RolloutPaused, v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking:
		return true
	}
	return false
}

// checkRollouts explains a rollout that waits, and what moves it on.
func checkRollouts(s *Snapshot, _ *plan.Plan) []Finding {
	var out []Finding
	for _, d := range s.Drivers {
		r := d.Status.Rollout
		if !s.wants(d.Name) || r == nil {
			continue
		}
		obj := []string{"nvidiadriver/" + d.Name}
		switch r.Phase {
		case v1alpha1.RolloutHalted:
			var nodes []string
			for _, f := range r.FailedNodes {
				nodes = append(nodes, f.Node)
			}
			retry := "NODE"
			if len(nodes) > 0 {
				retry = nodes[0]
			}
			out = append(out, Finding{Severity: Error, Objects: append(obj, nodeObjs(nodes)...),
				Message: fmt.Sprintf("%s: rollout %s", d.Name, r.Message),
				Fix: fmt.Sprintf("go back: kubectl nvdriver rollout undo %s; or fix the node and retry it: kubectl label node %s %s=upgrade-required --overwrite; or go on past the failures: kubectl nvdriver rollout resume %s",
					d.Name, retry, plan.LabelUpgradeState, d.Name)})
		case v1alpha1.RolloutPaused:
			out = append(out, Finding{Severity: Info, Objects: obj,
				Message: fmt.Sprintf("%s: rollout paused with %d of %d node(s) done: no further node starts", d.Name, r.Done, r.Total),
				Fix:     "kubectl nvdriver rollout resume " + d.Name})
		case v1alpha1.RolloutWaiting, v1alpha1.RolloutBaking:
			out = append(out, Finding{Severity: Info, Objects: append(obj, nodeObjs(r.CanaryNodes)...),
				Message: fmt.Sprintf("%s: %s", d.Name, r.Message),
				Fix:     strings.Join([]string{"kubectl nvdriver status " + d.Name, "kubectl nvdriver rollout resume " + d.Name}, "; ")})
		}
	}
	return out
}
