# nvdriver — see README.md. Every tool is built from Go modules; nothing is
# installed by hand.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKG     := github.com/nvdriver/nvdriver
LDFLAGS := -s -w -X $(PKG)/pkg/version.Version=$(VERSION)
GO      ?= go
CONTROLLER_GEN := cd hack/tools && $(GO) tool controller-gen
# kube-apiserver and etcd for envtest, built once into a cache outside the repo.
ASSETS = $(shell test/tools/build.sh etcd kube-apiserver)

# krew needs a semantic version: the nearest v* tag, else a dev version.
KREW_TAG ?= $(shell v=$$(git describe --tags --match 'v*' 2>/dev/null || true); [ -n "$$v" ] && echo $$v || echo v0.0.0-dev.$$(git rev-parse --short HEAD 2>/dev/null || echo 0))
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64


BENCH_NODES ?= 1000
BENCH_FLAGS ?=

.PHONY: test-nvidia test-faults fuzz bench bench-5k bench-micro all build test test-unit test-integration test-e2e lint verify manifests generate demo help clean cluster-up cluster-down krew test-packaging

all: build

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 22

# Static, without cgo, as shipped: k8s.io/kubectl/pkg/drain pulls in cli-runtime and kustomize,
# whose plugin loader imports Go's plugin package; with cgo that makes the linker export every
# symbol and keep every method, doubling the controller binary (74 MB against 38 MB) and the memory
# its pages take (docs/design.md, "Memory").
build: ## build bin/kubectl-nvdriver and bin/controller
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ ./cmd/kubectl-nvdriver ./cmd/controller

generate: ## regenerate deepcopy code
	$(CONTROLLER_GEN) object:headerFile=../boilerplate.go.txt paths=../../pkg/apis/...

manifests: generate ## regenerate the CRD into charts/nvdriver/crds
	$(CONTROLLER_GEN) crd paths=../../pkg/apis/... output:crd:artifacts:config=../../charts/nvdriver/crds

verify: ## fail when generated files are stale (regenerates and compares with the working tree)
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	cp -r pkg/apis charts/nvdriver/crds $$tmp/; \
	$(MAKE) --no-print-directory manifests >/dev/null; \
	if ! diff -ru $$tmp/apis pkg/apis || ! diff -ru $$tmp/crds charts/nvdriver/crds; then \
	  echo "error: generated files were out of date: 'make manifests' has now rewritten them; review and commit the result" >&2; exit 1; fi
	@echo "generated files are up to date"

lint: ## go vet, gofmt, and no committed binary or file over 1 MiB
	$(GO) vet ./...
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "error: gofmt needed on:" >&2; echo "$$out" >&2; exit 1; fi
	@hack/check-files.sh
	@echo "vet and gofmt clean; no binary or oversized file committed"

test-unit: ## unit tests (no API server), with the local cluster's kwok stages
	$(GO) test ./pkg/... ./cmd/... ./test/compat/...
	cd test/tools/kwok && $(GO) test ./...

test-integration: ## integration tests against a real kube-apiserver + etcd (envtest)
	@assets="$(ASSETS)"; echo ">> KUBEBUILDER_ASSETS=$$assets"; \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test ./test/integration/...

test-e2e: ## end-to-end tests on a fresh local simulated GPU cluster (built from source once)
	test/tools/build.sh etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl helm >/dev/null
	$(GO) test -count=1 -timeout 30m -v ./test/e2e/... # -v: each test's time, against the time budget

test-packaging: ## Helm chart (lint, values, RBAC, pod security) and krew install of the linux/amd64 archive
	test/tools/build.sh helm kubectl-krew validate-krew-manifest >/dev/null
	$(GO) test -count=1 ./test/packaging/...

test: ## everything CI runs: lint, unit, integration, packaging and end-to-end tests
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint; \
	$(MAKE) --no-print-directory test-unit; \
	$(MAKE) --no-print-directory test-integration; \
	$(MAKE) --no-print-directory test-packaging; \
	$(MAKE) --no-print-directory test-e2e; \
	echo ">> make test passed in $$(( $$(date +%s) - start ))s"

test-nvidia: ## opt-in: every verb against NVIDIA's GPU Operator built from its Go module, on its own local cluster
	NVDRIVER_NVIDIA_COMPAT=1 $(GO) test -count=1 -v -timeout 40m ./test/nvidia/...

FUZZTIME ?= 60s
fuzz: ## run every fuzz target for FUZZTIME (60s) each; not in CI (the committed corpora run in every go test)
	$(GO) test -run '^$$' -fuzz '^FuzzCompute$$' -fuzztime $(FUZZTIME) ./pkg/plan
	$(GO) test -run '^$$' -fuzz '^FuzzImage$$' -fuzztime $(FUZZTIME) ./pkg/plan
	$(GO) test -run '^$$' -fuzz '^FuzzValidateVersion$$' -fuzztime $(FUZZTIME) ./pkg/cli

test-faults: ## the full fault suite: exactly 25 controller kills during a 50-node rollout, kube-apiserver and etcd restarts, leader failover, a partition, 429/500 storms, a blocking PDB, a NotReady node, a restart inside a step timeout (~25 min)
	test/tools/build.sh etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl helm >/dev/null
	NVDRIVER_FAULT_SUITE=full NVDRIVER_FAULT_KILLS=25 $(GO) test -count=1 -timeout 60m -v -run 'TestCrashResume|TestAPIServerRestart|TestLeaderElectionFailover|TestEtcdRestartMidRollout|TestControllerPartition|TestAPIErrorsDuringRollout|TestPDBThatNeverAllowsEviction|TestNodeNotReadyMidUpgrade|TestStepTimeoutSurvivesARestart|TestStatusWatchSaysWhenItLosesTheAPIServer|TestWebhookRefusesAnOverlappingApply|TestWebhookCertificateRotation' ./test/e2e/...

bench-micro: ## Go micro-benchmarks: plan.Compute, render and a driver pass's reads at 100-5,000 nodes, with allocations
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./pkg/plan ./pkg/render ./pkg/controller

bench: bench-micro ## micro-benchmarks + the 1,000-node cluster benchmark (BENCH_NODES=N for others; ~15 min)
	test/tools/build.sh etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl >/dev/null
	$(GO) run ./test/bench/run --nodes $(BENCH_NODES) --out bench-results/$(BENCH_NODES).json $(BENCH_FLAGS)

bench-5k: ## the 5,000-node cluster benchmark (within 60 min on 2 cores)
	test/tools/build.sh etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl >/dev/null
	$(GO) run ./test/bench/run --nodes 5000 --out bench-results/5000.json $(BENCH_FLAGS)

cluster-up: ## start the local simulated GPU cluster (GPU_NODES=6)
	test/cluster/cluster.sh up --gpu-nodes $${GPU_NODES:-6}

cluster-down: ## remove the local cluster
	test/cluster/cluster.sh down

demo: build ## the product on a simulated GPU cluster: cluster, chart, controller, every plugin command
	hack/demo.sh

krew: ## cross-build the plugin archives into dist/ and render krew/nvdriver.yaml with their sha256s
	@rm -rf dist && mkdir -p dist
	@for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; ext=; [ $$os = windows ] && ext=.exe; \
	  echo ">> building $$os/$$arch"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o dist/bin/$${os}_$${arch}/kubectl-nvdriver$$ext ./cmd/kubectl-nvdriver; done
	$(GO) run ./hack/krew -tag $(KREW_TAG) -dist dist -platforms "$$(echo $(PLATFORMS) | tr ' ' ',')"
	"$$(test/tools/build.sh validate-krew-manifest | tail -1)/validate-krew-manifest" -manifest krew/nvdriver.yaml -skip-install
	@echo ">> krew/nvdriver.yaml rendered for $(KREW_TAG)"

clean: ## remove build outputs (not the binary cache)
	rm -rf bin dist
