package plancheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// builtinPlan plans a built-in profile; ok is false when the hierarchy
// refuses it (T4s sit on the root bus: flat only).
func builtinPlan(t *testing.T, name string, h boards.Hierarchy) (*plan.Plan, bool) {
	t.Helper()
	b, found := shipped.Get(name)
	require.True(t, found, name)
	m, err := profile.Normalize(name, b, profile.Options{Hierarchy: h})
	if err != nil {
		return nil, false
	}
	p, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	return p, true
}

func builtinPlans(t *testing.T) []*plan.Plan {
	t.Helper()
	var out []*plan.Plan
	for _, name := range shipped.Names() {
		for _, h := range []boards.Hierarchy{"", boards.Flat, boards.HGX, boards.DGX} {
			if p, ok := builtinPlan(t, name, h); ok {
				out = append(out, p)
			}
		}
	}
	require.GreaterOrEqual(t, len(out), 12)
	return out
}

func TestBuiltinPlansKeepInvariants(t *testing.T) {
	for _, p := range builtinPlans(t) {
		require.Empty(t, CheckPlan(p, ""), "%s, %s", p.Machine.Source, p.Machine.Hierarchy)
	}
}

// TestCheckPlanFindsBrokenPlans breaks a good plan in each way CheckPlan
// looks for: it must notice every one.
func TestCheckPlanFindsBrokenPlans(t *testing.T) {
	gpuLink := plan.LinksDir + "/0000:53:00.0"
	gpuDir := "sys/devices/pci0000:50/0000:50:01.0/0000:51:00.0/0000:52:00.0/0000:53:00.0"
	cases := []struct {
		name   string
		mutate func(p *plan.Plan)
		want   string
	}{
		{"a link out of the overlay", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "/etc"})
		}, "absolute link out of the overlay"},
		{"a link climbing out", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "../.."})
		}, "out of the overlay"},
		{"a dangling link", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "nowhere"})
		}, "file does not exist"},
		{"an endpoint's plain escaped text", func(p *plan.Plan) {
			setTarget(p, gpuLink, plan.EscapedTarget(p.ContainerRoot, nodeOf(p, "0000:53:00.0").SysPath()))
		}, "not devices/pci.../0000:53:00.0"},
		{"an upper-case entry", func(p *plan.Plan) {
			e := entryOf(p, gpuLink)
			e.Path = plan.LinksDir + "/0000:5A:00.0"
			p.Entries = append(p.Entries, e)
		}, "not a lower-case BDF"},
		{"a missing entry", func(p *plan.Plan) {
			p.Entries = slices.DeleteFunc(p.Entries, func(e plan.Entry) bool { return e.Path == gpuLink })
		}, gpuLink + ": missing"},
		{"a child outside its bridge's range", func(p *plan.Plan) {
			nodeOf(p, "0000:52:00.0").Subordinate = 0x52
		}, "do not fit"},
		{"config space disagrees", func(p *plan.Plan) {
			n := nodeOf(p, "0000:51:00.0")
			n.Secondary, n.Subordinate = 0x52, 0x5f
		}, "config: buses"},
		{"an HCA on another NUMA node than its GPU", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").NUMANode = 1
		}, "HCA on NUMA node 1, its GPU 0000:53:00.0 on 0"},
		{"an HCA paired with another switch's GPU", func(p *plan.Plan) {
			p.Tree.HCAs[0].GPU = nodeOf(p, "0000:64:00.0")
		}, "not its GPU 0000:64:00.0's"},
		{"a GPU without its HCA", func(p *plan.Plan) {
			p.Tree.HCAs = p.Tree.HCAs[1:]
		}, "0000:53:00.0: GPU with 0 HCAs, want 1"},
		{"an HCA on a GPU that carries none", func(p *plan.Plan) {
			p.Machine.HCAs.GPUs = []int{1, 2, 3, 4, 5, 6, 7} // not GPU 0, at 0000:53:00.0
		}, "0000:53:00.0: GPU with 1 HCAs, want 0"},
		{"an HCA at a GPU's address", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").Address = nodeOf(p, "0000:53:00.0").Address
		}, "0000:53:00.0: two functions at one address"},
		{"an HCA with a GPU's class", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").Identity.Class = profile.Class3DController
		}, "want 15b3:1021 class 020700"},
		{"an HCA on a host device's bus", func(p *plan.Plan) {
			p.HostDevices = append(p.HostDevices, plan.HostDevice{Address: nodeOf(p, "0000:54:00.0").Address})
		}, "buses 52-54 hold host device 0000:54:00.0"},
		{"a world-writable file", func(p *plan.Plan) {
			p.Entries[len(p.Entries)/2].Mode = 0o666
		}, "mode"},

		// The tree, as CheckTree sees it.
		{"a profile device the tree lacks", func(p *plan.Plan) {
			p.Machine.Devices = append(p.Machine.Devices, profile.Device{Address: pciaddr.Address{Bus: 0x99}})
		}, "0000:99:00.0: the profile's devices and HCAs want 1 more endpoints here"},
		{"an endpoint of another profile device", func(p *plan.Plan) {
			nodeOf(p, "0000:53:00.0").Device = nodeOf(p, "0000:64:00.0").Device
		}, "0000:53:00.0: the endpoint of profile device 0000:64:00.0"},
		{"an anchor not its own ancestor", func(p *plan.Plan) {
			nodeOf(p, "0000:53:00.0").Anchor = nodeOf(p, "0000:62:00.0")
		}, "anchor 0000:62:00.0, not its own ancestor 0000:51:00.0 at depth 4"},
		{"an anchor five levels below sys/", func(p *plan.Plan) {
			nodeOf(p, "0000:53:00.0").Anchor = nodeOf(p, "0000:52:00.0")
		}, "anchor 0000:52:00.0 is 5 levels below sys/, not 4"},
		{"an anchor that is no bridge", func(p *plan.Plan) {
			nodeOf(p, "0000:53:00.0").Anchor = nodeOf(p, "0000:54:00.0")
		}, "anchor 0000:54:00.0 (endpoint) is not a bridge"},
		{"a node naming another root complex", func(p *plan.Plan) {
			nodeOf(p, "0000:52:00.0").RootComplex = nodeOf(p, "0000:64:00.0").RootComplex
		}, "0000:52:00.0: names root complex pci0000:61, but sits under pci0000:50"},
		{"a node off its parent's secondary bus", func(p *plan.Plan) {
			nodeOf(p, "0000:53:00.0").Address.Bus = 0x5f
		}, "0000:5f:00.0 sits under 0000:52:00.0, whose devices are on bus 0000:53"},
		{"a range past its root complex's buses", func(p *plan.Plan) {
			nodeOf(p, "0000:50:01.0").Subordinate = 0x61
		}, "0000:50:01.0: buses 51-61 do not fit in 51-60 under pci0000:50"},
		{"sibling ranges overlapping", func(p *plan.Plan) {
			nodeOf(p, "0000:52:01.0").Secondary = 0x53
		}, "0000:52:01.0: buses 53-54 overlap a sibling's 53-53"},

		// The links directory's order and texts.
		{"a bridge's entry after an endpoint's", func(p *plan.Plan) {
			i := slices.IndexFunc(p.Entries, func(e plan.Entry) bool { return e.Path == plan.LinksDir+"/0000:00:01.0" })
			e := p.Entries[i]
			p.Entries = append(slices.Delete(p.Entries, i, i+1), e)
		}, plan.LinksDir + "/0000:00:01.0: listed after"},
		{"a bridge's entry in the kernel's form", func(p *plan.Plan) {
			setTarget(p, plan.LinksDir+"/0000:51:00.0", "../../../devices/pci0000:50/0000:50:01.0/0000:51:00.0")
		}, "not the escaped text ../../../../opt/nvml-mock/sys/devices/pci0000:50/0000:50:01.0/0000:51:00.0"},
		{"an endpoint's text from another anchor", func(p *plan.Plan) {
			e := entryOf(p, gpuLink)
			_, rest, _ := strings.Cut(e.Target, "/")
			setTarget(p, gpuLink, "0000:62:00.0/"+rest)
		}, "starts from 0000:62:00.0, not from its anchor 0000:51:00.0"},

		// Config space, as CheckConfig decodes it.
		{"a short config file", func(p *plan.Plan) {
			editFile(p, gpuDir+"/config", func(b []byte) []byte { return b[:64] })
		}, gpuDir + "/config: 64 bytes"},
		{"config space naming another vendor", func(p *plan.Plan) {
			editFile(p, gpuDir+"/config", func(b []byte) []byte { b[0] = 0xb3; return b })
		}, gpuDir + "/config: vendor 0x10b3, want 0x10de"},
		{"an interrupt line the irq file does not say", func(p *plan.Plan) {
			editFile(p, gpuDir+"/irq", func([]byte) []byte { return []byte("999\n") })
		}, "but the irq file says 999"},
		{"a capability loop", func(p *plan.Plan) {
			editFile(p, gpuDir+"/config", func(b []byte) []byte { b[0x49] = 0x40; return b })
		}, gpuDir + "/config: capability list"},
		{"a link width config space does not say", func(p *plan.Plan) {
			editFile(p, gpuDir+"/current_link_width", func([]byte) []byte { return []byte("4\n") })
		}, "LnkSta width x16, but current_link_width is \"4\\n\""},
		{"a bus number file config space does not say", func(p *plan.Plan) {
			editFile(p, "sys/"+nodeOf(p, "0000:52:00.0").SysPath()+"/secondary_bus_number", func([]byte) []byte { return []byte("84\n") })
		}, "secondary_bus_number is \"84\\n\", want 83"},

		// BARs and windows, as CheckBARs and CheckWindows read them.
		{"a resource line go-nvlib cannot read", func(p *plan.Plan) {
			editFile(p, gpuDir+"/resource", func(b []byte) []byte { return append([]byte("0x0 0x0\n"), b...) })
		}, gpuDir + "/resource: line 0 \"0x0 0x0\": go-nvlib wants exactly three fields"},
		{"config space's BAR0 elsewhere than the resource file's", func(p *plan.Plan) {
			editFile(p, gpuDir+"/config", func(b []byte) []byte { b[0x13] ^= 0x01; return b })
		}, gpuDir + "/config: BAR0 at"},
		{"a BAR1 smaller than the profile's", func(p *plan.Plan) {
			editFile(p, gpuDir+"/resource", func(b []byte) []byte {
				lines := strings.Split(string(b), "\n")
				f := strings.Fields(lines[2])                         // an H100's BAR1 is its third
				lines[2] = f[0] + " " + f[0][:11] + "00fffff " + f[2] // 1 MiB
				return []byte(strings.Join(lines, "\n"))
			})
		}, "BAR2 1048576 bytes with flags 0x14220c, want the profile's 137438953472"},
		{"a bridge window that misses the BARs below it", func(p *plan.Plan) {
			editFile(p, "sys/"+nodeOf(p, "0000:52:00.0").SysPath()+"/resource", func(b []byte) []byte {
				lines := strings.Split(string(b), "\n")
				lines[14] = "0x0000000000001000 0x0000000000001fff 0x0000000000000200"
				return []byte(strings.Join(lines, "\n"))
			})
		}, "outside a window above it [1000-1fff]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := builtinPlan(t, "hgx-h100", "")
			require.True(t, ok)
			tc.mutate(p)
			bad := CheckPlan(p, "")
			require.NotEmpty(t, bad)
			require.Contains(t, strings.Join(bad, "\n"), tc.want)
		})
	}
}

// TestCheckTreeFindsReservedAddresses gives CheckTree a mock bridge's
// address as the host's: it must name the bridge.
func TestCheckTreeFindsReservedAddresses(t *testing.T) {
	p, ok := builtinPlan(t, "hgx-h100", "")
	require.True(t, ok)
	require.Empty(t, CheckTree(p.Machine, p.Tree, nil))
	bad := CheckTree(p.Machine, p.Tree, []pciaddr.Address{nodeOf(p, "0000:52:00.0").Address})
	require.Contains(t, strings.Join(bad, "\n"), "0000:52:00.0: a mock switch downstream port at a host device's address")
	require.Contains(t, strings.Join(bad, "\n"), "0000:51:00.0: buses 52-54 hold host device 0000:52:00.0")
}

func nodeOf(p *plan.Plan, bdf string) *plan.Node {
	for _, n := range p.Tree.Nodes() {
		if n.Address.String() == bdf {
			return n
		}
	}
	panic(bdf)
}

func entryOf(p *plan.Plan, path string) plan.Entry {
	for _, e := range p.Entries {
		if e.Path == path {
			return e
		}
	}
	panic(path)
}

// editFile replaces a file's data with what edit makes of a copy of it.
func editFile(p *plan.Plan, path string, edit func([]byte) []byte) {
	for i := range p.Entries {
		if p.Entries[i].Path == path {
			p.Entries[i].Data = edit(slices.Clone(p.Entries[i].Data))
			return
		}
	}
	panic(path)
}

func setTarget(p *plan.Plan, path, target string) {
	for i := range p.Entries {
		if p.Entries[i].Path == path {
			p.Entries[i].Target = target
		}
	}
}
