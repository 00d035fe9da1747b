package plan_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// machineCase is a profile under one hierarchy choice.
type machineCase struct {
	name string
	m    *profile.Machine
}

// allMachines is every built-in profile under its own hierarchy and under
// each forced one, plus the nvml-mock profiles of ../shared when present.
func allMachines(t *testing.T) []machineCase {
	t.Helper()
	var out []machineCase
	for _, name := range shipped.Names() {
		for _, h := range append([]boards.Hierarchy{""}, boards.Hierarchies()...) {
			m, err := overlay.LoadMachine(name, h)
			if err != nil {
				// Only a GPU on its root bus may refuse a hierarchy, and
				// only a non-flat one.
				require.ErrorContains(t, err, "only a flat (VM) hierarchy", "%s --hierarchy %s", name, h)
				continue
			}
			out = append(out, machineCase{fmt.Sprintf("%s/%s", name, m.Hierarchy), m})
		}
	}
	return out
}

func sharedMachines(t *testing.T) []machineCase {
	t.Helper()
	dir := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out []machineCase
	for _, f := range files {
		for _, h := range boards.Hierarchies() {
			m, err := overlay.LoadMachine(f, h)
			require.NoError(t, err, f)
			out = append(out, machineCase{fmt.Sprintf("%s/%s", filepath.Base(f), h), m})
		}
	}
	return out
}

func TestTreeInvariants(t *testing.T) {
	for _, c := range allMachines(t) {
		t.Run(c.name, func(t *testing.T) { checkTreeOf(t, c.m) })
	}
	// nvml-mock's own profiles: this subtest skips without ../shared,
	// naming what is missing, and the built-in and in-repo ones above run
	// whatever happens.
	t.Run("shared", func(t *testing.T) {
		for _, c := range sharedMachines(t) {
			t.Run(c.name, func(t *testing.T) { checkTreeOf(t, c.m) })
		}
	})
}

func checkTreeOf(t *testing.T, m *profile.Machine) {
	tree, err := plan.BuildTree(m, plan.BuildOptions{})
	require.NoError(t, err)
	require.Empty(t, plancheck.CheckTree(m, tree, nil))
}

// chain lists the roles of an endpoint's ancestors, outermost first.
func chain(n *plan.Node) []plan.Role {
	var out []plan.Role
	for p := n.Parent; p != nil; p = p.Parent {
		out = append([]plan.Role{p.Role}, out...)
	}
	return out
}

func TestBuiltinHierarchies(t *testing.T) {
	hgx := []plan.Role{plan.RootPort, plan.SwitchUp, plan.SwitchDown}
	dgx := []plan.Role{plan.RootPort, plan.SwitchUp, plan.SwitchDown, plan.SwitchUp, plan.SwitchDown}
	tests := []struct {
		profile   string
		hierarchy boards.Hierarchy
		wantH     boards.Hierarchy
		gpuChain  []plan.Role
	}{
		{"hgx-h100", "", boards.HGX, hgx},
		{"dgx-a100", "", boards.DGX, dgx},
		{"gb200-tray", "", boards.Flat, []plan.Role{plan.RootPort}},
		{"t4-vm", "", boards.Flat, nil},
		// Only two buses lie between each H100's root bus and its GPU: room
		// for one switch, so DGX falls back to the HGX shape.
		{"hgx-h100", boards.DGX, boards.DGX, hgx},
		{"hgx-h100", boards.Flat, boards.Flat, []plan.Role{plan.RootPort}},
		{"dgx-a100", boards.HGX, boards.HGX, hgx},
		{"gb200-tray", boards.HGX, boards.HGX, hgx},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s", tc.profile, tc.hierarchy), func(t *testing.T) {
			m, err := overlay.LoadMachine(tc.profile, tc.hierarchy)
			require.NoError(t, err)
			require.Equal(t, tc.wantH, m.Hierarchy)
			tree, err := plan.BuildTree(m, plan.BuildOptions{})
			require.NoError(t, err)
			gpus := 0
			for _, n := range tree.Nodes() {
				if n.Role != plan.Endpoint || n.Device.Kind != profile.GPU {
					continue
				}
				gpus++
				require.Equal(t, tc.gpuChain, chain(n), "GPU %s", n.Address)
				if len(tc.gpuChain) >= 2 {
					// The first switch's upstream port sits four levels
					// below sys/, as pci0000:15/0000:15:01.0/0000:16:00.0.
					require.Equal(t, 4, n.Anchor.Depth())
					require.Equal(t, plan.SwitchUp, n.Anchor.Role)
				}
			}
			require.Equal(t, len(m.GPUs()), gpus)
		})
	}
}

// TestH100MatchesRealBoard checks the built-in hgx-h100 against the real HGX
// path pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0: the
// root port, switch ports and GPU on consecutive buses from the root bus.
func TestH100MatchesRealBoard(t *testing.T) {
	m, err := overlay.LoadMachine("hgx-h100", "")
	require.NoError(t, err)
	tree, err := plan.BuildTree(m, plan.BuildOptions{})
	require.NoError(t, err)
	for _, n := range tree.Nodes() {
		if n.Role != plan.Endpoint || n.Device.Kind != profile.GPU {
			continue
		}
		rc := n.RootComplex
		b := func(off int) uint8 { return rc.Bus + uint8(off) }
		want := fmt.Sprintf("devices/%s/%04x:%02x:01.0/%04x:%02x:00.0/%04x:%02x:00.0/%s",
			rc, rc.Domain, b(0), rc.Domain, b(1), rc.Domain, b(2), n.Address)
		require.Equal(t, want, n.SysPath())
		require.Equal(t, b(3), n.Address.Bus)
	}
}

// TestTreeRandomProfiles builds trees for many generated profiles, with
// buses packed tightly and sparsely, several domains and root complexes,
// GPUs on root buses and host devices in the way, and checks the same
// invariants (plancheck.CheckTree). A fixed seed keeps it repeatable.
func TestTreeRandomProfiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 2024))
	built := 0
	for i := range 400 {
		p, reserved := randomProfile(rng)
		h := boards.Hierarchies()[rng.IntN(3)]
		m, err := profile.Normalize(fmt.Sprintf("random-%d", i), p, profile.Options{Hierarchy: h})
		if err != nil {
			continue // the generator may write profiles the normaliser refuses
		}
		tree, err := plan.BuildTree(m, plan.BuildOptions{Reserved: reserved})
		require.NoError(t, err, "random-%d (%s): %v", i, h, describeProfile(p))
		require.Empty(t, plancheck.CheckTree(m, tree, reserved), "random-%d (%s)", i, h)
		built++
	}
	require.Greater(t, built, 200, "the generator should mostly write valid profiles")
}

func describeProfile(p *profile.Profile) string {
	out, _ := profile.Marshal(p, "")
	return string(out)
}

func randomProfile(rng *rand.Rand) (*profile.Profile, []pciaddr.Address) {
	p := &profile.Profile{
		DeviceDefaults: profile.DeviceConfig{PCI: profile.PCIConfig{DeviceID: profile.Pack(boards.VendorNVIDIA, []uint16{0x2330, 0x20b0, 0x1eb8}[rng.IntN(3)])}},
		PCIeTopology:   &profile.PCIeTopology{},
	}
	used := map[pciaddr.Address]bool{}
	domains := 1 + rng.IntN(2)
	var reserved []pciaddr.Address
	for d := range domains {
		// Root complexes at increasing buses.
		nRC := 1 + rng.IntN(4)
		bus := 0
		if rng.IntN(2) == 0 {
			bus = rng.IntN(0x40)
		}
		for range nRC {
			if bus > 0xf0 {
				break
			}
			rc := profile.RootComplexConfig{ID: pciaddr.RootComplex{Domain: uint16(d), Bus: uint8(bus)}.String(), NUMANode: ptr(rng.IntN(3) - 1)}
			span := 1 + rng.IntN(0x40)
			next := min(bus+span, 0x100)
			gpus := rng.IntN(6)
			for range gpus {
				a := pciaddr.Address{Domain: uint16(d), Bus: uint8(bus + rng.IntN(next-bus)), Device: uint8(rng.IntN(3) * rng.IntN(32) / 2)}
				if used[a] {
					continue
				}
				used[a] = true
				p.Devices = append(p.Devices, profile.DeviceConfig{PCI: profile.PCIConfig{BusID: a.String()}})
				rc.Devices = append(rc.Devices, a.String())
			}
			if rng.IntN(4) == 0 {
				// A host device on the root bus, as --host-devices merge brings.
				a := pciaddr.Address{Domain: uint16(d), Bus: uint8(bus), Device: uint8(rng.IntN(8))}
				if !used[a] {
					used[a] = true
					reserved = append(reserved, a)
				}
			}
			if rng.IntN(4) == 0 {
				// A host device behind a host bridge, on a bus of its own
				// that no GPU uses.
				a := pciaddr.Address{Domain: uint16(d), Bus: uint8(bus + rng.IntN(next-bus))}
				if !slices.ContainsFunc(p.Devices, func(dc profile.DeviceConfig) bool {
					g, _ := pciaddr.Parse(dc.PCI.BusID)
					return g.Domain == a.Domain && g.Bus == a.Bus
				}) && !used[a] {
					used[a] = true
					reserved = append(reserved, a)
				}
			}
			p.PCIeTopology.RootComplexes = append(p.PCIeTopology.RootComplexes, rc)
			bus = next
		}
	}
	return p, reserved
}

func ptr[T any](v T) *T { return &v }
