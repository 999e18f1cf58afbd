// Command stages prints the kwok Stage configuration of the local cluster:
// kwok's own default node and pod stages, with pod-ready skipping pods that ask
// for a simulated failure, plus failure stages selected by the pod annotation
// nvdriver.test/fail (set it through an NVIDIADriver's spec.annotations):
//
//	image-pull   the pod waits in ImagePullBackOff
//	crashloop    the driver container waits in CrashLoopBackOff
//	never-ready  the pod runs but never becomes Ready (validation timeouts)
//	flaky-node   like never-ready, but only on node gpu-node-flaky; elsewhere
//	             the pod becomes Ready (one bad node in an otherwise good rollout)
//
// A node annotated nvdriver.test/not-ready is not made Ready again by kwok:
// a test sets its Ready condition to False (the node going NotReady) and
// removes the annotation to bring it back.
//
// Nodes post their status as a kubelet with node leases does: every
// -node-status-every (5m, the kubelet's nodeStatusReportFrequency), their
// liveness carried by the Lease kwok renews in between. kwok's stage without
// leases posts it every 20-25 s, ten to fifteen times what a cluster of real
// kubelets sends a node watcher. Each post's lastHeartbeatTime is computed
// from the node alone (its creation time and name, then the previous post), so
// a second timer kwok keeps for the same node posts what the node already
// holds, which the API server does not write, and that timer ends there
// (docs/design.md, "Simulated heartbeats").
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

const (
	notReadyAnnotation = "nvdriver.test/not-ready"
	failAnnotation     = "nvdriver.test/fail"
	flakyNode          = "gpu-node-flaky"
)

func main() {
	every := flag.Duration("node-status-every", 5*time.Minute, "how often a Ready node posts its status (whole seconds; each node on its own grid, first posting up to a tenth of it before its creation time)")
	flag.Parse()
	if *every < time.Second || *every%time.Second != 0 {
		fmt.Fprintf(os.Stderr, "error: -node-status-every %v: want whole seconds, at least 1s\n", *every)
		os.Exit(2)
	}
	heartbeat, err := onGrid(nodeheartbeat.DefaultNodeHeartbeatWithLease, *every)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	initialize, err := withBeat(nodefast.DefaultNodeInit, firstBeat(*every))
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	ready := map[string]any{}
	if err := yaml.Unmarshal([]byte(podfast.DefaultPodReady), &ready); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	spec := ready["spec"].(map[string]any)
	sel := spec["selector"].(map[string]any)
	sel["matchExpressions"] = append(sel["matchExpressions"].([]any), map[string]any{
		"key": fmt.Sprintf(`.metadata.annotations["%s"]`, failAnnotation), "operator": "DoesNotExist",
	})
	readyYAML, err := yaml.Marshal(ready)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	// The same pod-ready stage for flaky-node pods on every other node.
	flakyReady := map[string]any{}
	_ = yaml.Unmarshal(readyYAML, &flakyReady)
	flakyReady["metadata"] = map[string]any{"name": "pod-ready-flaky-elsewhere"}
	fsel := flakyReady["spec"].(map[string]any)["selector"].(map[string]any)
	exprs := fsel["matchExpressions"].([]any)
	exprs = exprs[:len(exprs)-1]
	fsel["matchExpressions"] = append(exprs,
		map[string]any{"key": fmt.Sprintf(`.metadata.annotations["%s"]`, failAnnotation), "operator": "In", "values": []string{"flaky-node"}},
		map[string]any{"key": ".spec.nodeName", "operator": "NotIn", "values": []string{flakyNode}})
	flakyYAML, err := yaml.Marshal(flakyReady)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	// kwok's node-initialize makes every node that is not Ready Ready, and
	// its heartbeat renews the conditions: neither touches a not-ready node.
	docs := []string{notForNotReady(initialize), notForNotReady(heartbeat), string(readyYAML),
		podfast.DefaultPodComplete, podfast.DefaultPodDelete,
		failStage("image-pull", "Pending", "ImagePullBackOff", `{{ printf "Back-off pulling image %q" .image | Quote }}`, false),
		failStage("crashloop", "Running", "CrashLoopBackOff", `"back-off 5m0s restarting failed container"`, false),
		failStage("never-ready", "Running", "", "", true),
		string(flakyYAML),
		strings.Replace(failStage("flaky-node", "Running", "", "", true), "    - key: '.status.containerStatuses'",
			"    - key: '.spec.nodeName'\n      operator: 'In'\n      values: ['"+flakyNode+"']\n    - key: '.status.containerStatuses'", 1),
	}
	for i, d := range docs {
		if i > 0 {
			fmt.Println("---")
		}
		fmt.Println(strings.TrimSpace(d))
	}
}

// notForNotReady adds to a node stage's selector that the node is not
// annotated not-ready.
func notForNotReady(stage string) string {
	out := strings.Replace(stage, "  selector:\n    matchExpressions:\n",
		"  selector:\n    matchExpressions:\n    - key: '.metadata.annotations[\""+notReadyAnnotation+"\"]'\n      operator: 'DoesNotExist'\n", 1)
	if out == stage {
		fmt.Fprintln(os.Stderr, "error: a kwok node stage changed shape; cannot exclude not-ready nodes")
		os.Exit(1)
	}
	return out
}

// A heartbeat's time in the templates below. kwok keeps one timer per node,
// but it loses track of a timer when the node changes while a timer is due
// (its queue forgets the newer one by the node's name), and from then on both
// post, each restarting on the other's post: measured at 5,000 nodes, three of
// four nodes posted twice every period. So no post takes its time from the
// clock: the first is the node's creation time less up to a tenth of the
// period (from a hash of its name, so that nodes created together do not post
// together), and each next one is on that grid, the last grid time not after
// now. A second timer then posts exactly what the node holds: the API server
// writes nothing, sends no event, and kwok sets no timer after it. A timer
// that fires early posts the time the node already holds, which kwok does not
// send at all.
const rfc3339 = "2006-01-02T15:04:05Z07:00"

// firstBeat defines $beat for node-initialize: the node's creation time less
// up to a tenth of every.
func firstBeat(every time.Duration) string {
	spread := max(int64(every/time.Second)/10, 1)
	return fmt.Sprintf(`{{ $beat := dateInZone %[1]q (sub (toDate %[1]q .metadata.creationTimestamp).Unix (mod (atoi (adler32sum .metadata.name)) %[2]d)) "UTC" }}`,
		rfc3339, spread)
}

// nextBeat defines $beat for the heartbeat: the Ready condition's last
// heartbeat plus as many whole periods as have passed (none: the same time).
func nextBeat(every time.Duration) string {
	s := int64(every / time.Second)
	return fmt.Sprintf(`{{ $beat := Now }}{{ range .status.conditions }}{{ if eq .type "Ready" }}{{ with .lastHeartbeatTime }}`+
		`{{ $last := (toDate %[1]q .).Unix }}{{ $beat = dateInZone %[1]q (add $last (mul (max 0 (div (sub (now).Unix $last) %[2]d)) %[2]d)) "UTC" }}`+
		`{{ end }}{{ end }}{{ end }}`, rfc3339, s)
}

// withBeat makes a node stage write $beat, which beat defines, as every
// condition's lastHeartbeatTime, where kwok's stage writes the clock's time.
func withBeat(stage, beat string) (string, error) {
	const now, heartbeat = "{{ $now := Now }}", "lastHeartbeatTime: {{ $now | Quote }}"
	if strings.Count(stage, now) != 1 || strings.Count(stage, heartbeat) != 1 {
		return "", fmt.Errorf("a kwok node stage changed shape: no single %q and %q", now, heartbeat)
	}
	stage = strings.Replace(stage, now, now+"\n      "+beat, 1)
	return strings.Replace(stage, heartbeat, "lastHeartbeatTime: {{ $beat | Quote }}", 1), nil
}

// onGrid makes kwok's heartbeat stage post every period on the node's grid:
// its timer is set for the Ready condition's last heartbeat plus every (or
// every from now, for a node without one), and the post writes nextBeat.
func onGrid(stage string, every time.Duration) (string, error) {
	stage, err := withBeat(stage, nextBeat(every))
	if err != nil {
		return "", err
	}
	st := map[string]any{}
	if err := yaml.Unmarshal([]byte(stage), &st); err != nil {
		return "", err
	}
	spec, _ := st["spec"].(map[string]any)
	if _, ok := spec["delay"].(map[string]any); !ok {
		return "", fmt.Errorf("kwok's node heartbeat stage changed shape: no spec.delay")
	}
	spec["delay"] = map[string]any{
		"durationMilliseconds": every.Milliseconds(),
		"durationFrom": map[string]any{"jq": map[string]any{"expression": fmt.Sprintf(
			`(.status.conditions // [])[] | select(.type == "Ready") | .lastHeartbeatTime // empty | fromdateiso8601 + %d | todate`, int64(every/time.Second))}},
	}
	out, err := yaml.Marshal(st)
	return string(out), err
}

// failStage sets a pod's status once, as the kubelet would for that failure.
func failStage(mode, phase, reason, message string, running bool) string {
	state := fmt.Sprintf(`waiting:
            reason: %s
            message: %s`, reason, message)
	if running {
		state = `running:
            startedAt: {{ $now | Quote }}`
	}
	return fmt.Sprintf(`apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: nvdriver-fail-%[1]s
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.annotations["%[2]s"]'
      operator: 'In'
      values: ['%[1]s']
    - key: '.status.containerStatuses'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: %[3]s
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: PodScheduled
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 5
        started: false
        state:
          %[4]s
      {{ end }}
`, mode, failAnnotation, phase, state)
}
