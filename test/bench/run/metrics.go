package main

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/nvdriver/nvdriver/pkg/upgrade"
)

// ---- metrics ----

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

type metricsText []sample

func (p *controllerProc) scrape() metricsText {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.port))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out metricsText
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		head := line[:sp]
		s := sample{labels: map[string]string{}, value: v}
		if i := strings.IndexByte(head, '{'); i >= 0 {
			s.name = head[:i]
			for _, kv := range splitLabels(head[i+1 : len(head)-1]) {
				if j := strings.IndexByte(kv, '='); j > 0 {
					s.labels[kv[:j]] = strings.Trim(kv[j+1:], `"`)
				}
			}
		} else {
			s.name = head
		}
		out = append(out, s)
	}
	return out
}

func splitLabels(s string) []string {
	var out []string
	inQ, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			inQ = !inQ
		case ',':
			if !inQ {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func (m metricsText) sum(name string, match map[string]string) float64 {
	t := 0.0
	for _, s := range m {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && s.labels[k] == v
		}
		if ok {
			t += s.value
		}
	}
	return t
}

// hist is a cumulative histogram: upper bound -> count.
type hist map[float64]float64

func (m metricsText) histogram(name string, match ...string) hist {
	h := hist{}
	for _, s := range m {
		if s.name != name+"_bucket" {
			continue
		}
		ok := true
		for i := 0; i+1 < len(match); i += 2 {
			ok = ok && s.labels[match[i]] == match[i+1]
		}
		if !ok {
			continue
		}
		le := s.labels["le"]
		b := 0.0
		if le == "+Inf" {
			b = 1e18
		} else {
			b, _ = strconv.ParseFloat(le, 64)
		}
		h[b] += s.value
	}
	return h
}

// histBetween is a histogram's observations between two scrapes.
func histBetween(m0, m1 metricsText, name string, match ...string) hist {
	return m1.histogram(name, match...).minus(m0.histogram(name, match...))
}

func (h hist) minus(o hist) hist {
	out := hist{}
	for k, v := range h {
		out[k] = v - o[k]
	}
	return out
}

func (h hist) count() float64 { return h[1e18] }

// quantile interpolates linearly inside the bucket holding q.
func (h hist) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h))
	for b := range h {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	total := h.count()
	if total == 0 {
		return 0
	}
	rank := q * total
	prevB, prevC := 0.0, 0.0
	for _, b := range bounds {
		c := h[b]
		if c >= rank {
			if b == 1e18 {
				return prevB
			}
			if c == prevC {
				return b
			}
			return prevB + (b-prevB)*(rank-prevC)/(c-prevC)
		}
		prevB, prevC = b, c
	}
	return prevB
}

// passesBetween says, per reconciler, how many passes ran between two
// scrapes, what they cost on average (nvdriver_pass_seconds: their time
// less API waits) and how many requests the pass gate deferred: what a
// latency figure is made of.
func passesBetween(phase string, m0, m1 metricsText) string {
	var parts []string
	for _, c := range []string{"node-labels", "nvidiadriver", "upgrade"} {
		match := map[string]string{"controller": c}
		n := m1.sum("nvdriver_pass_seconds_count", match) - m0.sum("nvdriver_pass_seconds_count", match)
		secs := m1.sum("nvdriver_pass_seconds_sum", match) - m0.sum("nvdriver_pass_seconds_sum", match)
		deferred := m1.sum("nvdriver_passes_deferred_total", match) - m0.sum("nvdriver_passes_deferred_total", match)
		res.Values[phase+"_passes_"+c] = n
		parts = append(parts, fmt.Sprintf("%s %.0f passes at %.1f ms, %.0f deferred", c, n, secs/max(n, 1)*1000, deferred))
	}
	plans := map[string]float64{}
	for _, r := range []string{"hit", "miss", "joined"} {
		match := map[string]string{"result": r}
		plans[r] = m1.sum("nvdriver_plan_cache_total", match) - m0.sum("nvdriver_plan_cache_total", match)
		res.Values[phase+"_plan_"+r] = plans[r]
	}
	parts = append(parts, fmt.Sprintf("shared plan %.0f computed, %.0f joined, %.0f hits", plans["miss"], plans["joined"], plans["hit"]))
	return strings.Join(parts, "; ")
}

// stateTimes says how long, on average, the rolled nodes spent in each
// upgrade state between two scrapes (nvdriver_upgrade_state_seconds), in
// the machine's order: pod-restart-required is mostly cluster time (the
// DaemonSet controller making the new driver pod, kwok starting it), the
// rest the controller's.
// inFlightStates are the upgrade states a node waits in during a rollout, in order.
var inFlightStates = []string{upgrade.StateRequired, upgrade.StateCordon, upgrade.StateWaitForJobs, upgrade.StatePodDeletion,
	upgrade.StateDrain, upgrade.StatePodRestart, upgrade.StateValidation, upgrade.StateUncordon}

func stateTimes(phase string, m0, m1 metricsText) string {
	var parts []string
	for _, s := range inFlightStates {
		match := map[string]string{"state": s}
		n := m1.sum("nvdriver_upgrade_state_seconds_count", match) - m0.sum("nvdriver_upgrade_state_seconds_count", match)
		if n == 0 {
			continue
		}
		mean := (m1.sum("nvdriver_upgrade_state_seconds_sum", match) - m0.sum("nvdriver_upgrade_state_seconds_sum", match)) / n
		res.Values[phase+"_state_mean_seconds_"+s] = mean
		parts = append(parts, fmt.Sprintf("%s %.2f s (%.0f)", s, mean, n))
	}
	return strings.Join(parts, ", ")
}

// transitionsByState is the upgrade machine's transition latency p50/p95
// per target state over a phase (a decision that keeps its state but acts,
// such as deleting the driver pod, counts under that state): which steps
// make the tail.
func transitionsByState(phase string, m0, m1 metricsText) string {
	var parts []string
	for _, s := range append(slices.Clone(inFlightStates), upgrade.StateDone, upgrade.StateFailed) {
		h := histBetween(m0, m1, "nvdriver_upgrade_transition_seconds", "to", s)
		if h.count() == 0 {
			continue
		}
		res.Values[phase+"_transition_p95_ms_"+s] = h.quantile(0.95) * 1000
		parts = append(parts, fmt.Sprintf("%s %.0f/%.0f ms (%.0f)", s, h.quantile(0.5)*1000, h.quantile(0.95)*1000, h.count()))
	}
	return strings.Join(parts, ", ")
}

// countsBetween is a counter's increase between two scrapes, summed by the
// values of the given labels ("PATCH nodes" for verb, resource).
func countsBetween(m0, m1 metricsText, name string, keys ...string) map[string]float64 {
	out := map[string]float64{}
	add := func(m metricsText, sign float64) {
		for _, s := range m {
			if s.name != name {
				continue
			}
			parts := make([]string, len(keys))
			for i, k := range keys {
				parts[i] = s.labels[k]
			}
			out[strings.Join(parts, " ")] += sign * s.value
		}
	}
	add(m1, 1)
	add(m0, -1)
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}
