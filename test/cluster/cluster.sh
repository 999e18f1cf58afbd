#!/usr/bin/env bash
# The local simulated GPU cluster: real etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, and kwok for the nodes, all built
# from Go modules (test/tools/build.sh) and run by kwokctl's binary runtime.
# Every component listens on 127.0.0.1 only.
#
# usage: test/cluster/cluster.sh up [--gpu-nodes N] [--heartbeat-factor F] [--node-status-every D] [--controller-manager-qps Q] | down | kubeconfig
#   --heartbeat-factor scales kwokctl's node heartbeat timings, among them
#   kube-controller-manager's --node-monitor-grace-period (40s × F; kwokctl's
#   default F is 5): at thousands of kwok nodes on 2 cores heartbeats lag while
#   kube-apiserver is busy, and nodes would flap NotReady.
#   --node-status-every is how often a Ready node posts its status (default
#   5m, as a kubelet with node leases; kwok renews the Leases in between).
#   --controller-manager-qps is kube-controller-manager's --kube-api-qps (burst
#   twice that; its own default is 20 and 30): at thousands of nodes its
#   DaemonSet controller, held to 20 requests a second, makes the driver pods
#   many minutes after the nodes are labelled; the benchmark gives it 20 per
#   1,000 nodes (docs/design.md, "Simulated cluster at scale").
# kube-controller-manager and kube-scheduler run without leader election: each
# is the only one, and with it on each exits for good ("leaderelection lost")
# when it cannot renew its Lease for 10 s, as in the fault tests' etcd and
# kube-apiserver restarts on a loaded machine; kwokctl does not restart them.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
name="${NVDRIVER_CLUSTER_NAME:-nvdriver}"
export KWOK_WORKDIR="${KWOK_WORKDIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nvdriver/kwok}"
mkdir -p "$KWOK_WORKDIR"
kubeconfig="$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' 2>/dev/null ||
    echo $(( 20000 + RANDOM % 20000 ))
}

up() {
  local gpu_nodes=6 factor="" every=5m kcm_qps=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --gpu-nodes) gpu_nodes="$2"; shift 2 ;;
      --heartbeat-factor) factor="$2"; shift 2 ;;
      --node-status-every) every="$2"; shift 2 ;;
      --controller-manager-qps)
        case "${2:-}" in ""|*[!0-9]*) echo "error: --controller-manager-qps wants a whole number, got '${2:-}'" >&2; exit 1 ;; esac
        kcm_qps="$2"; shift 2 ;;
      *) echo "error: unknown flag $1 (usage: cluster.sh up [--gpu-nodes N] [--heartbeat-factor F] [--node-status-every D] [--controller-manager-qps Q])" >&2; exit 1 ;;
    esac
  done
  echo ">> building cluster components (cached after the first build; a cold build takes ~15 minutes on 2 cores)"
  bin="$("$root/test/tools/build.sh" etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl)"
  if "$bin/kwokctl" get clusters 2>/dev/null | grep -qx "$name"; then
    echo ">> cluster $name exists; recreating it"
    "$bin/kwokctl" delete cluster --name "$name" >/dev/null
  fi
  # kwok's default stages plus simulated failures (test/tools/kwok/cmd/stages).
  (cd "$root/test/tools/kwok" && go run ./cmd/stages -node-status-every "$every") > "$KWOK_WORKDIR/stages-$name.yaml"
  # Two arguments for one component go in the configuration, not in two
  # --extra-args: kwokctl 0.8 panics on a component repeated there after the
  # first one (it indexes its patches by flag position).
  cat >> "$KWOK_WORKDIR/stages-$name.yaml" <<'YAML'
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - {key: bind-address, value: 127.0.0.1}
  - {key: leader-elect, value: "false"}
YAML
  if [ -n "$kcm_qps" ]; then
    cat >> "$KWOK_WORKDIR/stages-$name.yaml" <<YAML
  - {key: kube-api-qps, value: "$kcm_qps"}
  - {key: kube-api-burst, value: "$((kcm_qps * 2))"}
YAML
  fi
  cat >> "$KWOK_WORKDIR/stages-$name.yaml" <<'YAML'
- name: kube-scheduler
  extraArgs:
  - {key: bind-address, value: 127.0.0.1}
  - {key: leader-elect, value: "false"}
YAML
  local etcd_port etcd_peer extra=()
  if [ -n "$factor" ]; then extra+=(--heartbeat-factor "$factor"); fi
  etcd_port="$(free_port)"; etcd_peer="$(free_port)"
  echo ">> starting cluster $name (workdir $KWOK_WORKDIR)"
  "$bin/kwokctl" create cluster --name "$name" --runtime binary --kubeconfig "" \
    --etcd-binary "$bin/etcd" --kube-apiserver-binary "$bin/kube-apiserver" \
    --kube-controller-manager-binary "$bin/kube-controller-manager" \
    --kube-scheduler-binary "$bin/kube-scheduler" --kwok-controller-binary "$bin/kwok" \
    --config "$KWOK_WORKDIR/stages-$name.yaml" \
    --etcd-port "$etcd_port" \
    --extra-args "etcd=listen-client-urls=http://127.0.0.1:$etcd_port" \
    --extra-args "etcd=listen-peer-urls=http://127.0.0.1:$etcd_peer" \
    --extra-args "etcd=advertise-client-urls=http://127.0.0.1:$etcd_port" \
    --extra-args "kube-apiserver=bind-address=127.0.0.1" \
    --extra-args "kwok-controller=server-address=127.0.0.1:0" ${extra[@]+"${extra[@]}"} \
    --wait 2m >"$KWOK_WORKDIR/create-$name.log" 2>&1 || { cat "$KWOK_WORKDIR/create-$name.log" >&2; exit 1; }
  "$bin/kwokctl" get kubeconfig --name "$name" > "$kubeconfig.tmp" && mv "$kubeconfig.tmp" "$kubeconfig"
  echo ">> creating $gpu_nodes simulated GPU node(s), a pre-installed-driver node and a non-GPU node"
  (cd "$root" && go run ./test/cluster/nodes --kubeconfig "$kubeconfig" --gpu-nodes "$gpu_nodes")
  echo ">> cluster $name is up. Use it with:"
  echo "export KUBECONFIG=$kubeconfig"
}

down() {
  local pidfile
  pidfile="$(dirname "$kubeconfig")/controller.pid"
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
  pidfile="$(dirname "$kubeconfig")/registry.pid" # the demo's registry
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
  local bin="${NVDRIVER_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvdriver/bin/v1.37.2}"
  if [ ! -x "$bin/kwokctl" ]; then echo ">> no kwokctl built; nothing to remove"; return; fi
  if "$bin/kwokctl" get clusters 2>/dev/null | grep -qx "$name"; then
    "$bin/kwokctl" delete cluster --name "$name"
  else
    echo ">> no cluster $name"
  fi
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kubeconfig) echo "$kubeconfig" ;;
  *) echo "usage: $0 up [--gpu-nodes N] [--heartbeat-factor F] [--node-status-every D] | down | kubeconfig" >&2; exit 1 ;;
esac
