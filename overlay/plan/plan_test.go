package plan_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

func machine(t *testing.T, nameOrPath string, h boards.Hierarchy) *profile.Machine {
	t.Helper()
	p, src, err := shipped.Load(nameOrPath)
	require.NoError(t, err)
	m, err := profile.Normalize(src, p, profile.Options{Hierarchy: h})
	require.NoError(t, err)
	return m
}

func mustPlan(t *testing.T, m *profile.Machine, opts plan.Options) *plan.Plan {
	t.Helper()
	p, err := plan.New(m, opts)
	require.NoError(t, err)
	checkPlan(t, p)
	return p
}

// profilesUnderTest is every built-in, every profile in testdata and every
// nvml-mock profile (nvmlMockProfiles: without ../shared, a subtest of t
// stops, failing under make).
func profilesUnderTest(t *testing.T) []string {
	names := shipped.Names()
	local, _ := filepath.Glob("../../testdata/profiles/*.yaml")
	return append(append(names, local...), nvmlMockProfiles(t)...)
}

func TestPlanEveryProfileEveryHierarchy(t *testing.T) {
	for _, name := range profilesUnderTest(t) {
		for _, h := range append([]boards.Hierarchy{""}, boards.Hierarchies()...) {
			t.Run(filepath.Base(name)+"/"+string(h), func(t *testing.T) {
				p, src, err := shipped.Load(name)
				require.NoError(t, err)
				m, err := profile.Normalize(src, p, profile.Options{Hierarchy: h})
				if err != nil && (h == boards.HGX || h == boards.DGX) {
					// Only a flat layout may put a GPU on its root bus.
					require.ErrorContains(t, err, "only a flat (VM) hierarchy puts a device on the root bus")
					return
				}
				require.NoError(t, err)
				mustPlan(t, m, plan.Options{})
			})
		}
	}
}

// checkPlan asserts what every plan must hold: plancheck's invariants
// (paths, modes, links resolving inside the overlay, lexical pcieRoot,
// bridge ranges, anchors and the links directory's order, config space).
func checkPlan(t *testing.T, p *plan.Plan) {
	t.Helper()
	hostDevices := "" // no link may leave the overlay...
	if len(p.HostDevices) > 0 {
		hostDevices = plan.DefaultHostSysfs + "/devices" // ...but those into the host's own devices
	}
	require.Empty(t, plancheck.CheckPlan(p, hostDevices))
}

func TestTightNumberingStillHasAnAnchor(t *testing.T) {
	p := mustPlan(t, machine(t, "../../testdata/profiles/tight.yaml", ""), plan.Options{})
	var out strings.Builder
	require.NoError(t, p.Tree.Format(&out))
	require.Equal(t, `pci0000:00 (numa 0)
  0000:00:01.0 [8086:2030] root port, buses 01-01
    0000:01:00.0 [10de:2330] endpoint: gpu, anchor 0000:03:00.0
  0000:00:02.0 [8086:2030] root port, buses 02-02
    0000:02:00.0 [10de:2330] endpoint: gpu, anchor 0000:03:00.0
  0000:00:03.0 [8086:2030] root port, buses 03-04
    0000:03:00.0 [1a03:1150] PCI bridge, buses 04-04, anchor
pci0000:40 (numa 1)
  0000:40:01.0 [8086:2030] root port, buses 41-41
    0000:41:00.0 [10de:2330] endpoint: gpu, anchor 0000:03:00.0
  0000:40:02.0 [8086:2030] root port, buses 42-42
    0000:42:00.0 [10de:2330] endpoint: gpu, anchor 0000:03:00.0
`, out.String())
}

func TestHierarchyShapes(t *testing.T) {
	depthOf := func(p *plan.Plan) map[string]int {
		out := map[string]int{}
		for _, n := range p.Tree.Nodes() {
			if !n.Role.IsBridge() {
				out[n.Address.String()] = n.Depth()
			}
		}
		return out
	}
	h100 := depthOf(mustPlan(t, machine(t, "hgx-h100", ""), plan.Options{}))
	require.Equal(t, 6, h100["0000:53:00.0"], "root port, switch up, switch down, GPU")
	a100 := depthOf(mustPlan(t, machine(t, "dgx-a100", ""), plan.Options{}))
	require.Equal(t, 8, a100["0000:07:00.0"], "root port and two cascaded switches")
	flat := depthOf(mustPlan(t, machine(t, "gb200-tray", ""), plan.Options{}))
	require.Equal(t, 4, flat["0000:29:00.0"], "behind one root port")
	vm := depthOf(mustPlan(t, machine(t, "t4-vm", ""), plan.Options{}))
	require.Equal(t, 3, vm["0000:00:1e.0"], "on the root bus")
}

// nvl72 is a generated profile: 72 GPUs over 18 root complexes in two domains.
func nvl72(t *testing.T) *profile.Machine {
	var b strings.Builder
	b.WriteString("device_defaults:\n  pci: {device_id: 0x294110DE, subsystem_id: 0x204610DE}\ndevices:\n")
	var rcs strings.Builder
	rcs.WriteString("pcie_topology:\n  hierarchy: hgx\n  root_complexes:\n")
	for rc := 0; rc < 18; rc++ {
		domain, bus := rc/9, (rc%9)*0x1c
		fmt.Fprintf(&rcs, "    - id: pci%04x:%02x\n      numa_node: %d\n      devices: [", domain, bus, rc%4)
		for g := 0; g < 4; g++ {
			bdf := fmt.Sprintf("%04x:%02x:00.%d", domain, bus+3+g*5, g%2)
			fmt.Fprintf(&b, "  - pci: {bus_id: %q}\n", bdf)
			fmt.Fprintf(&rcs, "%q, ", bdf)
		}
		rcs.WriteString("]\n")
	}
	p, err := profile.Parse("nvl72", []byte(b.String()+rcs.String()))
	require.NoError(t, err)
	m, err := profile.Normalize("nvl72", p, profile.Options{})
	require.NoError(t, err)
	require.Len(t, m.GPUs(), 72)
	return m
}

func TestSeventyTwoGPUs(t *testing.T) {
	p := mustPlan(t, nvl72(t), plan.Options{})
	require.Len(t, p.Tree.RootComplexes, 18)
}

func TestDeterministic(t *testing.T) {
	m := machine(t, "dgx-a100", "")
	a, b := mustPlan(t, m, plan.Options{}), mustPlan(t, machine(t, "dgx-a100", ""), plan.Options{})
	require.Equal(t, a.Digest(), b.Digest())
	require.Equal(t, a.Entries, b.Entries)
	c := mustPlan(t, m, plan.Options{ContainerRoot: "/srv/mock"})
	require.NotEqual(t, a.Digest(), c.Digest())
}

func TestLoopLink(t *testing.T) {
	for root, want := range map[string]string{"/opt/nvml-mock": "..", "/nvml": ".", "/srv/a/b": "../.."} {
		p := mustPlan(t, machine(t, "t4-vm", ""), plan.Options{ContainerRoot: root})
		var got string
		for _, e := range p.Entries {
			if e.Path == strings.TrimPrefix(root, "/") {
				got = e.Target
			}
		}
		require.Equal(t, want, got, root)
	}
	for _, bad := range []string{"opt/x", "/", "/opt/x/", "/opt/../x", "/sys/x", "/proc", "/bin/x"} {
		_, err := plan.New(machine(t, "t4-vm", ""), plan.Options{ContainerRoot: bad})
		require.ErrorContains(t, err, "container root", bad)
	}
}

func TestHostDevicesAreAvoided(t *testing.T) {
	host := []plan.HostDevice{
		{Address: pciaddr.Address{Bus: 0, Device: 1}, Target: "../../../devices/pci0000:00/0000:00:01.0"},
		{Address: pciaddr.Address{Bus: 1}, Target: "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0"},
	}
	p := mustPlan(t, machine(t, "t4-vm", ""), plan.Options{HostDevices: host})
	var anchors []string
	for _, n := range p.Tree.Nodes() {
		if n.Role.IsBridge() {
			anchors = append(anchors, n.Address.String())
		}
	}
	require.Equal(t, []string{"0000:00:02.0", "0000:02:00.0"}, anchors, "neither a host BDF nor a host bus")
	targets := map[string]string{}
	for _, e := range p.Entries {
		targets[e.Path] = e.Target
	}
	require.Equal(t, host[0].Target, targets[plan.LinksDir+"/0000:00:01.0"], "kernel form, resolves into the real /sys/devices")
	require.Equal(t, "/sys/devices/pci0000:00/0000:00:01.0", targets["sys/devices/pci0000:00/0000:00:01.0"], "the host side follows on to the host's device")

	// A host bridge's whole range is the host's, though no device sits on
	// buses 02-05 (an empty hot-plug port, a switch with free ports).
	bridge := host[0]
	bridge.Buses = plan.BusRange{First: 1, Last: 5, Owner: bridge.Address}
	p = mustPlan(t, machine(t, "t4-vm", ""), plan.Options{HostDevices: []plan.HostDevice{bridge, host[1]}})
	anchors = nil
	for _, n := range p.Tree.Nodes() {
		if n.Role.IsBridge() {
			anchors = append(anchors, n.Address.String())
		}
	}
	require.Equal(t, []string{"0000:00:02.0", "0000:06:00.0"}, anchors, "no bus of a host bridge's range")

	// A GPU the profile pins on a bus the host owns cannot be reached.
	pinned, err := profile.Parse("pinned.yaml", []byte("device_defaults:\n  pci: {device_id: 0x1EB810DE}\ndevices:\n  - pci: {bus_id: \"0000:03:00.0\"}\n"))
	require.NoError(t, err)
	onHostBus, err := profile.Normalize("pinned.yaml", pinned, profile.Options{})
	require.NoError(t, err)
	_, err = plan.New(onHostBus, plan.Options{HostDevices: []plan.HostDevice{bridge}})
	require.ErrorContains(t, err, "mock gpu 0000:03:00.0 sits on bus 0000:03, which the host's host bridge 0000:00:01.0 (buses 01-05) owns: no mock bridge can lead there")

	clash := []plan.HostDevice{{Address: pciaddr.Address{Bus: 0, Device: 0x1e}, Target: "../../../devices/pci0000:00/0000:00:1e.0"}}
	_, err = plan.New(machine(t, "t4-vm", ""), plan.Options{HostDevices: clash})
	require.ErrorContains(t, err, "mock gpu 0000:00:1e.0 collides with host device 0000:00:1e.0")
}
