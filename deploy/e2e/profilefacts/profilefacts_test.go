package profilefacts_test

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// binaries holds the product binary, built once for the tests that run it.
var binaries hosttest.Binaries

func TestMain(m *testing.M) {
	os.Exit(binaries.Removed(overlaytest.Main(m)))
}

// TestLiterals reads profiles against facts written out by hand from
// their files: nvml-mock's T4 (its bus ids in upper case, one root), a
// profile with no pcie_topology (no root, no NUMA node, no name), the
// consumer suite's two domains (a named machine, NUMA -1 and 1, domain
// 000a written upper case), a passthrough node (drivers) and the t4-vm
// built-in as `profiles --show` prints it.
func TestLiterals(t *testing.T) {
	repo := overlaytest.Repo(t)
	type gpu struct {
		bus, name, root string
		numa            int
		numaGiven       bool
		driver          string
	}
	t4 := func(bus string) gpu { return gpu{bus, "NVIDIA T4", "pci0000:00", 0, true, "nvidia"} }
	h100 := "NVIDIA H100 80GB HBM3"
	for _, c := range []struct {
		file, machine string
		topology      bool
		gpus          []gpu
	}{
		{filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "t4.yaml"), "", true,
			[]gpu{t4("0000:3b:00.0"), t4("0000:86:00.0"), t4("0000:af:00.0"), t4("0000:d8:00.0")}},
		{filepath.Join(repo, "testdata/profiles/no-topology.yaml"), "", false, []gpu{
			{"0000:00:1e.0", "", "", 0, false, "nvidia"}, {"0000:3b:00.0", "", "", 0, false, "nvidia"}, {"0002:81:00.0", "", "", 0, false, "nvidia"}}},
		{filepath.Join(repo, "testdata/suite-profiles/two-domains.yaml"), "Mock 2-Domain Server (e2e)", true, []gpu{
			{"0002:3b:00.0", h100, "pci0002:30", -1, true, "nvidia"}, {"0002:3c:00.0", h100, "pci0002:30", -1, true, "nvidia"},
			{"0002:9d:00.0", h100, "pci0002:90", 1, true, "nvidia"},
			{"000a:05:00.0", h100, "pci000a:00", 1, true, "nvidia"}, {"000a:06:00.0", h100, "pci000a:00", 1, true, "nvidia"}}},
		{filepath.Join(repo, "testdata/profiles/vfio-passthrough.yaml"), "", true, []gpu{
			{"0000:18:00.0", h100, "pci0000:15", 0, true, "vfio-pci"}, {"0000:2a:00.0", h100, "pci0000:27", 0, true, "vfio-pci"},
			{"0000:ba:00.0", h100, "pci0000:b7", 1, true, "vfio-pci"}, {"0000:db:00.0", h100, "pci0000:d8", 1, true, "nvidia"}}},
		{builtin(t, "t4-vm"), "", true, []gpu{
			{"0000:00:1b.0", "Tesla T4", "pci0000:00", -1, true, "nvidia"}, {"0000:00:1c.0", "Tesla T4", "pci0000:00", -1, true, "nvidia"},
			{"0000:00:1d.0", "Tesla T4", "pci0000:00", -1, true, "nvidia"}, {"0000:00:1e.0", "Tesla T4", "pci0000:00", -1, true, "nvidia"}}},
	} {
		t.Run(filepath.Base(c.file), func(t *testing.T) {
			p, err := profilefacts.Read(c.file)
			require.NoError(t, err)
			require.Equal(t, c.machine, p.Machine)
			require.Equal(t, c.topology, p.Topology)
			var got []gpu
			for i, g := range p.GPUs {
				require.Equal(t, i, g.Index)
				got = append(got, gpu{g.BusID, g.Name, g.Root, g.NUMANode, g.NUMAGiven, g.Driver})
			}
			require.Equal(t, c.gpus, got)
		})
	}
}

// TestDefaults: nvml-mock's rules for what a profile leaves out. A device
// without a bus id is 0000:<index>:00.0 (hex), system.num_devices adds
// devices that take the defaults, an entry's index places it, ids may be
// YAML integers or strings, NVML's 8-digit domain is read.
func TestDefaults(t *testing.T) {
	p, err := profilefacts.Parse("defaults.yaml", []byte(`
system: {num_devices: 3, product_name: "  Some Box  "}
device_defaults:
  name: Default
  pci: {device_id: 0x233010DE, class: "0x030000"}
devices:
  - {index: 11, name: Eleventh, pci: {bus_id: "00000001:0A:1F.7", device_id: "0x2330", subsystem_id: 0x16C110DE, driver: vfio-pci}}
  - {index: 1}
`))
	require.NoError(t, err)
	require.Equal(t, "Some Box", p.Machine)
	require.False(t, p.Topology)
	var got []string
	for _, g := range p.GPUs {
		got = append(got, strings.Join([]string{g.BusID, g.Name, hex(g.DeviceID), hex(g.SubsystemID), hex(g.Class), g.Driver, g.RootSaid()}, " "))
	}
	none := "not given (no pcie_topology places it)"
	require.Equal(t, []string{
		"0000:00:00.0 Default 0x233010de 0x0 0x30000 nvidia " + none,
		"0000:01:00.0 Default 0x233010de 0x0 0x30000 nvidia " + none,
		"0000:02:00.0 Default 0x233010de 0x0 0x30000 nvidia " + none,
		"0001:0a:1f.7 Eleventh 0x2330 0x16c110de 0x30000 vfio-pci " + none,
	}, got)
	require.Len(t, p.NVIDIABound(), 3)

	for _, bad := range []string{
		`devices: [{pci: {bus_id: "0000:3B:00"}}]`,
		`devices: [{pci: {bus_id: "0000:3B:20.0"}}]`,
		`devices: [{index: 1}, {index: 1}]`,
		`devices: [{pci: {device_id: "H100"}}]`,
		`pcie_topology: {root_complexes: [{id: pci0000:00, devices: ["nowhere"]}]}`,
		`devices: "a string"`,
	} {
		_, err := profilefacts.Parse("bad.yaml", []byte(bad))
		require.Error(t, err, "%s", bad)
		require.Contains(t, err.Error(), "profile bad.yaml: ", "the error names the file")
	}
}

// TestHCAs reads the infiniband block's SR-IOV facts as given: the HCA
// type and its device id (MT<n>, n in decimal), and sriov_totalvfs; none
// where the block names none.
func TestHCAs(t *testing.T) {
	p, err := profilefacts.Read(filepath.Join(overlaytest.Repo(t), "testdata/profiles/sriov.yaml"))
	require.NoError(t, err)
	require.Equal(t, "MT4129", p.HCAType)
	require.Equal(t, 8, p.TotalVFs)
	id, err := p.HCADevice()
	require.NoError(t, err)
	require.Equal(t, uint16(0x1021), id, "ConnectX-7")
	for _, g := range p.GPUs {
		require.Equal(t, 1, g.HCAs, "GPU %s", g.BusID)
	}

	p, err = profilefacts.Parse("no-type.yaml", []byte("infiniband: {enabled: true}\n"))
	require.NoError(t, err)
	require.Empty(t, p.HCAType)
	require.Zero(t, p.TotalVFs)
	for _, bad := range []string{"", "4129", "MTx", "MT99999"} {
		p.HCAType = bad
		_, err := p.HCADevice()
		require.ErrorContains(t, err, "profile no-type.yaml: infiniband.hca_type: value \""+bad+"\"", bad)
	}
}

// TestEveryProfile reads every profile of the repository's testdata, of
// the suites' own testdata, of ../shared and every built-in, and checks
// the facts against the product's render of it, read back by this reader
// from the effective profile the binary writes (every value explicit):
// the same GPUs at the same bus ids, names, ids, classes and drivers, the
// same machine named, and the root and NUMA node of every GPU whose root
// the profile gives. Where it gives none the render's root is its own
// inference, which the test logs and does not judge. A profile the binary
// refuses must be one of testdata/hostile, the refusals on purpose.
func TestEveryProfile(t *testing.T) {
	repo := overlaytest.Repo(t)
	bin := binaries.Binary(t)
	var files []string
	for _, glob := range []string{"testdata/*.yaml", "testdata/*/*.yaml"} {
		found, err := filepath.Glob(filepath.Join(repo, glob))
		require.NoError(t, err)
		files = append(files, found...)
	}
	shared, err := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, shared, "nvml-mock's own profiles")
	files = append(files, shared...)
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		files = append(files, builtin(t, name))
	}
	files = append(files, standalone(t))
	compared, inferred := 0, 0
	judged := map[string]bool{}
	for _, file := range files {
		rel, _ := filepath.Rel(repo, file)
		root := filepath.Join(t.TempDir(), "tree")
		out, renderErr := exec.Command(bin, "render", "--no-binary", "--profile", file, "--root", root).CombinedOutput()
		p, err := profilefacts.Read(file)
		if renderErr != nil {
			require.True(t, strings.HasPrefix(rel, "testdata/hostile/"), "%s: the binary refuses a profile the suites do not mean to be refused: %s", rel, out)
			continue
		}
		require.NoError(t, err, "%s: a profile the binary renders", rel)
		effective, err := profilefacts.Read(filepath.Join(root, "effective-profile.json"))
		require.NoError(t, err, "%s's effective profile", rel)
		require.Equal(t, p.Machine, effective.Machine, "%s: the machine named", rel)
		requireHCAs(t, rel, p, root)
		require.Len(t, effective.GPUs, len(p.GPUs), "%s: GPUs", rel)
		for i, g := range p.GPUs {
			e := effective.GPUs[i]
			require.Equal(t, []any{g.Index, g.BusID, g.Name, g.DeviceID, g.Class, g.Driver}, []any{e.Index, e.BusID, e.Name, e.DeviceID, e.Class, e.Driver}, "%s: GPU %d", rel, i)
			if g.SubsystemID != 0 {
				require.Equal(t, g.SubsystemID, e.SubsystemID, "%s: GPU %d's subsystem", rel, i)
			}
			require.True(t, e.RootGiven(), "%s: the effective profile places GPU %s", rel, e.BusID)
			if !g.RootGiven() {
				inferred++
				t.Logf("%s: GPU %s's root is the render's inference: %s (NUMA %d)", rel, g.BusID, e.Root, e.NUMANode)
				continue
			}
			require.Equal(t, g.Root, e.Root, "%s: GPU %s's root", rel, g.BusID)
			if g.NUMAGiven {
				require.Equal(t, g.NUMANode, e.NUMANode, "%s: GPU %s's NUMA node", rel, g.BusID)
			}
		}
		compared++
		// The literals of the suites' own profiles against the render:
		// the machine it wrote for GFD, the roots it inferred.
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		if strings.HasPrefix(rel, "testdata/hostile/") || strings.HasPrefix(rel, "testdata/flip/") {
			continue
		}
		require.NoError(t, p.Literal(name), rel)
		machine, _ := os.ReadFile(filepath.Join(root, "dmi", "product_name"))
		if p.MachineFrom != "" {
			require.Equal(t, strings.TrimSpace(string(machine)), p.Machine, "%s: the machine (%s)", rel, p.MachineFrom)
		}
		for i, g := range p.GPUs {
			if g.Root == "" {
				continue
			}
			require.Equal(t, effective.GPUs[i].Root, g.Root, "%s: GPU %s's root (%s)", rel, g.BusID, g.RootFrom)
			require.Equal(t, effective.GPUs[i].NUMANode, g.NUMANode, "%s: GPU %s's NUMA node (%s)", rel, g.BusID, g.RootFrom)
			if g.RootFrom == profilefacts.FromLiteral {
				judged[name] = true
			}
		}
		if p.MachineFrom == profilefacts.FromLiteral {
			judged[name] = true
		}
	}
	t.Logf("%d profiles compared with their renders, %d GPUs' roots inferred by the render", compared, inferred)
	require.GreaterOrEqual(t, compared, 24, "profiles compared")
	require.Positive(t, inferred, "a profile without pcie_topology was among them")
	require.Equal(t, profilefacts.LiteralNames(), slices.Sorted(maps.Keys(judged)), "every literal judged against a render")
}

// standalone writes the standalone ConfigMap's profile (the node suite's)
// as a file named as literals names it.
func standalone(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(overlaytest.Repo(t), "deploy/kubernetes/standalone/nvml-mock-config.yaml"))
	require.NoError(t, err)
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var cm struct {
			Kind string
			Data map[string]string
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &cm))
		if cm.Kind == "ConfigMap" {
			file := filepath.Join(t.TempDir(), "nvml-mock-config.yaml")
			require.NoError(t, os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o644))
			return file
		}
	}
	t.Fatal("no ConfigMap in the standalone manifest")
	return ""
}

// builtin writes a built-in profile as the binary prints it.
func builtin(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command(binaries.Binary(t), "profiles", "--show", name).Output()
	require.NoError(t, err, "profiles --show %s", name)
	file := filepath.Join(t.TempDir(), name+".yaml")
	require.NoError(t, os.WriteFile(file, out, 0o644))
	return file
}

func hex(v uint32) string { return fmt.Sprintf("%#x", v) }

// requireHCAs requires the tree's Mellanox functions to be the HCAs the
// reader says, root complex by root complex: each GPU's HCAs on its root
// where the profile places the GPU, and as many in all where it does not.
func requireHCAs(t *testing.T, rel string, p *profilefacts.Profile, root string) {
	t.Helper()
	want, wantAll := map[string]int{}, 0
	placed := true
	for _, g := range p.GPUs {
		wantAll += g.HCAs
		if g.HCAs == 0 {
			continue
		}
		if !g.RootGiven() {
			placed = false
			continue
		}
		want[g.Root] += g.HCAs
	}
	require.Equal(t, p.HCAs, wantAll > 0, "%s: HCAs, and some GPU carrying them", rel)
	got, gotAll := map[string]int{}, 0
	devices := filepath.Join(root, "sys", "devices")
	err := filepath.WalkDir(devices, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "vendor" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil || strings.TrimSpace(string(b)) != "0x15b3" {
			return err
		}
		rel, _ := filepath.Rel(devices, path)
		got[strings.Split(rel, string(filepath.Separator))[0]]++
		gotAll++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, wantAll, gotAll, "%s: the tree's Mellanox functions, as many as the HCAs the reader says", rel)
	if placed {
		require.Equal(t, want, got, "%s: the tree's Mellanox functions per root complex, each GPU's HCAs on its root", rel)
	}
}
