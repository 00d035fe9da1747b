package plan

import (
	"encoding/binary"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func machine(t *testing.T, nameOrPath string, h boards.Hierarchy) *profile.Machine {
	t.Helper()
	p, src, err := builtin.Load(nameOrPath)
	require.NoError(t, err)
	m, err := profile.Normalize(src, p, profile.Options{Hierarchy: h})
	require.NoError(t, err)
	return m
}

func mustPlan(t *testing.T, m *profile.Machine, opts Options) *Plan {
	t.Helper()
	p, err := New(m, opts)
	require.NoError(t, err)
	checkPlan(t, p)
	return p
}

// profilesUnderTest is every built-in, every profile in testdata and, when
// ../shared is there, every nvml-mock profile.
func profilesUnderTest() []string {
	names := builtin.Names()
	local, _ := filepath.Glob("../../testdata/profiles/*.yaml")
	shared, _ := filepath.Glob("../../../shared/testdata/nvml-mock-profiles/*.yaml")
	return append(append(names, local...), shared...)
}

func TestPlanEveryProfileEveryHierarchy(t *testing.T) {
	for _, name := range profilesUnderTest() {
		for _, h := range append([]boards.Hierarchy{""}, boards.Hierarchies()...) {
			t.Run(filepath.Base(name)+"/"+string(h), func(t *testing.T) {
				p, src, err := builtin.Load(name)
				require.NoError(t, err)
				m, err := profile.Normalize(src, p, profile.Options{Hierarchy: h})
				if err != nil && (h == boards.HGX || h == boards.DGX) {
					// Only a flat layout may put a GPU on its root bus.
					require.ErrorContains(t, err, "only a flat (VM) hierarchy puts a device on the root bus")
					return
				}
				require.NoError(t, err)
				mustPlan(t, m, Options{})
			})
		}
	}
}

// checkPlan asserts what every plan must hold, whatever the profile.
func checkPlan(t *testing.T, p *Plan) {
	t.Helper()
	byPath := map[string]Entry{}
	for i, e := range p.Entries {
		_, dup := byPath[e.Path]
		require.False(t, dup, "duplicate entry %s", e.Path)
		if parent := path.Dir(e.Path); parent != "." {
			pe, ok := byPath[parent]
			require.True(t, ok, "entry %d %s comes before its directory", i, e.Path)
			require.Equal(t, Dir, pe.Kind, "parent of %s", e.Path)
		}
		byPath[e.Path] = e
	}
	profileBDFs := map[pciaddr.Address]bool{}
	for _, d := range p.Machine.Devices {
		profileBDFs[d.Address] = true
	}
	seenEndpoint := false
	nodes := map[string]*Node{}
	for _, n := range p.Tree.Nodes() {
		nodes[n.Address.String()] = n
	}
	host := map[string]string{}
	for _, h := range p.HostDevices {
		host[h.Address.String()] = h.Target
	}
	for _, e := range p.Entries {
		if path.Dir(e.Path) != LinksDir {
			continue
		}
		name := path.Base(e.Path)
		require.True(t, pciaddr.IsBDF(name), "links entry %q is not a lower-case BDF", name)
		require.Equal(t, Symlink, e.Kind)
		if target, ok := host[name]; ok {
			require.Equal(t, target, e.Target, "host devices keep the kernel's text")
			require.False(t, seenEndpoint, "host entries come with the bridges")
			continue
		}
		n := nodes[name]
		require.NotNil(t, n, "links entry %s has no node", name)
		if n.Role.IsBridge() {
			require.False(t, seenEndpoint, "bridge %s listed after an endpoint whose link may pass through it", name)
			require.Equal(t, EscapedTarget(p.ContainerRoot, n.SysPath()), e.Target)
			continue
		}
		seenEndpoint = true
		// What deviceattribute parses: the text cleaned lexically.
		lexical := path.Clean(path.Join("bus/pci/devices", e.Target))
		require.Equal(t, n.SysPath(), lexical, "endpoint %s", name)
		require.Equal(t, "devices/"+n.RootComplex.String(), strings.Join(strings.Split(lexical, "/")[:2], "/"))
		anchor := nodes[strings.Split(e.Target, "/")[0]]
		require.NotNil(t, anchor, "%s starts from a missing entry", e.Target)
		require.True(t, anchor.Role.IsBridge(), "anchor of %s", name)
		require.Equal(t, anchorDepth, anchor.Depth(), "anchor %s of %s", anchor.Address, name)
	}
	for _, n := range p.Tree.Nodes() {
		dir := "sys/" + n.SysPath()
		require.Equal(t, Dir, byPath[dir].Kind, dir)
		require.Equal(t, Symlink, byPath[LinksDir+"/"+n.Address.String()].Kind)
		for _, f := range []string{"vendor", "device", "subsystem_vendor", "subsystem_device", "class", "revision", "irq", "numa_node", "modalias", "resource", "config", "local_cpus", "local_cpulist", "current_link_speed", "max_link_width"} {
			require.Equal(t, File, byPath[dir+"/"+f].Kind, "%s/%s", dir, f)
		}
		checkConfig(t, n, byPath)
		checkResource(t, byPath[dir+"/resource"].Data)
		if n.Role.IsBridge() {
			require.False(t, profileBDFs[n.Address], "bridge %s takes a BDF of the profile", n.Address)
			require.Greater(t, n.Secondary, n.Address.Bus, "bridge %s", n.Address)
			require.LessOrEqual(t, n.Secondary, n.Subordinate)
			var prev *Node
			for _, c := range n.Children {
				require.Equal(t, n.Secondary, c.Address.Bus, "child %s sits on the secondary bus of %s", c.Address, n.Address)
				if c.Role.IsBridge() {
					require.GreaterOrEqual(t, c.Secondary, n.Secondary)
					require.LessOrEqual(t, c.Subordinate, n.Subordinate, "%s range within %s", c.Address, n.Address)
					if prev != nil {
						require.Greater(t, c.Secondary, prev.Subordinate, "siblings %s and %s overlap", prev.Address, c.Address)
					}
					prev = c
				}
			}
		} else {
			require.True(t, profileBDFs[n.Address])
			if n.Parent == nil {
				require.Equal(t, n.RootComplex.Bus, n.Address.Bus, "%s hangs from the host bridge", n.Address)
			}
		}
	}
}

func checkConfig(t *testing.T, n *Node, byPath map[string]Entry) {
	dir := "sys/" + n.SysPath()
	c := byPath[dir+"/config"].Data
	require.Len(t, c, ConfigSize)
	le16 := func(off int) uint16 { return binary.LittleEndian.Uint16(c[off:]) }
	id := n.Identity
	require.Equal(t, hex16(le16(0)), string(byPath[dir+"/vendor"].Data))
	require.Equal(t, hex16(le16(2)), string(byPath[dir+"/device"].Data))
	require.Equal(t, fmt.Sprintf("0x%02x\n", c[8]), string(byPath[dir+"/revision"].Data))
	require.Equal(t, fmt.Sprintf("0x%06x\n", uint32(c[0xb])<<16|uint32(c[0xa])<<8|uint32(c[9])), string(byPath[dir+"/class"].Data))
	require.Equal(t, id.Vendor, le16(0))
	require.Equal(t, uint8(capPM), c[0x34])
	require.Equal(t, []byte{capIDPM, capMSI}, c[capPM:capPM+2])
	require.Equal(t, []byte{capIDMSI, capPCIe}, c[capMSI:capMSI+2])
	require.Equal(t, byte(capIDPCIe), c[capPCIe])
	lnkSta := le16(capPCIe + 0x12)
	require.Equal(t, decimal(int(lnkSta>>4&0x3f)), string(byPath[dir+"/current_link_width"].Data))
	require.Equal(t, linkSpeed(int(lnkSta&0xf))+"\n", string(byPath[dir+"/current_link_speed"].Data))
	if n.Role.IsBridge() {
		require.Equal(t, byte(headerType1), c[0x0e]&0x7f)
		require.Equal(t, []byte{n.Address.Bus, n.Secondary, n.Subordinate}, c[0x18:0x1b])
		require.Equal(t, decimal(int(c[0x19])), string(byPath[dir+"/secondary_bus_number"].Data))
		require.Equal(t, decimal(int(c[0x1a])), string(byPath[dir+"/subordinate_bus_number"].Data))
	} else {
		require.Equal(t, byte(headerType0), c[0x0e]&0x7f)
		require.Equal(t, hex16(le16(0x2c)), string(byPath[dir+"/subsystem_vendor"].Data))
		require.Equal(t, hex16(le16(0x2e)), string(byPath[dir+"/subsystem_device"].Data))
	}
}

func checkResource(t *testing.T, data []byte) {
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Contains(t, []int{typ0Lines, typ1Lines}, len(lines))
	for _, l := range lines {
		f := strings.Split(l, " ")
		require.Len(t, f, 3, "go-nvlib wants exactly 3 space-separated fields: %q", l)
		for _, x := range f {
			require.Len(t, x, 18)
			require.True(t, strings.HasPrefix(x, "0x"))
		}
	}
}

func TestTightNumberingStillHasAnAnchor(t *testing.T) {
	p := mustPlan(t, machine(t, "../../testdata/profiles/tight.yaml", ""), Options{})
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
	depthOf := func(p *Plan) map[string]int {
		out := map[string]int{}
		for _, n := range p.Tree.Nodes() {
			if !n.Role.IsBridge() {
				out[n.Address.String()] = n.Depth()
			}
		}
		return out
	}
	h100 := depthOf(mustPlan(t, machine(t, "h100", ""), Options{}))
	require.Equal(t, 6, h100["0000:53:00.0"], "root port, switch up, switch down, GPU")
	a100 := depthOf(mustPlan(t, machine(t, "a100", ""), Options{}))
	require.Equal(t, 8, a100["0000:07:00.0"], "root port and two cascaded switches")
	flat := depthOf(mustPlan(t, machine(t, "gb200", ""), Options{}))
	require.Equal(t, 4, flat["0000:29:00.0"], "behind one root port")
	vm := depthOf(mustPlan(t, machine(t, "t4", ""), Options{}))
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
	p := mustPlan(t, nvl72(t), Options{})
	require.Len(t, p.Tree.RootComplexes, 18)
}

func TestDeterministic(t *testing.T) {
	m := machine(t, "a100", "")
	a, b := mustPlan(t, m, Options{}), mustPlan(t, machine(t, "a100", ""), Options{})
	require.Equal(t, a.Digest(), b.Digest())
	require.Equal(t, a.Entries, b.Entries)
	c := mustPlan(t, m, Options{ContainerRoot: "/srv/mock"})
	require.NotEqual(t, a.Digest(), c.Digest())
}

func TestLoopLink(t *testing.T) {
	for root, want := range map[string]string{"/opt/nvml-mock": "..", "/nvml": ".", "/srv/a/b": "../.."} {
		p := mustPlan(t, machine(t, "t4", ""), Options{ContainerRoot: root})
		var got string
		for _, e := range p.Entries {
			if e.Path == strings.TrimPrefix(root, "/") {
				got = e.Target
			}
		}
		require.Equal(t, want, got, root)
	}
	for _, bad := range []string{"opt/x", "/", "/opt/x/", "/opt/../x", "/sys/x", "/proc", "/bin/x"} {
		_, err := New(machine(t, "t4", ""), Options{ContainerRoot: bad})
		require.ErrorContains(t, err, "container root", bad)
	}
}

func TestHostDevicesAreAvoided(t *testing.T) {
	host := []HostDevice{
		{Address: pciaddr.Address{Bus: 0, Device: 1}, Target: "../../../devices/pci0000:00/0000:00:01.0"},
		{Address: pciaddr.Address{Bus: 1}, Target: "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0"},
	}
	p := mustPlan(t, machine(t, "t4", ""), Options{HostDevices: host})
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
	require.Equal(t, host[0].Target, targets[LinksDir+"/0000:00:01.0"], "kernel form, resolves into the real /sys/devices")
	require.Equal(t, "/sys/devices/pci0000:00/0000:00:01.0", targets["sys/devices/pci0000:00/0000:00:01.0"], "the host side follows on to the host's device")

	clash := []HostDevice{{Address: pciaddr.Address{Bus: 0, Device: 0x1e}, Target: "../../../devices/pci0000:00/0000:00:1e.0"}}
	_, err := New(machine(t, "t4", ""), Options{HostDevices: clash})
	require.ErrorContains(t, err, "mock gpu 0000:00:1e.0 collides with host device 0000:00:1e.0")
}

func TestCPUMask(t *testing.T) {
	tests := []struct {
		cpus     string
		possible int
		want     string
	}{
		{"0-1", 2, "3"},
		{"0-7", 8, "ff"},
		{"0-31", 32, "ffffffff"},
		{"32-63", 64, "ffffffff,00000000"},
		{"0,71", 72, "80,00000000,00000001"},
	}
	for _, tt := range tests {
		h := HostCPUs{Possible: tt.possible}
		set, err := parseCPUs(tt.cpus)
		require.NoError(t, err)
		require.Equal(t, tt.want, cpuMask(set, h.Possible), tt.cpus)
	}
}
