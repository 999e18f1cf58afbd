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
package main

import (
	"fmt"
	"os"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

const (
	notReadyAnnotation = "nvdriver.test/not-ready"
	failAnnotation     = "nvdriver.test/fail"
	flakyNode          = "gpu-node-flaky"
)

func main() {
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
	docs := []string{notForNotReady(nodefast.DefaultNodeInit), notForNotReady(nodeheartbeat.DefaultNodeHeartbeat), string(readyYAML),
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
