# nvml-mock-sysfs: render mock NVIDIA GPUs into PCI sysfs.
GO        ?= go
BIN       := bin/nvml-mock-sysfs
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOTESTSUM   := gotest.tools/gotestsum@v1.13.0
# One static binary: containers run it from the overlay, whatever their libc.
export CGO_ENABLED := 0

.PHONY: help all build deps vet lint programs test test-quick test-root e2e e2e-k8s docs bench fuzz fuzz-run clean

all: build

help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# -buildvcs=auto: --version shows the git revision even where GOFLAGS turns
# stamping off (a git worktree is not stamped: the Go tool does not see it).
# -s -w: no symbol table or DWARF, which only a debugger reads: 35.1 MB,
# where the unstripped binary is 48.4 MB. Panics still name functions and
# lines (the pcln table stays), and --version still reads the build info.
build: ## the static binary, bin/nvml-mock-sysfs, stripped
	$(GO) build -trimpath -buildvcs=auto -ldflags='-s -w' -o $(BIN) ./cmd/nvml-mock-sysfs

deps: ## install, from Debian, the real programs the tests drive (as root)
	@./.ci/install-deps

# The product and the end-to-end wing are two modules: the wing
# (deploy/e2e, its own go.mod) requires the product through a replace of
# this checkout, so the product's go.mod holds nothing only the tests use.
# go -C runs a command in the wing's module. .ci/testsummary.go is a
# program of its own, outside both.
WING := deploy/e2e

vet: ## go vet, both modules and .ci
	$(GO) vet ./...
	$(GO) -C $(WING) vet ./...
	$(GO) vet .ci/testsummary.go

lint: vet ## go vet and staticcheck
	$(GO) run $(STATICCHECK) ./...
	$(GO) -C $(WING) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) .ci/testsummary.go

# The programs a registry serves (GFD, nfd, containerd, crictl, etcd, the
# kube binaries, helm, our own small ones), built into the user's cache with one
# progress line each: a cold build takes many minutes, and go test shows
# nothing until a package ends. A warm cache rebuilds nothing. The programs
# no registry serves are supplied in $NVML_MOCK_SYSFS_PROGRAMS
# (deploy/e2e/programs); this says which are, and which rows say not run.
programs: ## build the end-to-end suites' programs from the Go module proxy
	$(GO) -C $(WING) run ./programs/build-programs -repo $(CURDIR)

# The tiers. The suites are packages: the end-to-end wing is deploy/e2e,
# whose consumer and containerd suites and the binary's own runs are e2e,
# whose Kubernetes suites (one cluster at a time: kubetest holds a lock)
# are e2e-k8s. Their paths are the wing module's.
E2E_PKGS := ./consumermatrix ./containerdtest ./writable ./cli
K8S_PKGS := ./kubetest/... ./dra ./node ./passthrough ./sriovdra ./publisher ./kwok

# Under make a missing prerequisite fails (overlaytest.Missing); the suites
# write their matrices where make prints them. E2E_SABOTAGE=escaped or
# no-tree breaks the tree every suite serves, on purpose; make test's
# deploy/e2e/sabotage runs the suites so and names the rows that must turn
# red.
# E2E_PROFILES=a.yaml:b.yaml adds profiles to the consumer matrix and TestDRA,
# and runs each through TestNode's ConfigMap; E2E_FLEET=a.yaml:b.yaml gives
# TestFleet its profiles, one per worker node, in order. E2E_KWOK_NODES=N
# sizes TestKWOK's fleet of KWOK nodes (50, its least, by default).
MATRIX      := bin/consumer-matrix.md
RUNTIME_MATRIX := bin/runtime-matrix.md
K8S_OBJECTS := bin/k8s
K8S_MATRIX  := $(K8S_OBJECTS)/matrix.md
TESTEVENTS  := bin/test-events
space := $(subst ,, )
E2E_PROFILES_ABS = $(subst $(space),:,$(abspath $(subst :, ,$(E2E_PROFILES))))
E2E_FLEET_ABS = $(subst $(space),:,$(abspath $(subst :, ,$(E2E_FLEET))))
SUITE_ENV = NVML_MOCK_SYSFS_UNDER_MAKE=1 \
	NVML_MOCK_SYSFS_E2E_SABOTAGE=$(E2E_SABOTAGE) \
	NVML_MOCK_SYSFS_E2E_PROFILES=$(E2E_PROFILES_ABS) \
	NVML_MOCK_SYSFS_E2E_FLEET=$(E2E_FLEET_ABS) \
	NVML_MOCK_SYSFS_E2E_KWOK_NODES=$(E2E_KWOK_NODES) \
	NVML_MOCK_SYSFS_MATRIX=$(CURDIR)/$(MATRIX) \
	NVML_MOCK_SYSFS_RUNTIME_MATRIX=$(CURDIR)/$(RUNTIME_MATRIX) \
	NVML_MOCK_SYSFS_K8S_MATRIX=$(CURDIR)/$(K8S_MATRIX) \
	NVML_MOCK_SYSFS_K8S_OBJECTS=$(CURDIR)/$(K8S_OBJECTS)

# The passes of a test target, each a name with its packages (PKGS_name),
# go test flags (FLAGS_name) and environment (ENV_name). The unit tier is
# every package outside the wing: its tests run in a random order (go test
# prints each package's "-test.shuffle N"; the closing line repeats it for
# a package that failed, so `go test -shuffle N` replays the order), and
# the packages whose tests drive state machines run three times, so a test
# that passes in one order or on a first run only fails every time, not by
# chance. The unit tier runs under the race detector: the writable mode's
# FUSE writes and serve's loop share a tree, and a race there passes every
# plain run. -race needs cgo, so these passes set CGO_ENABLED=1; the tests
# that build the binary build it CGO_ENABLED=0 themselves. The wing's
# suites keep their order: their matrices are written in it.
MODULE        := github.com/nvml-mock/nvml-mock-sysfs
STATEFUL_PKGS := ./overlay/writer ./deploy/fusetree ./deploy/serve
PKGS_unit      = $(filter-out $(patsubst ./%,$(MODULE)/%,$(STATEFUL_PKGS)),$(shell $(GO) list ./...))
FLAGS_unit    := -shuffle=on -race
ENV_unit      := CGO_ENABLED=1
PKGS_stateful := $(STATEFUL_PKGS)
FLAGS_stateful := -shuffle=on -count=3 -race
ENV_stateful  := CGO_ENABLED=1
PKGS_wing     := ./...
DIR_wing      := $(WING)
PKGS_e2e      := $(E2E_PKGS)
DIR_e2e       := $(WING)
PKGS_k8s      := $(K8S_PKGS)
DIR_k8s       := $(WING)

# run-tests runs the passes $(1) under gotestsum, each in its module
# (DIR_name, the product's by default) with go test flags $(2) besides
# its own, prints the matrices the suites wrote, then the closing line
# (.ci/testsummary.go: passed, failed, skipped, and the rows not run for a
# program not supplied), failing if any pass failed.
define run-tests
	@mkdir -p bin $(K8S_OBJECTS); rm -f $(MATRIX) $(RUNTIME_MATRIX) $(K8S_MATRIX) $(TESTEVENTS)-*.json
	@status=0; $(foreach p,$(1),echo "go test: the $(p) pass"; \
		$(SUITE_ENV) $(ENV_$(p)) $(GO) -C $(or $(DIR_$(p)),.) run $(GOTESTSUM) --format pkgname --jsonfile $(CURDIR)/$(TESTEVENTS)-$(p).json -- \
			-count=1 $(2) $(FLAGS_$(p)) $(PKGS_$(p)) || status=1;) \
		for m in $(MATRIX) $(RUNTIME_MATRIX) $(K8S_MATRIX); do [ ! -f $$m ] || cat $$m; done; \
		$(GO) run .ci/testsummary.go $(foreach p,$(1),$(TESTEVENTS)-$(p).json) || status=1; exit $$status
endef

test: deps build lint programs fuzz-run ## everything: every package, every suite, the fuzz seeds (as root)
	$(call run-tests,unit stateful wing,-timeout 60m)

# The two modules' quick tiers run side by side, as one go test of the old
# single module ran their packages.
test-quick: ## the quick tier: go test -short, no apt, no root needed
	@status=0; $(GO) test -short -count=1 -shuffle=on ./... & product=$$!; \
		$(GO) -C $(WING) test -short -count=1 -shuffle=on ./... || status=1; \
		wait $$product || status=1; exit $$status

test-root: deps ## every package but the end-to-end suites' long runs (-short, as root)
	$(call run-tests,unit stateful wing,-short -timeout 20m)

e2e: deps build programs ## the consumer matrix and the containerd suites (as root)
	$(call run-tests,e2e,-timeout 40m)

e2e-k8s: deps build programs ## the Kubernetes suites on a real node (as root)
	$(call run-tests,k8s,-timeout 40m)

# The matrices in docs/evidence/ (consumers.md, runtime.md, kubernetes.md),
# rewritten from fresh runs of the suites that write them (as root); every
# full run of each suite checks its committed copy's shape and says to run
# this when it drifted. TestDRA, run with the drivers supplied, records the
# slices they published into overlay/resourceslices/testdata (the real runs
# TestRecordedRun proves the slices command against); without them its rows
# are not run and nothing is recorded.
docs: deps build programs ## rewrite docs/evidence's matrices and the recorded driver runs from fresh runs
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(MAKE) --no-print-directory e2e
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(SUITE_ENV) $(GO) -C $(WING) test -count=1 -timeout 20m -run '^TestNode$$' ./node/
	NVML_MOCK_SYSFS_UPDATE_DOCS=1 $(SUITE_ENV) $(GO) -C $(WING) test -count=1 -timeout 30m -run '^TestDRA$$' ./dra/

# Fuzz targets as package:Target. -fuzz takes one target per go test run.
# make test runs each for FUZZTIME with its seed corpus (testdata/fuzz and
# the seeds the targets add); make fuzz runs each for FUZZTIME_LONG.
# make test's budget is a count of inputs, not a duration: Go 1.26's fuzz
# coordinator can fail a target with a bare "context deadline exceeded"
# when a duration ends while a worker is mid-input on a busy machine
# (golang/go#75804, fixed in Go 1.27), which CI hit once with no input at
# fault; a count has no deadline to race. 500 inputs take 2 to 9 s a
# target here.
FUZZ_TARGETS  := ./overlay/profile:FuzzParse ./overlay/plan:FuzzPlanInvariants ./overlay/capture:FuzzNvidiaSMI ./deploy/fleet:FuzzParse ./deploy/serve:FuzzWrite
FUZZTIME      ?= 500x
FUZZTIME_LONG ?= 5m

fuzz-run:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s "$${t%%:*}"; \
	done

fuzz: ## each fuzz target for FUZZTIME_LONG (5m)
	$(MAKE) --no-print-directory fuzz-run FUZZTIME=$(FUZZTIME_LONG)

# BenchmarkKWOK (deploy/e2e/kwok, as root) builds a KWOK fleet on a real
# control plane for each size KWOK_BENCH_NODES lists and prints its
# figures; 100 nodes by default, as 1,000 take minutes of a 2-core machine:
# make bench KWOK_BENCH_NODES=100,500,1000.
bench: build ## the benchmarks (KWOK_BENCH_NODES=100,500,1000 sizes the KWOK fleet's)
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...
	NVML_MOCK_SYSFS_KWOK_BENCH_NODES=$(KWOK_BENCH_NODES) $(GO) -C $(WING) test -timeout 60m -run '^$$' -bench . -benchmem -count 1 ./...

clean: ## remove bin/
	rm -rf bin
