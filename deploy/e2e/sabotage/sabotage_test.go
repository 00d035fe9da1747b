// Package sabotage_test holds the end-to-end suites to their negative
// controls: each suite that serves our tree is run with E2E_SABOTAGE
// (programs.SabotageEnv) escaped and no-tree, as make e2e E2E_SABOTAGE=...
// runs it, and must turn exactly the rows named here red, keeping every
// other row green. A check that cannot fail, or a sabotage that stops a
// suite before its later rows, turns this test red.
package sabotage_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// suite is one end-to-end suite run sabotaged.
type suite struct {
	name string
	pkg  string // relative to the repository's top
	// run selects what runs: one profile where a suite runs many, so
	// that make test pays for two more runs of each suite, not of each
	// profile.
	run string
	// matrixEnv names the variable that tells the suite where to write
	// its matrix.
	matrixEnv string
	// cells are every cell the run must write (docmatrix.ReadVerdicts
	// names them), whatever was supplied: a run that lacks one stopped
	// before it. Every cell the run writes that red does not name must
	// be green, but those of unchecked, which a full run leaves – (a
	// consumer not run in that mode), and any cell may say its program
	// was not supplied.
	cells, unchecked []string
	// red names, by sabotage, the cells that must turn red.
	red map[string][]string
}

// committedCells are the cells of a suite's committed table in docs/
// (page: its path as the suites' tests name it, which is the same from
// this package, and its Suite where the page holds several tables) whose
// names start with one of prefixes (all, without), and those of them it
// leaves – by design.
func committedCells(t *testing.T, page docmatrix.Page, prefixes ...string) (cells, unchecked []string) {
	t.Helper()
	path := page.Path
	table, err := page.Committed()
	require.NoError(t, err)
	v := docmatrix.ReadVerdicts(table)
	selected := func(names []string) []string {
		return slices.DeleteFunc(slices.Clone(names), func(n string) bool {
			return len(prefixes) > 0 && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(n, p+" | ") })
		})
	}
	cells = selected(slices.Concat(v.Red, v.Green, v.NotSupplied, v.Unjudged))
	require.NotEmpty(t, cells, "%s: no cell of %q", path, prefixes)
	return cells, selected(v.Unjudged)
}

func suites(t *testing.T) []suite {
	// The cells of one consumer-matrix profile served the tree that read
	// it: every consumer's with no tree, deviceattribute's alone with
	// escaped links (the others resolve them).
	tree := func(profile string, columns ...string) []string {
		var cells []string
		for _, c := range columns {
			cells = append(cells, profile+" | tree / "+c)
		}
		return cells
	}
	const (
		gfd      = "GFD gpu.mode, gpu.count"
		machine  = "GFD gpu.machine"
		vfio     = "GFD vfio strategy"
		pcieRoot = "pcieRoot (deviceattribute on NVML's bus ids)"
		nfd      = "nfd-worker PCI labels"
		operator = "nfd-worker, GPU Operator's config"
		ghw      = "ghw.PCI()"
		nvml     = "NVML GPUs = sysfs GPUs"
	)
	// The containerd routes that serve our spec and must see the tree.
	const (
		ctrDevice   = "ctr run | `--device mock.nvidia.com/pcisysfs=all`"
		criDevices  = "CRI | `CDI_devices` (a device plugin's or DRA driver's answer)"
		criAnnotate = "CRI | a `cdi.k8s.io/` annotation"
		merged      = "CRI, nvml-mock's spec merged | `CDI_devices` `nvidia.com/gpu=all`"
		injector    = "NRI device-injector (compatibility) | `cdi-devices.noderesource.dev/container.<name>`, or `mounts.noderesource.dev/container.<name>` (`mounts --format json`)"
		mockNRI     = "NRI nvml-mock-nri (shims without libpcimocksys) | `nvml-mock.nvidia.com/devices: \"true\"`"
		nvmlList    = "NRI serve --nri --nri-inject annotated, deviceattribute on NVML's bus ids (nvml-list) | `cdi-devices.noderesource.dev/container.<name>`"
		gfdServed   = "NRI serve --nri --nri-inject annotated, GPU Feature Discovery | `cdi-devices.noderesource.dev/container.<name>`"
	)
	// serve --nri's rows that read the tree. A sabotaged run serves it a
	// root it cannot render (serve re-renders any root it is given, so it
	// cannot serve the escaped copy), so both sabotages turn them red, the
	// consumers it serves among them; its controls and its rows of an
	// unrendered tree stay green.
	serveNRI := []string{gfdServed, nvmlList,
		"NRI nvml-mock-nri (shims without libpcimocksys) beside serve --nri | nothing",
		"NRI serve --nri (node-wide, the default) | nothing",
		"NRI serve --nri (node-wide, the default) | nothing; the node's `/sys` mounted at `/sys` (GFD's own chart)",
		"NRI serve --nri (node-wide, the default) | `cdi-devices.noderesource.dev/container.<name>` naming `mock.nvidia.com/pcisysfs=gpu0`",
		"NRI serve --nri --nri-inject annotated | `cdi-devices.noderesource.dev/container.<name>` (no device-injector)",
		"NRI serve --nri --nri-inject annotated | `nvml-mock-sysfs.nvidia.com/inject: \"true\"`",
		"NRI serve --nri --nri-inject selected --nri-namespaces gpu --nri-pod-selector app=gfd | nothing; labelled `app=gfd`, in `gpu`",
		"NRI serve --nri, restarted | nothing, created after containerd restarted",
	}
	consumerCells, consumerUnchecked := committedCells(t, docmatrix.Page{Path: "../../../docs/evidence/consumers.md"}, "built-in dgx-a100", "vfio-passthrough")
	runtimeCells, _ := committedCells(t, docmatrix.Page{Path: "../../../docs/evidence/runtime.md"})
	nodeCells, nodeUnchecked := committedCells(t, docmatrix.Page{Path: "../../../docs/evidence/kubernetes.md"})
	hookCells, hookUnchecked := committedCells(t, docmatrix.Page{Path: procHookPage, Suite: "deploy/e2e/containerdtest TestProcHook"})
	hookNRICells, hookNRIUnchecked := committedCells(t, docmatrix.Page{Path: procHookPage, Suite: "deploy/e2e/containerdtest TestServeNRIProcHook"})
	unjudgedNUMA := numaUnjudged(t, "built-in dgx-a100", "vfio-passthrough", listAttributes)
	// TestFleet's upgrade row reads a link's text, the new slices'
	// pcieRoot, only where the DRA driver is supplied to publish them;
	// without it the row judges the labels alone, which escaped links
	// still give (a run with nothing supplied, as CI's, saw it green).
	fleetEscaped := slices.Concat(fleetVerify, fleetPCIeRoot)
	if _, driver := programs.NeedSupplied(t, programs.GPUKubeletPlugin); driver {
		fleetEscaped = append(fleetEscaped, fleetUpgrade)
	}
	// The DRA suite's red cells by sabotage: escaped links lose what is
	// read from a link's text (pcieRoot), no tree that and what is read
	// through a link (numaNode).
	draRed := func(sabotage string, profiles ...string) []string {
		var cells []string
		for _, p := range profiles {
			cells = append(cells, draRows(p, sabotage)...)
			if p != "vfio-passthrough" {
				cells = append(cells, nicRows(p, sabotage)...)
			}
		}
		return without(cells, unjudgedNUMA)
	}
	return []suite{
		{
			name: "consumer matrix", pkg: "./consumermatrix",
			run: "^TestConsumers$/^profiles$/^(built-in_dgx-a100|vfio-passthrough)$", matrixEnv: "NVML_MOCK_SYSFS_MATRIX",
			cells: consumerCells, unchecked: consumerUnchecked,
			red: map[string][]string{
				programs.SabotageEscaped: append(tree("built-in dgx-a100", pcieRoot), tree("vfio-passthrough", pcieRoot)...),
				programs.SabotageNoTree: append(tree("built-in dgx-a100", gfd, machine, pcieRoot, nfd, operator, ghw, nvml),
					tree("vfio-passthrough", gfd, machine, vfio, pcieRoot, nfd, ghw, nvml)...),
			},
		},
		{
			name: "containerd", pkg: "./containerdtest",
			run: "^TestContainerd$", matrixEnv: "NVML_MOCK_SYSFS_RUNTIME_MATRIX",
			cells: runtimeCells,
			red: map[string][]string{
				programs.SabotageEscaped: append([]string{ctrDevice, criDevices, criAnnotate, merged, injector, mockNRI}, serveNRI...),
				// With no tree, nvml-mock-nri's overlay is empty too, so
				// its two controls that need the overlay turn red, and GFD
				// no longer finds its GPUs.
				programs.SabotageNoTree: append([]string{ctrDevice, criDevices, criAnnotate, merged, injector, mockNRI,
					"NRI nvml-mock-nri, its defaults | `nvml-mock.nvidia.com/devices: \"true\"`",
					"NRI nvml-mock-nri (shims without libpcimocksys) | nothing"}, serveNRI...),
			},
		},
		{
			// The hook reads regular files and the completion marker alone,
			// which the escaped copy keeps: nothing changes. Given a root
			// with no render, it mounts nothing: the rows with the hook that
			// read the rendered files turn red; its controls, its rows of a
			// broken or shared root (given the render itself) and the host's
			// stay green.
			name: "proc hook", pkg: "./containerdtest",
			run: "^TestProcHook$", matrixEnv: "NVML_MOCK_SYSFS_PROCHOOK_MATRIX",
			cells: hookCells, unchecked: hookUnchecked,
			red: map[string][]string{
				programs.SabotageEscaped: {},
				programs.SabotageNoTree:  procHookRed(t),
			},
		},
		{
			// serve --nri is served a root it cannot render under either
			// sabotage (as TestContainerd's serve --nri rows): every served
			// row turns red, the hook finding no render to mount and no
			// broken one to count; the opted-out control and the host's row
			// stay green.
			name: "proc hook through serve --nri", pkg: "./containerdtest",
			run: "^TestServeNRIProcHook$", matrixEnv: "NVML_MOCK_SYSFS_NRI_PROCHOOK_MATRIX",
			cells: hookNRICells, unchecked: hookNRIUnchecked,
			red: map[string][]string{
				programs.SabotageEscaped: procHookNRIRed(t, hookNRICells),
				programs.SabotageNoTree:  procHookNRIRed(t, hookNRICells),
			},
		},
		{
			// Nothing the node suite runs reads pcieRoot: escaped links
			// change none of its rows that read the tree (the escaped
			// copy keeps the module view the operand gate reads). The
			// escaped copy is served by hostPath volumes, which carry no
			// hook: the served /proc row turns red.
			name: "Kubernetes node", pkg: "./node",
			run: "^TestNode$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: nodeCells, unchecked: nodeUnchecked,
			red: map[string][]string{
				programs.SabotageEscaped: {nodeProcServed},
				programs.SabotageNoTree:  nodeNoTreeRed(t),
			},
		},
		{
			// The drivers read pcieRoot from a link's text: either
			// sabotage loses it, so no claim aligned on a root is
			// allocated and what follows the claim fails with it; the
			// escaped-links control and the claims that must stay
			// pending stay green. A GPU's or an HCA's NUMA node is read
			// through its link (go-nvlib's numa_node, dranet's), which an
			// escaped link still resolves: only no tree loses it, and
			// the claims matched on numaNode with it (draRows, nicRows).
			name: "DRA driver", pkg: "./dra",
			run: "^TestDRA$/^(built-in_dgx-a100|vfio-passthrough)$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells:     slices.Concat(draCells("built-in dgx-a100"), nicCells("built-in dgx-a100"), draCells("vfio-passthrough")),
			unchecked: unjudgedNUMA,
			red: map[string][]string{
				programs.SabotageEscaped: draRed(programs.SabotageEscaped, "built-in dgx-a100", "vfio-passthrough"),
				programs.SabotageNoTree:  draRed(programs.SabotageNoTree, "built-in dgx-a100", "vfio-passthrough"),
			},
		},
		{
			// Each node's labellers, verify and DRA driver are served
			// something else; the rows of the chart's render read the
			// node's tree itself. verify's rows include deviceattribute's
			// pcieRoot, which escaped links lose, as the driver's slices
			// do; its claims select by product and need no pcieRoot.
			name: "fleet", pkg: "./node",
			run: "^TestFleet$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: slices.Concat(fleetVerify, fleetPCIeRoot, fleetLabels, []string{
				"`helm install` with a fleet map | " + worker1,
				"`helm install` with a fleet map | " + worker2,
				"GFD and nfd-worker, without our tree | " + worker2,
				"the DRA driver's slices | " + worker2,
				"Node labelled `nvml-mock/profile=gb200` | " + worker2,
				"the other Nodes labelled | " + worker1,
				"a claim selecting `productName` NVIDIA A100-SXM4-40GB by CEL | " + worker1,
				"a claim selecting `productName` NVIDIA GB200 by CEL | " + worker2,
				"a claim for 9 GPUs | none",
				"`helm upgrade`: nvml-mock-worker-1 mapped to gb200 | " + worker2,
				fleetUpgrade,
				"`helm uninstall` | every node",
				"after the suite | every node",
			}),
			red: map[string][]string{
				programs.SabotageEscaped: fleetEscaped,
				programs.SabotageNoTree:  slices.Concat(fleetVerify, fleetPCIeRoot, fleetLabels, []string{fleetUpgrade}),
			},
		},
		{
			// The same checks as TestDRA's on the first profile with
			// HCAs, numaNode published as a list: the same rows need the
			// tree.
			name: "DRA driver, list-typed attributes", pkg: "./dra",
			run: "^TestDRAListAttributes$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells:     slices.Concat(draCells(listAttributes), nicCells(listAttributes)),
			unchecked: unjudgedNUMA,
			red: map[string][]string{
				programs.SabotageEscaped: draRed(programs.SabotageEscaped, listAttributes),
				programs.SabotageNoTree:  draRed(programs.SabotageNoTree, listAttributes),
			},
		},
		{
			// Every step reads the GPUs through the writable view: the
			// driver publishes them with their pcieRoot (a link's text)
			// and binds them there, and the pod's /dev/vfio is the group
			// the view names; the pod and the unprepare fail with the
			// prepare they follow. The prepare needs the module view's
			// vfio_pci, which the escaped copy of the read-only tree's
			// spec lacks (the driver's modprobe fails) and no tree lacks
			// too (the driver exits at its start, every step red).
			name: "DRA driver, VFIO passthrough", pkg: "./dra",
			run: "^TestVFIOPassthrough$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: vfioPassthrough,
			red: map[string][]string{
				programs.SabotageEscaped: vfioPassthrough,
				programs.SabotageNoTree:  vfioPassthrough,
			},
		},
		{
			// The driver's own chart, on the first profile: serve --nri
			// (and serve --writable --nri after it) is served a root it
			// cannot render under either sabotage, so the pod asking
			// nothing publishes no pcieRoot, and with PassthroughSupport
			// the driver finds no iommu_groups beneath /host-root and
			// exits; the opted-out control stays green.
			name: "DRA driver's own chart", pkg: "./dra",
			run: "^TestDRADriverChart$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: append([]string{driverChart + " | the driver's chart, its pod opted out"}, driverChartRed()...),
			red:   map[string][]string{programs.SabotageEscaped: driverChartRed(), programs.SabotageNoTree: driverChartRed()},
		},
		{
			// The plugin is served nothing in both (serve --writable cannot
			// serve an escaped copy): every row it judges turns red; the
			// write through the view stays green.
			name: "SR-IOV DRA driver", pkg: "./sriovdra",
			run: "^TestSRIOVDRA$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: append([]string{sriovWrite}, sriovPlugin...),
			red:   map[string][]string{programs.SabotageEscaped: sriovPlugin, programs.SabotageNoTree: sriovPlugin},
		},
		{
			// The KWOK fleet has no tree: its sabotage gives the
			// publisher the profiles without their pcie_topology, so that
			// it puts each PCI domain's GPUs and HCAs under one root, as a
			// driver would find them on a tree that lost the profile's
			// roots. Every row that reads the published pcieRoot turns
			// red: the slices' audit, the allocations by product, of a
			// whole root and of a GPU+HCA (each audits its devices' root
			// against the profile's), and the claim for one GPU more than
			// the profiles' largest root, which a domain's eight GPUs on
			// one root now satisfy. The claim of a product no profile has,
			// and the control (one node published without pcieRoot by
			// hand), stay green.
			name: "KWOK fleet", pkg: "./kwok",
			run: "^TestKWOK$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: slices.Concat(kwokRed, []string{
				"KWOK Nodes, each a profile by the fleet map's label rules",
				"a claim no node can satisfy: a product no profile has",
				"control: one node's slices published without `pcieRoot`, its whole root claimed on it",
			}),
			red: map[string][]string{programs.SabotageEscaped: kwokRed, programs.SabotageNoTree: kwokRed},
		},
		{
			name: "passthrough", pkg: "./passthrough",
			run: "^TestPassthrough$", matrixEnv: "NVML_MOCK_SYSFS_K8S_MATRIX",
			cells: []string{"built-in hgx-h100 (every GPU on nvidia)", "testdata/profiles/vfio-passthrough.yaml (3 of 4 GPUs on vfio-pci)"},
			red: map[string][]string{
				programs.SabotageEscaped: {},
				programs.SabotageNoTree: {
					"built-in hgx-h100 (every GPU on nvidia)",
					"testdata/profiles/vfio-passthrough.yaml (3 of 4 GPUs on vfio-pci)",
				},
			},
		},
	}
}

// nodeNoTreeRed are TestNode's rows that a run with no tree turns red:
// the served pods' and the re-profile's, v26.7.1's gate only where the
// kernel has /proc/modules (elsewhere it is not run, sabotaged or not).
func nodeNoTreeRed(t *testing.T) []string {
	red := []string{
		"GFD pod served our device",
		"nfd-worker pod served our device (links at `/host-sys/bus/pci/devices`)",
		"the GPU Operator's operand gate (main, aa22a385) in a pod asking nothing",
		nodeProcServed,
		"GFD's own chart (v0.17.4, values only), its pod asking nothing",
		"ConfigMap updated through the API to built-in gb200-tray (system.product_name GB200 compute tray)",
	}
	return withProcModules(t, red, "the GPU Operator's v26.7.1 operand gate in a pod asking nothing")
}

// nodeProcServed is TestNode's row of the /proc files the chart's hook
// serves.
const nodeProcServed = "`/proc/driver/nvidia/version` and `/proc/devices` in a pod asking nothing"

// driverChart is TestDRADriverChart's profile cell (the first of the
// suites' profiles).
const driverChart = "built-in dgx-a100 driver's chart"

// driverChartRed are TestDRADriverChart's rows that read the tree.
func driverChartRed() []string {
	return []string{
		driverChart + " | the driver's chart, its pod asking nothing",
		driverChart + " | the driver's chart with PassthroughSupport, a VFIO claim",
	}
}

// procHookPage holds the hook's two tables, TestProcHook's and
// TestServeNRIProcHook's.
const procHookPage = "../../../docs/design/prochook.md"

// procHookGate is the hook's rows of the GPU Operator v26.7.1 gate on
// /proc/modules (container's column: "with the hook", "served").
const procHookGate = "GPU Operator v26.7.1 gate, `" + programs.OperandGateV2671 + "` | "

// procHookRed are TestProcHook's rows that must turn red with no tree:
// those with the hook that read what it mounts, the gate's and lsmod's
// only where the kernel has /proc/modules (elsewhere they are not run,
// sabotaged or not).
func procHookRed(t *testing.T) []string {
	red := []string{
		"/proc/devices | with the hook",
		"/proc/driver/nvidia/version | with the hook",
		"every file of <root>/proc | with the hook",
		"the container's mounts below /proc | with the hook",
	}
	return withProcModules(t, red, procHookGate+"with the hook", "`lsmod` (kmod's, from the node's /usr) | with the hook")
}

// procHookNRIRed are TestServeNRIProcHook's served rows (cells, its
// committed ones, whose container is "served"), which both sabotages turn
// red: the gate's only where the kernel has /proc/modules.
func procHookNRIRed(t *testing.T, cells []string) []string {
	modules := hasProcModules(t)
	return slices.DeleteFunc(slices.Clone(cells), func(c string) bool {
		return !strings.HasSuffix(c, " | served") || (!modules && strings.HasPrefix(c, procHookGate))
	})
}

// withProcModules is red with rows, rows that read /proc/modules, where
// the kernel has it: elsewhere they are not run, sabotaged or not.
func withProcModules(t *testing.T, red []string, rows ...string) []string {
	t.Helper()
	if hasProcModules(t) {
		return append(red, rows...)
	}
	return red
}

// hasProcModules reports whether this kernel has /proc/modules (one built
// without modules has none, and the hook's gate rows are not run).
func hasProcModules(t *testing.T) bool {
	t.Helper()
	_, err := os.Stat("/proc/modules")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestFleet's workers, with its default profiles (nvml-mock's a100 and
// gb200; the sabotaged runs drop E2E_FLEET).
const (
	worker1 = "nvml-mock-worker-1"
	worker2 = "nvml-mock-worker-2"
)

// TestFleet's rows that read the tree as a consumer does: verify's, whose
// rows include deviceattribute's pcieRoot; the DRA driver's slices, each
// GPU with its pcieRoot; and the labels GFD and nfd-worker read from the
// tree (escaped links resolve for them).
var (
	fleetVerify = []string{
		"verify in a pod, the node's profile as NVML's | " + worker1,
		"verify in a pod, gb200's profile as NVML's | " + worker1,
		"verify in a pod, the node's profile as NVML's | " + worker2,
		"verify in a pod, a100's profile as NVML's | " + worker2,
	}
	fleetPCIeRoot = []string{
		"the DRA driver's slices | " + worker1,
		"the DRA driver's slices, served | " + worker1,
		"the DRA driver's slices, served | " + worker2,
		"`helm upgrade`: the DRA driver restarted | " + worker1,
	}
	fleetLabels = []string{
		"GFD and nfd-worker, served | " + worker1,
		"each Node's labels (GFD, nfd-worker, served) | " + worker1,
		"each Node's labels (GFD, nfd-worker, served) | " + worker2,
	}
)

// fleetUpgrade is TestFleet's upgrade of the first worker to the second
// profile: it judges the new labels (through the links) and, where the
// DRA driver is supplied, the driver's new slices with their pcieRoot (a
// link's text), so no tree turns it red, and escaped links do with the
// driver.
const fleetUpgrade = "`helm upgrade`: nvml-mock-worker-1 mapped to gb200 | " + worker1

// TestKWOK's rows that read each device's published pcieRoot (matched
// on, or audited against the profile).
var kwokRed = []string{
	"publishSlices: each node's gpu.nvidia.com and dra.net devices",
	"one GPU by `productName` (CEL), a pod per product",
	"a whole root: every GPU of one `pcieRoot` (matchAttribute), a pod per profile",
	"a GPU and an HCA on one `pcieRoot` (gpu.nvidia.com and dra.net, matchAttribute), a pod per profile with HCAs",
	"a claim no node can satisfy: one GPU more than the fleet's largest root, on one `pcieRoot`",
}

// listAttributes is TestDRAListAttributes' profile: the first of the
// set with HCAs, named for its own rows.
const listAttributes = "built-in dgx-a100 list-attributes"

// vfioPassthrough are TestVFIOPassthrough's rows (step | served).
var vfioPassthrough = []string{
	"publish | the writable view; its iommu_groups at /sys/kernel/iommu_groups",
	"prepare, as served | the writable spec's mounts: its module view at /sys/module (vfio_pci loaded), its modules.alias naming vfio_pci",
	"the pod's /dev/vfio/<group> | /dev/vfio/<group> on the node: a stand-in char device 1:3",
	"unprepare | the pod deleted",
}

// TestSRIOVDRA's rows: the write, and those of the plugin.
const sriovWrite = "sriov_numvfs written through the view"

var sriovPlugin = []string{
	"before the write, the tree as served",
	"before the write, a stand-in netdev under each PF",
	"after the write, the tree as served",
	"after the write, a stand-in netdev under each PF",
	"sriov_numvfs 0, a stand-in netdev under each PF",
}

// draCells are the DRA suite's rows of a profile (its draChecks), and
// draRows those of them that need its GPUs' pcieRoot or NUMA node.
func draCells(profile string) []string {
	return profileCells(profile, "escaped links", "slices", "claim fit", "claim too-many", "verify in the claim's pod", "unprepare", "verify in the claim's pod, opted out", "claim numaNode", "claim numaNode too-many")
}

// draRows are, by sabotage, the rows of draCells that read what it
// breaks: a link's text (pcieRoot: checkSlices, checkFit, checkVerify,
// checkUnprepare, and checkVerifyOptedOut, whose claim needs the GPUs'
// pcieRoot), and with no tree also a file read through a link (a GPU's
// numa_node: checkGPUNUMA).
func draRows(profile, sabotage string) []string {
	cells := profileCells(profile, "slices", "claim fit", "verify in the claim's pod", "unprepare", "verify in the claim's pod, opted out")
	if sabotage == programs.SabotageNoTree {
		cells = append(cells, profileCells(profile, "claim numaNode")...)
	}
	return cells
}

// nicCells are the DRA suite's rows of a profile's HCAs (its nicChecks;
// dranet's, not run without it), and nicRows those of them that need the
// tree's pcieRoot or NUMA node: the node's own NIC is among them because
// a GPU of the profile shares its root id only through the tree.
func nicCells(profile string) []string {
	return profileCells(profile, "dranet without the tree", "dranet slices", "GPU+HCA on each root", "GPUs+HCA on one root", "GPUs+HCA too-many", "GPU+HCA on each NUMA node", "GPUs+HCA numaNode too-many", "the node's own NIC", "prepare GPU+HCA")
}

// nicRows are, by sabotage, the rows of nicCells that read what it breaks,
// as draRows: pcieRoot (checkNICSlices, checkAlignRoot,
// checkAlignRootMost, checkNodeNIC, checkNICPrepare), and with no tree
// the NUMA nodes too (checkAlignNUMA).
func nicRows(profile, sabotage string) []string {
	cells := profileCells(profile, "dranet slices", "GPU+HCA on each root", "GPUs+HCA on one root", "the node's own NIC", "prepare GPU+HCA")
	if sabotage == programs.SabotageNoTree {
		cells = append(cells, profileCells(profile, "GPU+HCA on each NUMA node")...)
	}
	return cells
}

// numaUnjudged are the profiles' rows that match GPUs on numaNode where
// the supplied driver publishes none on a GPU (programs.PublishesNUMANode):
// the DRA suite says why they are not run, sabotaged or not. None where
// the driver does, or is not supplied (every row then says so).
func numaUnjudged(t *testing.T, profiles ...string) []string {
	t.Helper()
	plugin, ok := programs.NeedSupplied(t, programs.GPUKubeletPlugin)
	if !ok {
		return nil
	}
	publishes, err := programs.PublishesNUMANode(plugin)
	require.NoError(t, err)
	if publishes {
		return nil
	}
	var cells []string
	for _, p := range profiles {
		cells = append(cells, profileCells(p, "claim numaNode", "claim numaNode too-many", "GPU+HCA on each NUMA node", "GPUs+HCA numaNode too-many")...)
	}
	return cells
}

// without is cells but those of drop.
func without(cells, drop []string) []string {
	return slices.DeleteFunc(slices.Clone(cells), func(c string) bool { return slices.Contains(drop, c) })
}

// profileCells are the cells of a profile's checks, in the DRA suite's
// matrix.
func profileCells(profile string, checks ...string) []string {
	var cells []string
	for _, check := range checks {
		cells = append(cells, profile+" | "+check)
	}
	return cells
}

// TestSabotage runs each suite with each sabotage.
func TestSabotage(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	goTool := overlaytest.RequireProgram(t, "go", "golang")
	wing := hosttest.Wing(t)
	for _, s := range suites(t) {
		for _, sabotage := range []string{programs.SabotageEscaped, programs.SabotageNoTree} {
			t.Run(s.name+"/"+sabotage, func(t *testing.T) {
				matrix := filepath.Join(t.TempDir(), "matrix.md")
				cmd := exec.Command(goTool, "test", "-count=1", "-timeout", "20m", "-run", s.run, s.pkg)
				cmd.Dir = wing
				cmd.Env = append(withoutSuiteEnv(os.Environ()), programs.SabotageEnv+"="+sabotage, s.matrixEnv+"="+matrix)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				table, readErr := os.ReadFile(matrix)
				require.NoError(t, readErr, "%s wrote no matrix with %s=%s: %v\n%s", s.name, programs.SabotageEnv, sabotage, err, out.Bytes())
				v := docmatrix.ReadVerdicts(string(table))
				t.Logf("%s=%s: %d red, %d green, %d not supplied, %d not judged\n%s", programs.SabotageEnv, sabotage, len(v.Red), len(v.Green), len(v.NotSupplied), len(v.Unjudged), table)
				if wrong := judge(s, sabotage, v); len(wrong) > 0 {
					t.Fatalf("%s with %s=%s:\n%s\n%s", s.name, programs.SabotageEnv, sabotage, strings.Join(wrong, "\n"), out.Bytes())
				}
				if len(v.Red) > 0 {
					require.Error(t, err, "a suite with red rows must fail")
				} else {
					require.NoError(t, err, "a suite with no red row must pass:\n%s", out.Bytes())
				}
			})
		}
	}
}

// judge lists what is wrong with the verdicts a suite's run under
// sabotage wrote, none when each cell that must turn red is red, every
// other is green (or, for unchecked, –), and none is missing; a cell
// whose program was not supplied passes either way.
func judge(s suite, sabotage string, v docmatrix.Verdicts) []string {
	var wrong []string
	red := s.red[sabotage]
	written := slices.Concat(v.Red, v.Green, v.NotSupplied, v.Unjudged)
	if len(written) == 0 {
		return []string{"no verdict in its matrix"}
	}
	for _, c := range s.cells { // red among them: TestSuitesNameTheirCells
		if !slices.Contains(written, c) {
			wrong = append(wrong, "missing (the suite stopped before it): "+c)
		}
	}
	for _, c := range written {
		mustBeRed := slices.Contains(red, c)
		switch {
		case slices.Contains(v.NotSupplied, c):
		case mustBeRed && slices.Contains(v.Green, c):
			wrong = append(wrong, "green, must turn red: "+c)
		case mustBeRed && slices.Contains(v.Unjudged, c):
			wrong = append(wrong, "not judged, must turn red: "+c)
		case !mustBeRed && slices.Contains(v.Red, c):
			wrong = append(wrong, "red, must stay green: "+c)
		case !mustBeRed && slices.Contains(v.Unjudged, c) && !slices.Contains(s.unchecked, c):
			wrong = append(wrong, "not judged, must be green: "+c)
		}
	}
	return wrong
}

// withoutSuiteEnv drops the variables make sets for its own run of the
// suites (where they write their matrices, docs updates, extra profiles),
// which the sabotaged runs must not share.
func withoutSuiteEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(e string) bool {
		name, _, _ := strings.Cut(e, "=")
		return strings.HasPrefix(name, "NVML_MOCK_SYSFS_") && !slices.Contains([]string{overlaytest.UnderMakeEnv, programs.SuppliedEnv, "NVML_MOCK_SYSFS_CACHE"}, name)
	})
}
