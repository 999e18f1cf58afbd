package upgrade

import (
	"maps"
	"time"
)

// Follow is the step a node takes right after decision d, in the same pass,
// when that step waits on nothing and reads nothing the pass has not already
// seen (docs/design.md, "Chained steps"). It returns the node as d (carried
// out) left it, the decision that follows, and whether there is one.
//
// The steps that follow at once are cordon-required (cordon),
// wait-for-jobs-required without a job selector, validation-required (the
// new driver pod was seen Ready in this pass) and uncordon-required
// (uncordon). Every state is still written, in order, one patch each: a
// chain saves the wait for the next pass, not a state. The caller checks
// what only it knows: a validation pod selector needs the node's pods
// listed, which the pass did not do for a node leaving pod-restart-required.
func Follow(n Node, d Decision, p Policy, now time.Time) (Node, Decision, bool) {
	after := n
	after.State = d.To
	if len(d.Annotations) > 0 {
		// The node's map is the cache's: never written to.
		after.Annotations = maps.Clone(n.Annotations)
		if after.Annotations == nil {
			after.Annotations = map[string]string{}
		}
		for k, v := range d.Annotations {
			if v == "" {
				delete(after.Annotations, k)
			} else {
				after.Annotations[k] = v
			}
		}
	}
	for _, a := range d.Actions {
		switch a {
		case ActCordon:
			after.Unschedulable = true
		case ActUncordon:
			after.Unschedulable = false
		}
	}
	if n.Skip || d.From == d.To {
		return after, Decision{}, false
	}
	switch d.To {
	case StateCordon, StateValidation, StateUncordon:
	case StateWaitForJobs:
		if p.WaitForJobsSelector != "" {
			return after, Decision{}, false // the jobs are counted from a pod list
		}
	default:
		return after, Decision{}, false
	}
	f := Decision{Node: n.Name, From: after.State, To: after.State}
	next(&f, after, p, now)
	if f.From == f.To {
		return after, Decision{}, false // the step waits: a later pass takes it
	}
	clearFailure(&f, after)
	stampState(&f, now)
	return after, f, true
}
