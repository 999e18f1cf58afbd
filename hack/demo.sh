#!/usr/bin/env bash
# make demo: the whole product on a simulated GPU cluster, no GPU and no Docker.
# Starts the local cluster, installs the chart, runs the controller, and walks
# through every plugin command with a line on what each one shows.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PATH="$root/bin:$PATH"

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@" || true; }

say "Starting the local simulated GPU cluster (6 GPU nodes on Ubuntu 20.04/22.04 with two kernels, one node with a pre-installed driver, one CPU node)"
test/cluster/cluster.sh up --gpu-nodes 6
kubeconfig="$(test/cluster/cluster.sh kubeconfig)"
export KUBECONFIG="$kubeconfig"
workdir="$(dirname "$kubeconfig")"

say "Starting a container registry on loopback with the driver images this demo uses (the controller checks every image before it rolls a node onto it)"
go build -o "$workdir/registry" ./hack/registry
"$workdir/registry" serve --addr 127.0.0.1:0 >"$workdir/registry.addr" 2>"$workdir/registry.log" &
echo $! >"$workdir/registry.pid"
for _ in $(seq 1 50); do [ -s "$workdir/registry.addr" ] && break; sleep 0.1; done
reg="$(head -1 "$workdir/registry.addr")/nvidia"
for v in 580.95.05 535.104.12 470.141.10; do
  for os in ubuntu20.04 ubuntu22.04; do "$workdir/registry" push "$reg/driver:$v-$os" >/dev/null; done
done
echo "registry $reg: driver 580.95.05, 535.104.12 and 470.141.10 for ubuntu20.04 and ubuntu22.04 (525.125.06 is deliberately missing)"

bin="$(test/tools/build.sh helm | tail -1)"
# The controller's admission webhook listens on loopback; kube-apiserver (a
# local process here) calls it at this URL.
hookport="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' 2>/dev/null || echo $((20000 + RANDOM % 20000)))"
hook="https://127.0.0.1:$hookport"
say "Installing the chart as NVIDIA's docs install the GPU Operator (the controller runs outside the cluster here: kwok nodes run no real images; the webhook is reached at $hook)"
show "$bin/helm" install nvdriver charts/nvdriver -n gpu-operator --create-namespace --set controller.enabled=false --set controller.webhook.url="$hook" --set driver.repository="$reg" --wait
kubectl label namespace gpu-operator pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null

say "Starting the controller (leader election on, as in a cluster; image checks re-tried every 2-5 s here instead of 30 s-10 min, a new driver pod given 15 s instead of 10 min to become Ready)"
bin/controller --kubeconfig "$kubeconfig" --namespace gpu-operator --metrics-bind-address 127.0.0.1:0 \
  --health-probe-bind-address 127.0.0.1:0 --image-check-backoff 2s --image-check-max-backoff 5s --validation-timeout 15s \
  --webhook-bind-address "127.0.0.1:$hookport" --webhook-url "$hook" >"$workdir/controller.log" 2>&1 &
echo $! >"$workdir/controller.pid"
echo "controller pid $(cat "$workdir/controller.pid"), log $workdir/controller.log"

wait_ready() {
  for _ in $(seq 1 120); do
    states="$(kubectl get nvidiadrivers -o jsonpath='{range .items[*]}{.status.state}{"\n"}{end}' 2>/dev/null)"
    if [ -n "$states" ] && [ -z "$(echo "$states" | grep -vx ready)" ]; then return 0; fi
    sleep 0.5
  done
  echo "(still converging; kubectl nvdriver status shows why)"
}
wait_ready

say "kubectl nvdriver version"
show kubectl nvdriver version

say "The chart's default NVIDIADriver covers every GPU node: one DaemonSet per OS release"
show kubectl get nvidiadrivers -o wide
show kubectl nvdriver status

say "preview: what would NVIDIA's multi-version example do here, before applying it? (nothing is labelled gold/silver yet; its images are on nvcr.io, so no registry is asked here)"
show kubectl nvdriver preview -f test/testdata/seed/nvd-driver-multiple.yaml --check-images=false

say "assign, checked on the server first: nothing is written"
show kubectl nvdriver assign demo-gold --nodes gpu-node-1,gpu-node-3 --version 535.104.12 --repository "$reg" --dry-run=server

say "assign for real: label the nodes and create the NVIDIADriver in one step"
show kubectl nvdriver assign demo-gold --nodes gpu-node-1,gpu-node-3 --version 535.104.12 --repository "$reg"
show kubectl nvdriver assign demo-silver --nodes gpu-node-0,gpu-node-2 --version 470.141.10 --repository "$reg"
wait_ready
show kubectl nvdriver status -o wide

say "preview with node names: gold, silver, and the default taking the rest; REGISTRY says each image exists"
show kubectl nvdriver preview -o wide

say "A manifest that would overlap: preview shows the conflict and exits 3, before anything is applied"
show kubectl nvdriver preview -f test/testdata/seed/nvd-all.yaml demo-all demo-gold --check-images=false
echo "(exit status 3 = conflicts found)"

say "kubectl apply of that manifest is refused by the controller's admission webhook, with the same words (it fails open: with no controller answering it would be accepted and reported as a conflict afterwards)"
show kubectl apply -f test/testdata/seed/nvd-all.yaml

say "assign refuses a change that would create a conflict, and writes nothing"
kubectl label node gpu-node-4 team=ml --overwrite >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: demo-ml
spec:
  repository: $reg
  version: "535.104.12"
  nodeSelector:
    team: ml
YAML
show kubectl nvdriver assign demo-gold --nodes gpu-node-4
wait_ready

say "upgrade, checked first: 525.125.06 is not in the registry (a server dry run: nothing is written; exit 3)"
show kubectl nvdriver upgrade demo-silver --to 525.125.06 --dry-run=server

say "upgrade for real anyway: the controller holds silver's pools; no node is cordoned, no GPU job evicted, the old driver keeps running"
show kubectl nvdriver upgrade demo-silver --to 525.125.06
for _ in $(seq 1 60); do
  kubectl get nvidiadriver demo-silver -o jsonpath='{.status.conditions[?(@.type=="ImageAvailable")].reason}' 2>/dev/null | grep -qx ImageMissing && break
  sleep 0.5
done
show kubectl get nvidiadriver demo-silver -o jsonpath='{range .status.conditions[?(@.type=="ImageAvailable")]}{.reason}: {.message}{"\n"}{end}'
show kubectl get nodes gpu-node-0 gpu-node-2 -o custom-columns=NODE:.metadata.name,CORDONED:.spec.unschedulable,UPGRADE:'.metadata.labels.nvidia\.com/gpu-driver-upgrade-state'
show kubectl nvdriver doctor demo-silver

say "Push the missing tag: the controller finds it at its next check and the rollout goes on by itself"
show "$workdir/registry" push "$reg/driver:525.125.06-ubuntu20.04" "$reg/driver:525.125.06-ubuntu22.04"
wait_ready
show kubectl nvdriver status demo-silver

rollout_phase() { # wait for demo-silver's rollout to reach a phase
  for _ in $(seq 1 120); do
    [ "$(kubectl get nvidiadriver demo-silver -o jsonpath='{.status.rollout.phase}' 2>/dev/null)" = "$1" ] && return 0
    sleep 0.5
  done
  echo "(rollout not $1 yet; kubectl nvdriver status demo-silver shows why)"
}

say "Rollout control: a one-node canary that waits for a person (spec.upgradePolicy.canary)"
show kubectl patch nvidiadriver demo-silver --type=merge -p '{"spec":{"upgradePolicy":{"canary":{"nodes":1}}}}'
show kubectl nvdriver upgrade demo-silver --to 580.95.05
rollout_phase WaitingForPromotion
show kubectl nvdriver status demo-silver
show kubectl get nodes -l nvidia.com/gpu-operator.driver.owner=demo-silver -o custom-columns=NODE:.metadata.name,CORDONED:.spec.unschedulable,UPGRADE:'.metadata.labels.nvidia\.com/gpu-driver-upgrade-state'

say "rollout resume promotes the canary; the other nodes follow within the budget"
show kubectl nvdriver rollout resume demo-silver
rollout_phase Complete
show kubectl nvdriver rollout history demo-silver

say "A driver that never becomes Ready (a kwok failure stage) fails its canary node: the rollout halts at the failure budget of 1"
show kubectl patch nvidiadriver demo-silver --type=merge -p '{"spec":{"version":"470.141.10","annotations":{"nvdriver.test/fail":"never-ready"}}}'
rollout_phase Halted
show kubectl get nvidiadriver demo-silver -o jsonpath='{range .status.conditions[?(@.type=="RolloutHalted")]}{.type}={.status}: {.message}{"\n"}{end}'
show kubectl nvdriver doctor demo-silver

say "rollout undo: back to the last good revision, through the same machine (the failed node is retried on it)"
show kubectl nvdriver rollout undo demo-silver
rollout_phase Complete
show kubectl nvdriver status demo-silver
show kubectl nvdriver rollout history demo-silver

say "doctor: plant a problem (a GPU node left cordoned) and let doctor find it"
kubectl cordon gpu-node-5 >/dev/null
show kubectl nvdriver doctor
kubectl uncordon gpu-node-5 >/dev/null

say "Shell completion"
show sh -c 'kubectl nvdriver completion bash | head -3'

say "Done. The cluster and controller keep running:"
echo "export KUBECONFIG=$kubeconfig"
echo "make cluster-down   # removes the cluster and stops the controller"
