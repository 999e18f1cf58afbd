#!/usr/bin/env bash
# Ad-hoc measurements on the local simulated cluster, reported in BENCHMARKS.md
# until `make bench` (the scale issue) replaces them with repeated runs.
#   hack/measure.sh ready N        time from kubectl apply (nvd-all.yaml) to the CR ready, N GPU nodes
#   hack/measure.sh preview N      preview wall time vs `kubectl get nodes -o name`, 5 runs each
#   hack/measure.sh rollout N P    N-node rollout at maxParallelUpgrades P: wall time
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NVDRIVER_CLUSTER_NAME=nvdriver-measure
make -s build >/dev/null

up() {
  test/cluster/cluster.sh up --gpu-nodes "$1" >/dev/null 2>&1
  export KUBECONFIG="$(test/cluster/cluster.sh kubeconfig)"
  kubectl apply -f charts/nvdriver/crds/ >/dev/null
  kubectl create namespace gpu-operator >/dev/null
  bin/controller --namespace gpu-operator --metrics-bind-address 127.0.0.1:${METRICS_PORT:-18089} --health-probe-bind-address 127.0.0.1:0 >/tmp/measure-controller.log 2>&1 &
  echo $! >/tmp/measure-controller.pid
  # Wait for the controller to label every GPU node.
  for _ in $(seq 1 600); do
    [ "$(kubectl get nodes -l nvidia.com/gpu.present=true -o name | wc -l)" -ge "$1" ] && break
    sleep 0.2
  done
}
down() {
  kill "$(cat /tmp/measure-controller.pid)" 2>/dev/null || true
  test/cluster/cluster.sh down >/dev/null 2>&1 || true
}
trap down EXIT
ms() { date +%s%3N; }

wait_state() { # name state
  while [ "$(kubectl get nvidiadriver "$1" -o jsonpath='{.status.state}' 2>/dev/null)" != "$2" ]; do sleep 0.1; done
}

case "$1" in
  ready)
    up "$2"
    t0=$(ms); kubectl apply -f test/testdata/seed/nvd-all.yaml >/dev/null; wait_state demo-all ready; t1=$(ms)
    echo "ready: $2 GPU nodes: kubectl apply -> demo-all ready in $((t1 - t0)) ms"
    ;;
  preview)
    up "$2"
    kubectl apply -f test/testdata/seed/nvd-all.yaml >/dev/null; wait_state demo-all ready
    for cmd in "kubectl get nodes -o name" "bin/kubectl-nvdriver preview" "bin/kubectl-nvdriver status"; do
      times=()
      for _ in 1 2 3 4 5; do t0=$(ms); $cmd >/dev/null; t1=$(ms); times+=($((t1 - t0))); done
      median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
      echo "preview: $2 nodes: '$cmd' median ${median} ms (runs: ${times[*]})"
    done
    ;;
  rollout)
    up "$2"
    kubectl label nodes -l nvidia.com/gpu.present=true roll=yes --overwrite >/dev/null
    kubectl apply -f - >/dev/null <<YAML
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: roll}
spec:
  version: "535.104.12"
  nodeSelector: {roll: "yes"}
  upgradePolicy: {maxParallelUpgrades: $3, maxUnavailable: "100%"}
YAML
    wait_state roll ready
    while [ "$(kubectl get nodes -l nvidia.com/gpu-driver-upgrade-state=upgrade-done -o name | wc -l)" -lt "$2" ]; do sleep 0.2; done
    t0=$(ms)
    kubectl patch nvidiadriver/roll --type=json -p='[{"op":"replace","path":"/spec/version","value":"550.90.07"}]' >/dev/null
    sleep 1; wait_state roll ready; t1=$(ms)
    echo "rollout: $2 nodes at maxParallelUpgrades $3: patch -> all upgrade-done and ready in $((t1 - t0)) ms"
    # Controller-side time per pass of the upgrade machine (one pass moves every
    # node of the CR that can move), from controller-runtime's histogram.
    curl -s "127.0.0.1:${METRICS_PORT:-18089}/metrics" | grep 'controller_runtime_reconcile_time_seconds_bucket{controller="upgrade"' > /tmp/measure-buckets.txt
    python3 - <<'PY'
import re
b = []
for line in open("/tmp/measure-buckets.txt"):
    m = re.search(r'le="([^"]+)"\}\s+(\S+)', line)
    if m:
        b.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
total = b[-1][1]
q = lambda p: next(le for le, c in b if c >= p * total)
print("upgrade machine passes: %d; p50 <= %ss, p95 <= %ss (histogram bucket bounds)" % (total, q(0.5), q(0.95)))
PY
    ;;
  *) echo "usage: $0 ready N | preview N | rollout N P" >&2; exit 1 ;;
esac
