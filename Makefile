# nvml-mock-sysfs: render mock NVIDIA GPUs into PCI sysfs.
GO        ?= go
BIN       := bin/nvml-mock-sysfs
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# One static binary: containers run it from the overlay, whatever their libc.
export CGO_ENABLED := 0

.PHONY: all build deps test vet lint bench fuzz fuzz-run clean consumers e2e e2e-k8s

all: build

# -buildvcs=auto: --version shows the git revision even where GOFLAGS turns
# stamping off (a git worktree is not stamped: the Go tool does not see it).
build:
	$(GO) build -trimpath -buildvcs=auto -o $(BIN) ./cmd/nvml-mock-sysfs

# Installs the real consumers and runtimes the end-to-end tests drive
# (pciutils, hwloc, podman, runc) when running as root; skips otherwise.
deps:
	@./.ci/install-deps

vet:
	$(GO) vet ./...

lint: vet
	$(GO) run $(STATICCHECK) ./...

# The tests run under gotestsum, whose summary lists every skipped test with
# its reason and ends with its DONE line; .ci/testsummary.go then prints the
# closing line: passed, failed, skipped, and the skipped tests' names. The
# consumer matrix (e2e, which runs compat/consumers itself), the
# Kubernetes suites (e2e-k8s, deploy/cluster/...) and the fuzz targets run
# first, so that this line is the last one; it counts the tests of every
# other package.
GOTESTSUM := gotest.tools/gotestsum@v1.13.0
TESTJSON  := bin/test-events.json

test: deps build lint e2e e2e-k8s fuzz-run
	$(GO) run $(GOTESTSUM) --format pkgname --jsonfile $(TESTJSON) \
		--post-run-command "$(GO) run .ci/testsummary.go" -- -count=1 -timeout 20m $$($(GO) list ./... | grep -v -e '/compat/consumers$$' -e '/deploy/cluster')

# Fuzz targets as package:Target. -fuzz takes one target per go test run.
# make test runs each for FUZZTIME with its seed corpus (testdata/fuzz and
# the seeds the targets add); make fuzz runs each for FUZZTIME_LONG.
FUZZ_TARGETS  := ./overlay/profile:FuzzParse ./overlay/plan:FuzzPlanInvariants ./overlay/importer:FuzzNvidiaSMI
FUZZTIME      ?= 3s
FUZZTIME_LONG ?= 5m

fuzz-run:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s "$${t%%:*}"; \
	done

fuzz:
	$(MAKE) --no-print-directory fuzz-run FUZZTIME=$(FUZZTIME_LONG)

# The real consumers (GFD with nvml-mock's NVML, the DRA driver's discovery,
# nfd-worker, ghw) and runtimes, built from pinned sources into the user's
# cache with one progress line each: a cold build takes many minutes, and go
# test would show nothing until it ended. A warm cache rebuilds nothing.
consumers:
	$(GO) run ./compat/consumers/build-consumers

# The consumer matrix: every profile x real consumer, with and without the
# tree (as root; see compat/consumers). The test writes the table to a file
# as well, since go test shows a passing package's output only with -v.
# E2E_SABOTAGE=escaped or no-tree breaks the tree rows on purpose: they
# must turn red. E2E_PROFILES=a.yaml:b.yaml adds profiles.
MATRIX := bin/consumer-matrix.md
# go test runs in the package's directory: make the profile paths absolute.
space := $(subst ,, )
E2E_PROFILES_ABS = $(subst $(space),:,$(abspath $(subst :, ,$(E2E_PROFILES))))
e2e: consumers
	@mkdir -p bin; rm -f $(MATRIX)
	@NVML_MOCK_SYSFS_E2E_SABOTAGE=$(E2E_SABOTAGE) NVML_MOCK_SYSFS_E2E_PROFILES=$(E2E_PROFILES_ABS) NVML_MOCK_SYSFS_MATRIX=$(CURDIR)/$(MATRIX) $(GO) test -count=1 -timeout 30m ./compat/consumers/; \
		status=$$?; [ ! -f $(MATRIX) ] || cat $(MATRIX); exit $$status

# The matrices in docs/ (consumers.md, runtime.md), rewritten from fresh
# runs of the suites that write them (as root); every full run of each
# suite checks its committed copy's shape and says to run this when it
# drifted. A Kubernetes suite's page (docs/kubernetes.md) joins the same way.
.PHONY: docs
docs: consumers
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(MAKE) --no-print-directory e2e
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(GO) test -count=1 -timeout 20m -run '^TestContainerd$$' ./deploy/runtime/
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(GO) test -count=1 -timeout 20m -run '^TestNode$$' ./deploy/cluster/node/

# The NVIDIA DRA driver's kubelet plugin on a real single-node Kubernetes
# (deploy/cluster: etcd, the control plane, containerd and a kubelet in
# private namespaces, as root), for every profile of the consumer matrix's
# set: its ResourceSlices' pcieRoot per GPU, claims aligned on a PCIe root
# by kube-scheduler, and a pod that runs verify with its claim. The
# matrix goes to K8S_MATRIX and is printed; the API objects judged go to
# bin/k8s/<profile>/. deploy/cluster/node runs our deploy there (the
# manifests applied, GFD and nfd-worker labelling the Node, a re-profile
# through the ConfigMap; docs/kubernetes.md), deploy/cluster/passthrough
# the kubevirt GPU device plugin. One package at a time: each starts its
# own node.
# E2E_SABOTAGE=escaped or no-tree must turn rows red: the DRA suite serves
# its plugin escaped links (or no tree); the node suite, whose tree is the
# DaemonSet's, withholds it from its served GFD and nfd-worker pods.
# E2E_PROFILES adds profiles to the DRA suite's set only; the node suite
# deploys the standalone ConfigMap's profile, then gb200-tray, and the
# passthrough suite runs its own two profiles.
K8S_OBJECTS := bin/k8s
K8S_MATRIX  := $(K8S_OBJECTS)/matrix.md
e2e-k8s: consumers
	@mkdir -p $(K8S_OBJECTS); rm -f $(K8S_MATRIX)
	@NVML_MOCK_SYSFS_E2E_SABOTAGE=$(E2E_SABOTAGE) NVML_MOCK_SYSFS_E2E_PROFILES=$(E2E_PROFILES_ABS) NVML_MOCK_SYSFS_K8S_MATRIX=$(CURDIR)/$(K8S_MATRIX) NVML_MOCK_SYSFS_K8S_OBJECTS=$(CURDIR)/$(K8S_OBJECTS) $(GO) test -p 1 -v -count=1 -timeout 60m ./deploy/cluster/...; \
		status=$$?; [ ! -f $(K8S_MATRIX) ] || cat $(K8S_MATRIX); exit $$status

bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

clean:
	rm -rf bin
