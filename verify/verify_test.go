package verify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

const ext4Magic = 0xef53

func TestMain(m *testing.M) { os.Exit(overlaytest.Main(m)) }

// fakeContainer renders a profile into a temporary root and dresses its
// sys/ as a container's /sys: CPU topology and network interfaces of the
// kernel's, the links directory and the overlay as read-only bind mounts.
type fakeContainer struct {
	root, sysfs string
	magic       map[string]int64 // statfs answers other than sysfs
	mountinfo   string
	netlink     []string
	env         map[string]string
	nvmlProfile string
}

func newFakeContainer(t *testing.T, profile string) *fakeContainer {
	t.Helper()
	root := filepath.Join(t.TempDir(), "overlay")
	// No test here is of durability: skip syncfs.
	_, _, err := overlay.Render(overlay.Options{Profile: profile, Root: root, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	sysfs := filepath.Join(root, "sys")
	write := func(name, content string) {
		p := filepath.Join(sysfs, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	write("devices/system/cpu/online", "0-3\n")
	write("devices/system/cpu/cpu0/topology/physical_package_id", "0\n")
	require.NoError(t, os.MkdirAll(filepath.Join(sysfs, "class/net/lo"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(sysfs, "class/net/eth0"), 0o755))
	return &fakeContainer{
		root: root, sysfs: sysfs,
		magic:   map[string]int64{},
		netlink: []string{"eth0", "lo"},
		env:     map[string]string{},
		mountinfo: fmt.Sprintf("80 60 254:0 /var/lib/nvml-mock %s ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n"+
			"92 70 254:0 /var/lib/nvml-mock/sys/bus/pci/devices %s/bus/pci/devices ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n",
			plan.DefaultContainerRoot, sysfs),
	}
}

func (f *fakeContainer) system() System {
	return System{
		Sysfs:         f.sysfs,
		ContainerRoot: plan.DefaultContainerRoot,
		Statfs: func(p string) (int64, error) {
			if _, err := os.Stat(p); err != nil {
				return 0, err
			}
			if m, ok := f.magic[strings.TrimPrefix(p, f.sysfs)]; ok {
				return m, nil
			}
			return SysfsMagic, nil
		},
		MountInfo:  func() ([]byte, error) { return []byte(f.mountinfo), nil },
		Interfaces: func() ([]string, error) { return f.netlink, nil },
		LookupEnv: func(k string) (string, bool) {
			v, ok := f.env[k]
			return v, ok
		},
		NVMLProfile: f.nvmlProfile,
	}
}

func failing(r *compat.Report) []string {
	var out []string
	for _, c := range r.Failures() {
		if !slices.Contains(out, c.Check) {
			out = append(out, c.Check)
		}
	}
	slices.Sort(out)
	return out
}

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(t *testing.T, f *fakeContainer)
		failing []string
	}{
		{name: "a container served as intended", mutate: func(*testing.T, *fakeContainer) {}},
		{
			name:    "a mock tree mounted over /sys/devices",
			mutate:  func(_ *testing.T, f *fakeContainer) { f.magic["/devices"] = ext4Magic },
			failing: []string{KernelDevices},
		},
		{
			name: "the links directory mounted writable",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.mountinfo = strings.Replace(f.mountinfo, "/bus/pci/devices ro,", "/bus/pci/devices rw,", 1)
			},
			failing: []string{LinksMount},
		},
		{
			name: "the links directory is still the kernel's",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.mountinfo = fmt.Sprintf("92 70 0:21 / %s/bus/pci/devices ro,nosuid - sysfs sysfs ro\n", f.sysfs) +
					strings.SplitAfter(f.mountinfo, "\n")[0]
			},
			failing: []string{LinksMount},
		},
		{
			name: "something else bind-mounted at the links directory",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.mountinfo = strings.Replace(f.mountinfo, "/var/lib/nvml-mock/sys/bus/pci/devices", "/srv/other", 1)
			},
			failing: []string{LinksMount},
		},
		{
			name: "no overlay at the container root",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.mountinfo = strings.SplitAfter(f.mountinfo, "\n")[1]
			},
			failing: []string{OverlayMount},
		},
		{
			name: "the mount table cannot be read",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.mountinfo = "not a mountinfo line\n"
			},
			failing: []string{LinksMount, OverlayMount},
		},
		{
			name:    "sysfs of another network namespace",
			mutate:  func(_ *testing.T, f *fakeContainer) { f.netlink = []string{"lo"} },
			failing: []string{NetInterfaces},
		},
		{
			name: "CPU topology hidden",
			mutate: func(t *testing.T, f *fakeContainer) {
				require.NoError(t, os.RemoveAll(filepath.Join(f.sysfs, "devices/system/cpu/cpu0")))
			},
			failing: []string{CPUTopology},
		},
		{
			name: "DMI there and the kernel's",
			mutate: func(t *testing.T, f *fakeContainer) {
				require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "class/dmi/id"), 0o755))
			},
		},
		{
			name: "DMI there but not the kernel's",
			mutate: func(t *testing.T, f *fakeContainer) {
				require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "class/dmi/id"), 0o755))
				f.magic["/class/dmi/id"] = ext4Magic
			},
			failing: []string{DMI},
		},
		{
			name:    "DMI absent because /sys/class is not the kernel's",
			mutate:  func(_ *testing.T, f *fakeContainer) { f.magic["/class"] = ext4Magic },
			failing: []string{DMI},
		},
		{
			// go-nvlib aborts its whole scan on one unreadable entry.
			name: "a link that resolves nowhere",
			mutate: func(t *testing.T, f *fakeContainer) {
				require.NoError(t, os.Symlink("../../../devices/pci0000:99/0000:99:00.0", filepath.Join(f.sysfs, sysfs.LinksDir, "0000:99:00.0")))
			},
			failing: []string{LinksResolve, "nvpci.GetAllDevices", "nvpci.GetGPUs"},
		},
		{
			// A server's BMC VGA, listed by --host-devices merge, is no GPU
			// to any NVIDIA consumer.
			name:    "another vendor's device of display class",
			mutate:  func(t *testing.T, f *fakeContainer) { f.addDevice(t, "0000:00:02.0", "0x1a03", "0x030000") },
			failing: nil,
		},
		{
			name:   "an NVIDIA device of display class the profile lacks",
			mutate: func(t *testing.T, f *fakeContainer) { f.addDevice(t, "0000:00:02.0", "0x10de", "0x030000") },
			// go-nvlib reads more of an NVIDIA function than this one has.
			failing: []string{DisplayDevices, "nvpci.GetAllDevices", "nvpci.GetGPUs"},
		},
		{
			name: "nvml-mock's PCI shim preloaded",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.env["LD_PRELOAD"] = "/opt/nvml-mock/driver/usr/local/lib/libpcimocksys.so.1"
			},
			failing: []string{OtherMocks},
		},
		{
			name:    "nvml-mock's PCI shim pointed at its tree",
			mutate:  func(_ *testing.T, f *fakeContainer) { f.env[PCIShimRootEnv] = "/opt/nvml-mock" },
			failing: []string{OtherMocks},
		},
		{
			name: "nvml-mock's other shims and an empty MOCK_PCI_ROOT",
			mutate: func(_ *testing.T, f *fakeContainer) {
				f.env["LD_PRELOAD"] = "/opt/nvml-mock/driver/usr/local/lib/libibmocksys.so.1"
				f.env[PCIShimRootEnv] = ""
			},
		},
		{
			// The kernel's /sys/devices shows a device the links directory
			// does not list: rendered without --host-devices merge.
			name: "a node device not listed",
			mutate: func(t *testing.T, f *fakeContainer) {
				require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "devices/pci0000:00/0000:00:1f.2"), 0o755))
			},
			failing: []string{NodeDevices},
		},
		{
			name: "a node device behind a bridge not listed",
			mutate: func(t *testing.T, f *fakeContainer) {
				f.addDevice(t, "0000:00:10.0", "0x8086", "0x060400")
				require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "devices/pci0000:00/0000:00:10.0/0000:3d:00.0"), 0o755))
			},
			failing: []string{NodeDevices},
		},
		{
			// A mock device took the address of one of the node's, as a
			// render without --host-devices merge may.
			name: "a node device shadowed by another at its address",
			mutate: func(t *testing.T, f *fakeContainer) {
				f.addDevice(t, "0000:00:1f.3", "0x8086", "0x0c0500")
				require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "devices/pci0000:00/0000:00:1f.2"), 0o755))
				require.NoError(t, os.Symlink("../../../devices/pci0000:00/0000:00:1f.3", filepath.Join(f.sysfs, sysfs.LinksDir, "0000:00:1f.2")))
			},
			failing: []string{NodeDevices},
		},
		{
			name:   "a node device listed",
			mutate: func(t *testing.T, f *fakeContainer) { f.addDevice(t, "0000:00:1f.2", "0x8086", "0x010601") },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeContainer(t, "t4-vm")
			tc.mutate(t, f)
			m, err := overlay.LoadMachine("t4-vm", "")
			require.NoError(t, err)
			r := Run(m, f.system())
			require.Equal(t, tc.failing, failing(r), "%+v", r.Failures())
			require.Equal(t, len(tc.failing) == 0, r.OK())
			for _, name := range []string{LinksResolve, NodeDevices, compat.NVMLAgreement, OtherMocks, DisplayDevices, KernelDevices, CPUTopology, NetInterfaces, DMI, LinksMount, OverlayMount, "deviceattribute.pcieRoot", "nvpci.GetGPUs", "gfd gpu.mode"} {
				require.True(t, slices.ContainsFunc(r.Results, func(c compat.Result) bool { return c.Check == name }), "check %q ran", name)
			}
		})
	}
}

func TestRunAgainstAnotherProfile(t *testing.T) {
	t.Parallel()
	f := newFakeContainer(t, "t4-vm")
	m, err := overlay.LoadMachine("dgx-a100", "")
	require.NoError(t, err)
	r := Run(m, f.system())
	require.False(t, r.OK())
	names := failing(r)
	require.Contains(t, names, DisplayDevices)
	require.Contains(t, names, "deviceattribute.pcieRoot")
	require.Contains(t, names, "nvpci.GetGPUs")
}

func TestEvidence(t *testing.T) {
	t.Parallel()
	f := newFakeContainer(t, "t4-vm")
	m, err := overlay.LoadMachine("t4-vm", "")
	require.NoError(t, err)
	f.netlink = nil
	f.env["LD_PRELOAD"] = "/opt/nvml-mock/driver/usr/local/lib/libpcimocksys.so.1"
	require.NoError(t, os.MkdirAll(filepath.Join(f.sysfs, "devices/pci0000:00/0000:00:1f.2"), 0o755))
	r := Run(m, f.system())
	byName := map[string]compat.Result{}
	for _, c := range r.Results {
		byName[c.Check] = c
	}
	require.Equal(t, "statfs magic 0x62656572: the kernel's sysfs", byName[KernelDevices].Detail)
	require.Equal(t, "online 0-3 (4 CPUs), cpu0 in package 0", byName[CPUTopology].Detail)
	require.Equal(t, "lists [eth0 lo], but this network namespace has []", byName[NetInterfaces].Detail)
	require.Contains(t, byName[LinksMount].Detail, "/var/lib/nvml-mock/sys/bus/pci/devices of ext4 /dev/vda, ro,nosuid,nodev")
	require.Regexp(t, `^1 of the node's \d+ PCI devices are not listed: 0000:00:1f.2 \(render with --host-devices merge\)$`, byName[NodeDevices].Detail)
	require.Equal(t, "LD_PRELOAD=/opt/nvml-mock/driver/usr/local/lib/libpcimocksys.so.1 loads nvml-mock's libpcimocksys: two PCI mocks would disagree; drop libpcimocksys from nvml-mock-nri's --ld-preload-shims and set MOCK_PCI_ROOT= empty (docs/user/nvml-mock.md)", byName[OtherMocks].Detail)
	entries, err := os.ReadDir(filepath.Join(f.sysfs, sysfs.LinksDir))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%d entries, each resolves to a device directory with a class", len(entries)), byName[LinksResolve].Detail)
}

func TestLiveReadsThisProcess(t *testing.T) {
	t.Parallel()
	sys := Live("/sys", plan.DefaultContainerRoot)
	b, err := sys.MountInfo()
	require.NoError(t, err)
	require.Contains(t, string(b), " / ", "the mount table names the root")
	names, err := sys.Interfaces()
	require.NoError(t, err)
	require.Contains(t, names, "lo")
	magic, err := sys.Statfs("/proc")
	require.NoError(t, err)
	require.Equal(t, int64(0x9fa0), magic, "PROC_SUPER_MAGIC")
	_, err = sys.Statfs("/nonexistent/path")
	require.True(t, errors.Is(err, os.ErrNotExist))
}

// addDevice puts a device with kernel-form links beside the mock ones.
func (f *fakeContainer) addDevice(t *testing.T, bdf, vendor, class string) {
	t.Helper()
	dir := filepath.Join(f.sysfs, "devices/pci0000:00", bdf)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, v := range map[string]string{"class": class, "vendor": vendor, "device": "0x1111"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644))
	}
	require.NoError(t, os.Symlink("../../../devices/pci0000:00/"+bdf, filepath.Join(f.sysfs, sysfs.LinksDir, bdf)))
}

// TestNVMLAgreement: the GPUs nvml-mock's NVML reports for the profile it
// serves (MOCK_NVML_CONFIG, or --nvml-profile) are the sysfs's GPUs.
func TestNVMLAgreement(t *testing.T) {
	t.Parallel()
	h100 := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "h100.yaml")
	fewer := filepath.Join(t.TempDir(), "h100-4.yaml")
	b, err := os.ReadFile(h100)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(fewer, []byte(strings.Replace(string(b), "\nsystem:\n", "\nsystem:\n  num_devices: 4\n", 1)), 0o644))

	tests := []struct {
		name, rendered string
		env            map[string]string
		flag           string
		ok             bool
		detail         []string
	}{
		{name: "nvml-mock's h100 served and rendered, from the environment", rendered: h100, env: map[string]string{compat.NVMLProfileEnv: h100}, ok: true,
			detail: []string{"the 8 GPUs NVML reports (00000000:1A:00.0 00000000:1B:00.0 00000000:4A:00.0 00000000:4B:00.0 00000000:8A:00.0 00000000:8B:00.0 00000000:CA:00.0 00000000:CB:00.0), with their device and subsystem ids, are the sysfs's GPUs, and no others"}},
		{name: "nvml-mock's h100 served and rendered, from --nvml-profile", rendered: h100, flag: h100, ok: true},
		{name: "--nvml-profile wins over the environment", rendered: h100, env: map[string]string{compat.NVMLProfileEnv: "/nonexistent.yaml"}, flag: h100, ok: true},
		{name: "no nvml-mock", rendered: h100, ok: true, detail: []string{"not compared: MOCK_NVML_CONFIG is not set and no --nvml-profile was given, so no nvml-mock NVML serves this container"}},
		{name: "our hgx-h100 rendered, nvml-mock's h100 served", rendered: "hgx-h100", env: map[string]string{compat.NVMLProfileEnv: h100},
			detail: []string{
				"NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, sysfs has no GPU at 0000:1a:00.0",
				"sysfs shows 0000:53:00.0 10de:2330 subsystem 10de:16c1, NVML reports no GPU at 0000:53:00.0",
			}},
		{name: "nvml-mock serves 4 of the 8 GPUs rendered", rendered: h100, env: map[string]string{compat.NVMLProfileEnv: fewer},
			detail: []string{"sysfs shows 0000:8a:00.0 10de:2330 subsystem 10de:1658, NVML reports no GPU at 0000:8a:00.0"}},
		{name: "the served profile is unreadable", rendered: h100, env: map[string]string{compat.NVMLProfileEnv: "/nonexistent.yaml"},
			detail: []string{"NVML's profile: ", "/nonexistent.yaml"}},
	}
	// One render per profile: the cases change only the environment.
	containers := map[string]*fakeContainer{}
	for _, tc := range tests {
		if containers[tc.rendered] == nil {
			containers[tc.rendered] = newFakeContainer(t, tc.rendered)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := *containers[tc.rendered]
			f.env = tc.env
			f.nvmlProfile = tc.flag
			m, err := overlay.LoadMachine(tc.rendered, "")
			require.NoError(t, err)
			r := Run(m, f.system())
			var row compat.Result
			for _, c := range r.Results {
				if c.Check == compat.NVMLAgreement {
					row = c
				}
			}
			require.Equal(t, tc.ok, row.OK, "%+v", row)
			for _, d := range tc.detail {
				require.Contains(t, row.Detail, d)
			}
			if tc.ok {
				require.Empty(t, r.Failures())
			} else {
				require.Equal(t, []string{compat.NVMLAgreement}, failing(r), "only the NVML row fails: the sysfs is consistent with what was rendered")
			}
		})
	}
}
