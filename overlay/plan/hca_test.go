package plan_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// TestGoldenDigestsWithoutNewBlocks plans every profile of
// testdata/golden-digests.txt, in every hierarchy, with its infiniband block,
// machine type, driver version and GPUs' NVML identities taken away: the
// plan must be byte for byte the one the commit before HCAs made. The shared nvml-mock profiles carry infiniband
// blocks that the base commit ignored, so they check the same thing.
func TestGoldenDigestsWithoutNewBlocks(t *testing.T) {
	f, err := os.Open("testdata/golden-digests.txt")
	require.NoError(t, err)
	defer f.Close()
	local := map[string]string{}
	for _, p := range profilesUnderTest(t) {
		local[filepath.Base(p)] = p
	}
	rows := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		var name, h, digest string
		_, err := fmt.Sscan(line, &name, &h, &digest)
		require.NoError(t, err, line)
		if h == "-" {
			h = ""
		}
		file, ok := local[name]
		if !ok && strings.HasSuffix(name, ".yaml") {
			// nvml-mock's, and ../shared is absent: the row says so.
			t.Run(name+"/"+h, func(t *testing.T) { overlaytest.Missing(t, "%s is nvml-mock's profile, and ../shared is absent", name) })
			continue
		}
		require.True(t, ok, "built-in %s is gone: recompute testdata/golden-digests.txt at the commit it names", name)
		rows++
		t.Run(name+"/"+h, func(t *testing.T) {
			m := machine(t, file, boards.Hierarchy(h))
			m.HCAs, m.ProductName, m.DriverVersion = nil, "", ""
			withoutNVMLIdentities(m)
			p, err := plan.New(m, plan.Options{})
			require.NoError(t, err)
			require.NotEmpty(t, p.Modules)
			require.Equal(t, digest, withoutModuleView(p).Digest())
		})
	}
	require.NoError(t, sc.Err())
	require.Greater(t, rows, 20)
}

// withoutModuleView is p without the module view, which the golden
// digests' commit did not have: the rest of the plan must be byte for byte
// what it was. A plan that is not writable has nothing else under the
// host-sys directory.
func withoutModuleView(p *plan.Plan) *plan.Plan {
	out := *p
	out.Entries = nil
	for _, e := range p.Entries {
		if under(e.Path, plan.ModulesDir) || under(e.Path, plan.HostSysDir) || under(e.Path, plan.ProcDir) {
			continue
		}
		out.Entries = append(out.Entries, e)
	}
	return &out
}

// withoutNVMLIdentities gives m's GPUs the uuid and minor number the
// effective profile need not write back (IdentifyDevices' for its entry),
// as a profile stating none gets: the golden digests' commit wrote none.
func withoutNVMLIdentities(m *profile.Machine) {
	for i, d := range m.Devices {
		if d.Kind == profile.GPU {
			m.Devices[i].UUID, m.Devices[i].Minor = profile.DeviceUUID(d.Index, d.Address.String()), uint32(d.Index)
		}
	}
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// TestDigestChangesWithTheNewBlocks is the golden test's negative control:
// the same profiles with their HCAs or machine type do plan differently.
func TestDigestChangesWithTheNewBlocks(t *testing.T) {
	m := machine(t, "hgx-h100", "")
	require.NotNil(t, m.HCAs)
	require.Equal(t, "DGX H100", m.ProductName)
	with, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	m.HCAs = nil
	nameOnly, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	m.ProductName = ""
	neither, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	require.NotEqual(t, neither.Digest(), with.Digest())
	require.NotEqual(t, neither.Digest(), nameOnly.Digest())
}

// hcaBuses maps each GPU to the addresses of its HCAs.
func hcaBuses(t *testing.T, m *profile.Machine, opts plan.Options) map[pciaddr.Address][]pciaddr.Address {
	t.Helper()
	p := mustPlan(t, m, opts)
	out := map[pciaddr.Address][]pciaddr.Address{}
	for _, h := range p.Tree.HCAs {
		out[h.GPU.Address] = append(out[h.GPU.Address], h.Node.Address)
	}
	carriers := 0
	for _, g := range m.GPUs() {
		if m.HCAs.Carries(g.Index) {
			carriers++
		}
	}
	require.Len(t, p.Tree.HCAs, carriers*m.HCAs.PerGPU)
	return out
}

// TestHCAsOnSomeGPUs plans infiniband.gpus: only the GPUs listed carry
// HCAs, numbered consecutively in GPU index order; and the end-to-end
// suite's PCIe server, whose roots do not all have a NIC, gets its HCAs on
// the roots beside the GPUs it names, in every hierarchy.
func TestHCAsOnSomeGPUs(t *testing.T) {
	p, _ := shipped.Get("hgx-h100")
	p.InfiniBand.GPUs = &[]int{6, 1}
	pl := mustPlan(t, normalize(t, p), plan.Options{})
	var gpus, indexes []int
	for _, h := range pl.Tree.HCAs {
		gpus = append(gpus, h.GPU.Device.Index)
		indexes = append(indexes, h.Node.Device.Index)
	}
	require.Equal(t, []int{1, 6}, gpus)
	require.Equal(t, []int{0, 1}, indexes)

	const someRoots = "../../testdata/suite-profiles/hcas-on-some-roots.yaml"
	for _, h := range append([]boards.Hierarchy{""}, boards.Hierarchies()...) {
		t.Run(string(h), func(t *testing.T) {
			pl := mustPlan(t, machine(t, someRoots, h), plan.Options{})
			perRoot := map[string]int{}
			for _, hca := range pl.Tree.HCAs {
				perRoot[hca.Node.RootComplex.String()]++
			}
			require.Equal(t, map[string]int{"pci0000:20": 2, "pci0000:a0": 1}, perRoot, "pci0000:40 has GPUs and no HCA")
		})
	}
}

func normalize(t *testing.T, p *profile.Profile) *profile.Machine {
	t.Helper()
	m, err := profile.Normalize("test", p, profile.Options{})
	require.NoError(t, err)
	return m
}

// TestHCABusesStableWhenGPUsAreAdded adds GPUs to machines of each shape and
// checks that no GPU that was there before sees its HCAs move.
func TestHCABusesStableWhenGPUsAreAdded(t *testing.T) {
	t4 := func(n, per int) *profile.Profile {
		return &profile.Profile{
			System:         profile.SystemConfig{NumDevices: ptr(n)},
			DeviceDefaults: profile.DeviceConfig{PCI: profile.PCIConfig{DeviceID: profile.Pack(boards.VendorNVIDIA, 0x1eb8)}},
			PCIeTopology:   &profile.PCIeTopology{Hierarchy: "flat"},
			InfiniBand:     &profile.InfiniBand{Enabled: true, HCAsPerGPU: ptr(per), LinkLayer: "Ethernet"},
		}
	}
	cases := []struct {
		name          string
		before, after func() *profile.Profile
	}{
		{"a GPU on a root complex of its own (built-in hgx-h100)", func() *profile.Profile {
			p, _ := shipped.Get("hgx-h100")
			return p
		}, func() *profile.Profile {
			p, _ := shipped.Get("hgx-h100")
			p.Devices = append(p.Devices, profile.DeviceConfig{Index: ptr(8), PCI: profile.PCIConfig{BusID: "0000:db:00.0"}})
			p.PCIeTopology.RootComplexes = append(p.PCIeTopology.RootComplexes, profile.RootComplexConfig{ID: "pci0000:d8", Devices: []string{"0000:db:00.0"}})
			return p
		}},
		{"a pair of GPUs on a switch of their own (built-in dgx-a100)", func() *profile.Profile {
			p, _ := shipped.Get("dgx-a100")
			return p
		}, func() *profile.Profile {
			p, _ := shipped.Get("dgx-a100")
			for i, bus := range []string{"0000:27:00.0", "0000:2f:00.0"} {
				p.Devices = append(p.Devices, profile.DeviceConfig{Index: ptr(8 + i), PCI: profile.PCIConfig{BusID: bus}})
			}
			return p
		}},
		{"nvml-mock's default numbering, one GPU per bus (flat)", func() *profile.Profile { return t4(4, 2) }, func() *profile.Profile { return t4(12, 2) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := hcaBuses(t, normalize(t, tc.before()), plan.Options{})
			after := hcaBuses(t, normalize(t, tc.after()), plan.Options{})
			require.Greater(t, len(after), len(before))
			for gpu, hcas := range before {
				require.Equal(t, hcas, after[gpu], "HCAs of GPU %s", gpu)
			}
		})
	}
}

// TestHCAsAvoidHostDevices reserves, as host devices, exactly the buses the
// HCAs took: planned again, every HCA moves elsewhere and no bridge range
// holds a host device's bus.
func TestHCAsAvoidHostDevices(t *testing.T) {
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "h100.yaml"} {
		t.Run(name, func(t *testing.T) {
			if strings.HasSuffix(name, ".yaml") {
				name = filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), name) // nvml-mock's own
			}
			m, err := overlay.LoadMachine(name, "")
			require.NoError(t, err)
			first := hcaBuses(t, m, plan.Options{})
			var host []plan.HostDevice
			taken := map[pciaddr.Address]bool{}
			for _, hcas := range first {
				for _, a := range hcas {
					taken[a] = true
					host = append(host, plan.HostDevice{Address: a, Target: "../../../devices/pci0000:00/0000:00:1c.0/" + a.String()})
				}
			}
			p := mustPlan(t, m, plan.Options{HostDevices: host})
			for _, h := range p.Tree.HCAs {
				require.False(t, taken[h.Node.Address], "HCA %s of GPU %s on a host device's address", h.Node.Address, h.GPU.Address)
			}
		})
	}
}

// TestHCAFacts checks an HCA's identity, files and link against the board
// facts: a ConnectX-7 in InfiniBand mode and one in Ethernet mode.
func TestHCAFacts(t *testing.T) {
	for _, layer := range []string{"InfiniBand", "Ethernet"} {
		t.Run(layer, func(t *testing.T) {
			p, _ := shipped.Get("hgx-h100")
			p.InfiniBand.LinkLayer = layer
			pl := mustPlan(t, normalize(t, p), plan.Options{Host: twoNodeHost()})
			fs := files(pl)
			class := map[string]string{"InfiniBand": "0x020700\n", "Ethernet": "0x020000\n"}[layer]
			for _, h := range pl.Tree.HCAs {
				dir := "sys/" + h.Node.SysPath()
				get := func(name string) string { return text(t, fs, dir+"/"+name) }
				require.Equal(t, "0x15b3\n", get("vendor"))
				require.Equal(t, "0x1021\n", get("device"))
				require.Equal(t, class, get("class"))
				require.True(t, strings.HasPrefix(get("modalias"), "pci:v000015B3d00001021sv000015B3sd00001021bc02sc0"+class[5:6]+"i00"), get("modalias"))
				require.Equal(t, "32.0 GT/s PCIe\n", get("current_link_speed"))
				require.Equal(t, "16\n", get("current_link_width"))
				require.Equal(t, fmt.Sprintf("%d\n", h.GPU.NUMANode), get("numa_node"))
				require.Equal(t, text(t, fs, "sys/"+h.GPU.SysPath()+"/local_cpus"), get("local_cpus"))
				require.Contains(t, get("uevent"), "DRIVER="+profile.DriverMLX5+"\n")
				require.Equal(t, h.GPU.Parent.Parent, h.Node.Parent.Parent, "%s beside GPU %s under one switch", h.Node.Address, h.GPU.Address)
			}
			require.Equal(t, "DGX H100\n", text(t, fs, plan.ProductNameFile))
		})
	}
}

// TestHCAConnectX9Identity renders the Vera Rubin tray's ConnectX-9 HCAs
// (hca_type MT4133) and reads each one's identity back from its files:
// device 0x1025 (4133 in decimal), the subsystem the table gives every
// generation (Mellanox, the device id), its Gen6 x16 link, and BAR0 and the
// ROM at the table's sizes.
func TestHCAConnectX9Identity(t *testing.T) {
	m := machine(t, "../../testdata/profiles/vera-rubin-tray.yaml", "")
	cx9, err := boards.LookupHCA("MT4133")
	require.NoError(t, err)
	pl := mustPlan(t, m, plan.Options{})
	fs := files(pl)
	require.NotEmpty(t, pl.Tree.HCAs)
	for _, h := range pl.Tree.HCAs {
		get := func(name string) string { return text(t, fs, "sys/"+h.Node.SysPath()+"/"+name) }
		require.Equal(t, "0x15b3\n", get("vendor"))
		require.Equal(t, "0x1025\n", get("device"), "ConnectX-9 is MT4133, device id 4133 = 0x1025")
		require.Equal(t, fmt.Sprintf("0x%04x\n", cx9.Device), get("device"))
		require.Equal(t, fmt.Sprintf("0x%04x\n", boards.VendorMellanox), get("subsystem_vendor"))
		require.Equal(t, fmt.Sprintf("0x%04x\n", cx9.Device), get("subsystem_device"), "the table's subsystem device is the device id")
		require.Equal(t, fmt.Sprintf("0x%02x\n", boards.HCARevision), get("revision"))
		require.Equal(t, sysfs.LinkSpeed(cx9.LinkGen)+"\n", get("max_link_speed"))
		require.Equal(t, fmt.Sprintf("%d\n", cx9.LinkWidth), get("max_link_width"))
		lines := strings.Split(get("resource"), "\n")
		size := func(line string) uint64 {
			var start, end, flags uint64
			_, err := fmt.Sscanf(line, "0x%x 0x%x 0x%x", &start, &end, &flags)
			require.NoError(t, err, line)
			return end - start + 1
		}
		require.Equal(t, boards.HCABAR0Bytes, size(lines[0]), "BAR0")
		require.Equal(t, boards.HCAROMBytes, size(lines[sysfs.ResourceROMLine]), "ROM")
	}
}

// nvmlMockProfiles lists nvml-mock's own profiles beside the repository,
// found in a subtest of t's that stops (overlaytest.SharedTestdata: a
// failure under make) where ../shared is absent, so t's other rows still
// run and the missing ones are counted, where a glob dropped them.
func nvmlMockProfiles(t *testing.T) []string {
	var files []string
	t.Run("nvml-mock profiles", func(t *testing.T) {
		dir := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
		files, _ = filepath.Glob(filepath.Join(dir, "*.yaml"))
		if len(files) == 0 {
			t.Fatalf("%s holds no profile: nvml-mock's profiles are its *.yaml", dir)
		}
	})
	return files
}
