package plan_test

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/utils/cpuset"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// twoNodeHost is a host with CPUs 0-3 on node 0 and 4-7 on node 1.
func twoNodeHost() plan.HostCPUs {
	return plan.HostCPUs{
		Possible: 8,
		Online:   cpuset.New(0, 1, 2, 3, 4, 5, 6, 7),
		Nodes:    map[int]cpuset.CPUSet{0: cpuset.New(0, 1, 2, 3), 1: cpuset.New(4, 5, 6, 7)},
	}
}

// files indexes a plan's files and links by path.
func files(p *plan.Plan) map[string]plan.Entry {
	out := map[string]plan.Entry{}
	for _, e := range p.Entries {
		out[e.Path] = e
	}
	return out
}

func text(t *testing.T, fs map[string]plan.Entry, p string) string {
	t.Helper()
	e, ok := fs[p]
	require.True(t, ok, "%s is not planned", p)
	require.Equal(t, plan.File, e.Kind, p)
	return string(e.Data)
}

func hex16(v uint16) string { return fmt.Sprintf("0x%04x\n", v) }

// TestDeviceFiles checks every planned function's files against each other
// and against the profile: ids in the files and in config space, the
// capability list PM -> MSI -> PCIe, link registers against the link files,
// BARs in config space against resource, and the BAR sizes of the board.
func TestDeviceFiles(t *testing.T) {
	for _, c := range allMachines(t) {
		t.Run(c.name, func(t *testing.T) {
			p, err := plan.New(c.m, plan.Options{Host: twoNodeHost()})
			require.NoError(t, err)
			fs := files(p)
			for _, n := range p.Tree.Nodes() {
				checkDevice(t, fs, n)
			}
		})
	}
}

func checkDevice(t *testing.T, fs map[string]plan.Entry, n *plan.Node) {
	t.Helper()
	dir := "sys/" + n.SysPath()
	get := func(name string) string { return text(t, fs, dir+"/"+name) }
	id := n.Identity
	where := n.Address.String()

	require.Equal(t, hex16(id.Vendor), get("vendor"), where)
	require.Equal(t, hex16(id.Device), get("device"), where)
	require.Equal(t, hex16(id.SubsystemVendor), get("subsystem_vendor"), where)
	require.Equal(t, hex16(id.SubsystemDevice), get("subsystem_device"), where)
	require.Equal(t, fmt.Sprintf("0x%06x\n", id.Class), get("class"), where)
	require.Equal(t, fmt.Sprintf("0x%02x\n", id.Revision), get("revision"), where)
	require.Equal(t, fmt.Sprintf("%d\n", n.NUMANode), get("numa_node"), where)
	require.Equal(t, sysfs.Modalias(id.Vendor, id.Device, id.SubsystemVendor, id.SubsystemDevice, id.Class)+"\n", get("modalias"), where)
	require.Regexp(t, `^pci:v[0-9A-F]{8}d[0-9A-F]{8}sv[0-9A-F]{8}sd[0-9A-F]{8}bc[0-9A-F]{2}sc[0-9A-F]{2}i[0-9A-F]{2}\n$`, get("modalias"))
	if n.Role == plan.Endpoint {
		require.Equal(t, n.Device.NUMANode, n.NUMANode, where)
		switch n.Device.Kind {
		case profile.GPU:
			require.Equal(t, boards.VendorNVIDIA, id.Vendor)
			require.Equal(t, uint8(0xa1), id.Revision, "%s: every board in REAL-HARDWARE.md is rev a1", where)
		case profile.HCA:
			require.Equal(t, boards.VendorMellanox, id.Vendor, where)
			require.Contains(t, []uint32{profile.ClassInfiniBand, profile.ClassEthernet}, id.Class, where)
		default:
			require.Equal(t, profile.ClassNVSwitch, id.Class, where)
		}
	} else {
		require.Equal(t, profile.ClassPCIBridge, id.Class, where)
	}

	// local_cpus and local_cpulist list the CPUs of the device's node.
	wantCPUs := map[int][2]string{0: {"0f", "0-3"}, 1: {"f0", "4-7"}, -1: {"ff", "0-7"}}[n.NUMANode]
	require.Equal(t, wantCPUs[0]+"\n", get("local_cpus"), where)
	require.Equal(t, wantCPUs[1]+"\n", get("local_cpulist"), where)

	// Link files.
	require.Equal(t, sysfs.LinkSpeed(n.Link.CurrentGen)+"\n", get("current_link_speed"), where)
	require.Equal(t, sysfs.LinkSpeed(n.Link.MaxGen)+"\n", get("max_link_speed"), where)
	require.Equal(t, fmt.Sprintf("%d\n", n.Link.CurrentWidth), get("current_link_width"), where)
	require.Equal(t, fmt.Sprintf("%d\n", n.Link.MaxWidth), get("max_link_width"), where)
	if n.Role == plan.Endpoint && n.Device.Kind == profile.GPU {
		require.Equal(t, n.Device.Link, n.Link, "%s: the profile's pcie block", where)
	}

	// Config space against the node and its files, and the BARs against
	// the resource file and the board: plancheck decodes them.
	require.Empty(t, plancheck.Tree(fs).CheckConfig(n), where)
	require.Empty(t, plancheck.Tree(fs).CheckBARs(n), where)
}

// TestBridgeWindowsCoverChildren checks that each bridge's windows hold the
// BARs of every device below it, as firmware assigns them.
func TestBridgeWindowsCoverChildren(t *testing.T) {
	for _, c := range allMachines(t) {
		t.Run(c.name, func(t *testing.T) {
			p, err := plan.New(c.m, plan.Options{})
			require.NoError(t, err)
			require.Empty(t, plancheck.FromEntries(p.Entries).CheckWindows(p.Tree))
		})
	}
}

// TestLinksResolve renders each built-in profile and follows every link the
// kernel would: driver, iommu_group, the driver's and group's back links,
// and each entry of the links directory, which must land on the device's
// own directory.
func TestLinksResolve(t *testing.T) {
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		t.Run(name, func(t *testing.T) {
			m, err := overlay.LoadMachine(name, "")
			require.NoError(t, err)
			root, p := overlaytest.Render(t, m, plan.Options{ContainerRoot: "/opt/nvml-mock"})
			real := func(rel string) string {
				got, err := filepath.EvalSymlinks(filepath.Join(root, rel))
				require.NoError(t, err, rel)
				return got
			}
			rootReal := real(".")
			for _, n := range p.Tree.Nodes() {
				dir := "sys/" + n.SysPath()
				bdf := n.Address.String()
				require.Equal(t, real(dir), real(plan.LinksDir+"/"+bdf), "%s: the links entry reaches the device", bdf)
				target, err := os.Readlink(filepath.Join(root, plan.LinksDir, bdf))
				require.NoError(t, err)
				if n.Role == plan.Endpoint {
					// What deviceattribute parses: the text, cleaned lexically.
					require.Equal(t, n.SysPath(), path.Clean(path.Join(sysfs.LinksDir, target)), bdf)
				}
				driver := map[plan.Role]string{plan.RootPort: "pcieport", plan.SwitchUp: "pcieport", plan.SwitchDown: "pcieport"}[n.Role]
				if n.Role == plan.Endpoint {
					driver = map[profile.DeviceKind]string{profile.GPU: profile.DriverNVIDIA, profile.NVSwitch: profile.DriverNVSwitch, profile.HCA: profile.DriverMLX5}[n.Device.Kind]
				}
				if driver == "" {
					_, err := os.Lstat(filepath.Join(root, dir, "driver"))
					require.ErrorIs(t, err, os.ErrNotExist, "%s: a PCI-to-PCI bridge has no driver", bdf)
				} else {
					require.Equal(t, filepath.Join(rootReal, "sys/bus/pci/drivers", driver), real(dir+"/driver"), bdf)
					require.Equal(t, real(dir), real("sys/bus/pci/drivers/"+driver+"/"+bdf), bdf)
				}
				require.Equal(t, filepath.Join(rootReal, "sys/bus/pci"), real(dir+"/subsystem"), bdf)
				group := real(dir + "/iommu_group")
				require.Regexp(t, regexp.MustCompile(`/sys/kernel/iommu_groups/[0-9]+$`), group, bdf)
				require.Equal(t, real(dir), real(strings.TrimPrefix(group, rootReal+"/")+"/devices/"+bdf), bdf)
			}
		})
	}
}

// TestHostDeviceCollision names both devices when a mock BDF is the host's.
func TestHostDeviceCollision(t *testing.T) {
	m, err := overlay.LoadMachine("t4-vm", "")
	require.NoError(t, err)
	host := []plan.HostDevice{{Address: m.Devices[2].Address, Target: "../../../devices/pci0000:00/" + m.Devices[2].Address.String()}}
	_, err = plan.New(m, plan.Options{HostDevices: host})
	require.ErrorContains(t, err, "mock gpu 0000:00:1d.0 collides with host device 0000:00:1d.0 (../../../devices/pci0000:00/0000:00:1d.0)")
}

// TestHostDevicesKeepTheirLinks checks that merged host devices keep the
// kernel's link text and that the overlay's own bridges avoid their
// addresses and buses.
func TestHostDevicesKeepTheirLinks(t *testing.T) {
	host := []plan.HostDevice{
		{Target: "../../../devices/pci0000:00/0000:00:01.0"},
		{Target: "../../../devices/pci0000:00/0000:00:02.0"},
		{Target: "../../../devices/pci0000:00/0000:00:1a.0"},
		{Target: "../../../devices/pci0000:00/0000:00:1a.0/0000:01:00.0"},
	}
	for i := range host {
		a, err := pciaddr.Parse(path.Base(host[i].Target))
		require.NoError(t, err)
		host[i].Address = a
	}
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		t.Run(name, func(t *testing.T) {
			m, err := overlay.LoadMachine(name, "")
			require.NoError(t, err)
			p, err := plan.New(m, plan.Options{HostDevices: host, HostSysfs: "/host/sys"})
			require.NoError(t, err)
			fs := files(p)
			// The whole plan, its tree with the host's devices reserved,
			// and links into /host/sys/devices allowed.
			require.Empty(t, plancheck.CheckPlan(p, "/host/sys/devices"))
			for _, h := range host {
				e := fs[plan.LinksDir+"/"+h.Address.String()]
				require.Equal(t, plan.Symlink, e.Kind)
				require.Equal(t, h.Target, e.Target, "the kernel's own link text")
			}
			for _, n := range p.Tree.Nodes() {
				if n.Role.IsBridge() && n.RootComplex.Bus == 0 && n.RootComplex.Domain == 0 {
					require.False(t, n.Secondary <= 1 && 1 <= n.Subordinate, "%s claims bus 01, where a host device sits", n.Address)
				}
			}
			// A shadow link leads on from the overlay's sys/devices to the
			// host's, so the kernel-form text also resolves on the host.
			shadow := fs["sys/devices/pci0000:00/0000:00:1a.0"]
			if _, ownRC := fs["sys/devices/pci0000:00"]; ownRC {
				require.Equal(t, plan.Symlink, shadow.Kind)
				require.Equal(t, "/host/sys/devices/pci0000:00/0000:00:1a.0", shadow.Target)
				_, deeper := fs["sys/devices/pci0000:00/0000:00:1a.0/0000:01:00.0"]
				require.False(t, deeper, "one shadow at the first element the overlay lacks")
			} else {
				require.Equal(t, "/host/sys/devices/pci0000:00", fs["sys/devices/pci0000:00"].Target)
			}
		})
	}
}
