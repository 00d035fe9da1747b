package profile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

// sharedProfiles lists nvml-mock's own profiles, in the directory the
// external tests' overlaytest.SharedTestdata finds (SharedProfilesDir): a
// failure under make where ../shared is absent, a skip saying why
// elsewhere.
func sharedProfiles(t *testing.T) []string {
	t.Helper()
	if sharedProfilesDir == nil {
		t.Fatal("SharedProfilesDir is unset: known_keys_test.go's init sets it")
	}
	dir := sharedProfilesDir(t)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s holds no profile (%v): nvml-mock's profiles are its *.yaml", dir, err)
	}
	return files
}

func load(t *testing.T, path string) *Machine {
	t.Helper()
	p, err := LoadFile(path)
	require.NoError(t, err)
	m, err := Normalize(path, p, Options{})
	require.NoError(t, err)
	return m
}

func TestSharedProfiles(t *testing.T) {
	want := map[string]struct {
		gpus, switches, rcs int
		device, subsys      uint16
	}{
		"a100.yaml":  {8, 6, 2, 0x20b0, 0x1347},
		"h100.yaml":  {8, 4, 2, 0x2330, 0x1658},
		"gb200.yaml": {8, 4, 4, 0x2341, 0x1817},
		"t4.yaml":    {4, 0, 1, 0x1eb8, 0x12a2},
	}
	// The repository's own profiles always run: every GPU an NVIDIA
	// function of display class at a valid address.
	inRepo, err := filepath.Glob("../../testdata/profiles/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, inRepo)
	for _, f := range inRepo {
		t.Run("in-repo/"+filepath.Base(f), func(t *testing.T) {
			m := load(t, f)
			require.NotEmpty(t, m.GPUs())
			for _, d := range m.GPUs() {
				require.Equal(t, boards.VendorNVIDIA, d.Vendor)
				require.Contains(t, []uint32{Class3DController, ClassVGAController}, d.Class)
				require.True(t, pciaddr.IsBDF(d.Address.String()))
			}
		})
	}
	// nvml-mock's own profiles: this subtest skips without ../shared.
	t.Run("shared", func(t *testing.T) {
		for _, f := range sharedProfiles(t) {
			t.Run(filepath.Base(f), func(t *testing.T) {
				m := load(t, f)
				w, ok := want[filepath.Base(f)]
				require.True(t, ok, "a new shared profile: add its expectations")
				require.Len(t, m.GPUs(), w.gpus)
				require.Len(t, m.Devices, w.gpus+w.switches)
				require.Len(t, m.RootComplexes, w.rcs)
				for _, d := range m.GPUs() {
					require.Equal(t, boards.VendorNVIDIA, d.Vendor)
					require.Equal(t, w.device, d.DeviceID, "the profile's own ids, not the real board's")
					require.Equal(t, w.subsys, d.SubsystemDevice)
					require.Equal(t, Class3DController, d.Class)
					require.True(t, pciaddr.IsBDF(d.Address.String()))
				}
			})
		}
	})
}

func TestNormalizeUnusualNumbering(t *testing.T) {
	m := load(t, "../../testdata/profiles/domains.yaml")
	var got []string
	for _, d := range m.Devices {
		got = append(got, d.Address.String()+"@"+d.RootComplex.String())
	}
	require.Equal(t, []string{
		"0001:1a:00.0@pci0001:00", "0001:1b:00.0@pci0001:00",
		"000a:41:00.0@pci000a:40", "000a:41:00.1@pci000a:40", "000a:c3:00.0@pci000a:c0",
	}, got)
	require.Equal(t, -1, m.Devices[0].NUMANode)
	require.Equal(t, 1, m.Devices[2].NUMANode)
	require.Equal(t, uint64(128<<30), m.Devices[0].BAR1Bytes)
	require.Equal(t, Link{MaxGen: 5, CurrentGen: 5, MaxWidth: 16, CurrentWidth: 16}, m.Devices[0].Link)
	require.Equal(t, boards.HGX, m.Hierarchy, "H100 ids pick the HGX layout")
}

func TestNormalizeWithoutTopology(t *testing.T) {
	m := load(t, "../../testdata/profiles/no-topology.yaml")
	require.Equal(t, []RootComplex{{ID: pciaddr.RootComplex{Domain: 0}}, {ID: pciaddr.RootComplex{Domain: 2}}}, m.RootComplexes)
	for _, d := range m.Devices {
		require.Equal(t, pciaddr.RootComplex{Domain: d.Address.Domain}, d.RootComplex)
		require.Equal(t, 0, d.NUMANode)
	}
	require.Equal(t, boards.Flat, m.Hierarchy, "T4 ids pick the flat layout")
	require.Equal(t, uint64(256<<20), m.Devices[0].BAR1Bytes, "the T4 board's BAR1 when the profile has none")
}

// requireSameMachine requires each of outs, an effective profile written
// out, to read back as the machine m.
func requireSameMachine(t *testing.T, m *Machine, outs ...[]byte) {
	t.Helper()
	for _, out := range outs {
		p, err := Parse("effective", out)
		require.NoError(t, err)
		again, err := Normalize("effective", p, Options{})
		require.NoError(t, err)
		again.Source = m.Source
		require.Equal(t, m, again)
	}
}

func TestEffectiveRoundTrip(t *testing.T) {
	paths := []string{"../../testdata/profiles/domains.yaml", "../../testdata/profiles/tight.yaml", "../../testdata/profiles/no-topology.yaml",
		"../../testdata/suite-profiles/hcas-on-some-roots.yaml"} // infiniband.gpus
	roundTrip := func(t *testing.T, path string) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			m := load(t, path)
			yamlOut, err := Marshal(m.Effective(), "effective")
			require.NoError(t, err)
			require.Contains(t, string(yamlOut), "device_id: 0x", "packed words stay hex, as nvml-mock writes them")
			jsonOut, err := MarshalJSON(m.Effective())
			require.NoError(t, err)
			require.Contains(t, string(jsonOut), `"device_id": "0x`)
			requireSameMachine(t, m, yamlOut, jsonOut)
		})
	}
	for _, path := range paths {
		roundTrip(t, path)
	}
	// nvml-mock's own, in a subtest of their own: without ../shared it
	// alone stops (sharedProfiles), where a glob dropped them in silence.
	t.Run("nvml-mock", func(t *testing.T) {
		for _, path := range sharedProfiles(t) {
			roundTrip(t, path)
		}
	})
}

func TestHierarchyOverride(t *testing.T) {
	p, err := LoadFile("../../testdata/profiles/domains.yaml")
	require.NoError(t, err)
	m, err := Normalize("domains", p, Options{Hierarchy: boards.DGX})
	require.NoError(t, err)
	require.Equal(t, boards.DGX, m.Hierarchy)
	_, err = Normalize("domains", p, Options{Hierarchy: "mesh"})
	require.ErrorContains(t, err, `--hierarchy: value "mesh"`)
}

const minimal = `
device_defaults:
  pci: {device_id: 0x233010DE}
devices:
  - pci: {bus_id: "0000:18:00.0"}
`

func TestErrorsNameFieldAndValue(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		field string
		value string
		why   string
	}{
		{"bad bus id", "devices:\n  - pci: {bus_id: \"0000:18:00\", device_id: 0x233010DE}\n", "devices[0].pci.bus_id", "0000:18:00", "not a PCI address"},
		{"traversal in bus id", "devices:\n  - pci: {bus_id: \"../../etc/passwd\", device_id: 0x233010DE}\n", "devices[0].pci.bus_id", "../../etc/passwd", "not a PCI address"},
		{"no device id", "devices:\n  - pci: {bus_id: \"0000:18:00.0\"}\n", "devices[0].pci.device_id", "", "missing"},
		{"not NVIDIA", "devices:\n  - pci: {bus_id: \"0000:18:00.0\", device_id: 0x740C1002}\n", "devices[0].pci.device_id", "0x740C1002", "not NVIDIA"},
		{"word as text", "devices:\n  - pci: {bus_id: \"0000:18:00.0\", device_id: \"H100\"}\n", "devices[0].pci.device_id", "H100", "32-bit number"},
		{"wrong type", "devices:\n  - pci: {bus_id: [1, 2]}\n", "devices[0].pci.bus_id", "", "want a string, found a sequence"},
		{"index as text", "devices:\n  - index: first\n    pci: {bus_id: \"0000:18:00.0\", device_id: 0x233010DE}\n", "devices[0].index", "first", "want an integer"},
		{"duplicate", minimal + "  - pci: {bus_id: \"0000:18:00.0\"}\n", "devices[1].pci.bus_id", "0000:18:00.0", "same PCI address as devices[0].pci.bus_id"},
		{"duplicate across spellings", minimal + "  - pci: {bus_id: \"00000000:18:00.0\"}\n", "devices[1].pci.bus_id", "00000000:18:00.0", "same PCI address"},
		{"bad class", minimal + "  - pci: {bus_id: \"0000:19:00.0\", class: 0x068000}\n", "devices[1].pci.class", "0x068000", "NVSwitches go under nvlink.switches"},
		{"bad link gen", minimal + "  - pci: {bus_id: \"0000:19:00.0\"}\n    pcie: {max_link_gen: 9}\n", "devices[1].pcie.max_link_gen", "9", "generation"},
		{"bad width", minimal + "  - pci: {bus_id: \"0000:19:00.0\"}\n    pcie: {current_link_width: 3}\n", "devices[1].pcie.current_link_width", "3", "link width"},
		{"bar1 too small", minimal + "  - pci: {bus_id: \"0000:19:00.0\"}\n    bar1_memory: {total_bytes: 12}\n", "devices[1].bar1_memory.total_bytes", "12", "1 MiB to 16 TiB"},
		{"no devices", "version: \"1.0\"\n", "devices", "", "no devices: list them in devices[]"},
		{"duplicate index", minimal + "  - index: 0\n    pci: {bus_id: \"0000:19:00.0\"}\n", "devices[1].index", "0", "the same device index as devices[0]"},
		{"negative index", "devices:\n  - index: -1\n", "devices[0].index", "-1", "want a device index"},
		{"bad num_devices", minimal + "system: {num_devices: -3}\n", "system.num_devices", "-3", "want 0.."},
		{"defaults bus id shared", "device_defaults:\n  pci: {bus_id: \"0000:18:00.0\", device_id: 0x233010DE}\nsystem: {num_devices: 2}\n", "device_defaults.pci.bus_id", "0000:18:00.0", "the same PCI address as device_defaults.pci.bus_id"},
		{"default device without id", "system: {num_devices: 1}\n", "device_defaults.pci.device_id (device 0)", "", "missing"},
		{"defaults class", "device_defaults:\n  pci: {device_id: 0x233010DE, class: 0x020000}\ndevices:\n  - pci: {bus_id: \"0000:18:00.0\"}\n", "device_defaults.pci.class", "0x020000", "a GPU is 0x030200"},
		{"rc traversal", minimal + "pcie_topology:\n  root_complexes:\n    - id: \"pci0000:00/../../x\"\n      devices: []\n", "pcie_topology.root_complexes[0].id", "pci0000:00/../../x", "not a root complex id"},
		{"rc duplicate", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:00, devices: [\"0000:18:00.0\"]}\n    - {id: PCI0000:00, devices: []}\n", "pcie_topology.root_complexes[1].id", "PCI0000:00", "same root complex"},
		{"placed twice", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:00, devices: [\"0000:18:00.0\"]}\n    - {id: pci0000:10, devices: [\"0000:18:00.0\"]}\n", "pcie_topology.root_complexes[1].devices[0]", "0000:18:00.0", "already placed by pcie_topology.root_complexes[0].devices[0]"},
		{"unknown device", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:00, devices: [\"0000:99:00.0\"]}\n", "pcie_topology.root_complexes[0].devices[0]", "0000:99:00.0", "not in devices[]"},
		{"bus below root", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:40, devices: [\"0000:18:00.0\"]}\n", "pcie_topology.root_complexes[0].devices[0]", "0000:18:00.0", "below the root bus"},
		{"bus on root", "device_defaults:\n  pci: {device_id: 0x233010DE}\ndevices:\n  - pci: {bus_id: \"0000:40:00.0\"}\npcie_topology:\n  root_complexes:\n    - {id: pci0000:40, devices: [\"0000:40:00.0\"]}\n", "pcie_topology.root_complexes[0].devices[0]", "0000:40:00.0", "only a flat (VM) hierarchy"},
		{"bus of another rc", minimal + "  - pci: {bus_id: \"0000:90:00.0\"}\npcie_topology:\n  root_complexes:\n    - {id: pci0000:00, devices: [\"0000:18:00.0\", \"0000:90:00.0\"]}\n    - {id: pci0000:80, devices: []}\n", "pcie_topology.root_complexes[0].devices[1]", "0000:90:00.0", "lies in the range of pci0000:80"},
		{"domain mismatch", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0001:00, devices: [\"0000:18:00.0\"]}\n", "pcie_topology.root_complexes[0].devices[0]", "0000:18:00.0", "domain 0000 differs"},
		{"uncovered", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:20, devices: []}\n", "devices[0].pci.bus_id", "0000:18:00.0", "no root complex in pcie_topology covers"},
		{"bad numa", minimal + "pcie_topology:\n  root_complexes:\n    - {id: pci0000:00, numa_node: -2, devices: [\"0000:18:00.0\"]}\n", "pcie_topology.root_complexes[0].numa_node", "-2", "want -1"},
		{"bad hierarchy", minimal + "pcie_topology:\n  hierarchy: torus\n  root_complexes: []\n", "pcie_topology.hierarchy", "torus", "want one of"},
		{"nvswitch bdf", minimal + "nvlink:\n  switches:\n    - bdf: \"nope\"\n", "nvlink.switches[0].bdf", "nope", "not a PCI address"},
		{"nvswitch clash", minimal + "nvlink:\n  switches:\n    - bdf: \"0000:18:00.0\"\n", "nvlink.switches[0].bdf", "0000:18:00.0", "same PCI address as devices[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("bad.yaml", []byte(tt.yaml))
			if err == nil {
				_, err = Normalize("bad.yaml", p, Options{})
			}
			require.Error(t, err)
			var pe *Error
			require.True(t, errors.As(err, &pe), "%T: %v", err, err)
			require.Equal(t, "bad.yaml", pe.Source)
			require.Equal(t, tt.field, pe.Field)
			require.Equal(t, tt.value, pe.Value)
			require.ErrorContains(t, err, tt.why)
			require.NotContains(t, err.Error(), "\n", "one line")
			require.True(t, strings.HasPrefix(err.Error(), "profile bad.yaml: "+tt.field), err.Error())
		})
	}
}

func TestParseRefusesNonProfiles(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		why  string
	}{
		{"empty", nil, "empty"},
		{"scalar", []byte("just text"), "top level is a YAML scalar"},
		{"sequence", []byte("- a\n- b\n"), "top level is a YAML sequence"},
		{"not yaml", []byte("devices: [\n  {"), "not valid YAML"},
		{"nul", []byte("devices: []\x00"), "NUL byte at offset 11"},
		{"binary", []byte{0xff, 0xfe, 0x00, 0x01}, "NUL byte"},
		{"latin1", []byte("name: caf\xe9\n"), "not UTF-8"},
		{"too big", []byte(strings.Repeat("#", MaxSize+1)), "larger than the 4 MiB limit"},
		{"alias bomb", []byte(`a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
pcie_topology:
  root_complexes:
    - id: pci0000:00
      devices: *g
`), "profile x.yaml: g: value \"&g\": more than 4194304 YAML nodes once aliases are expanded: an alias bomb, refused"},
		// The schema nests too little for an exponential bomb to decode, so
		// the widest one is many aliases to one mapping: bounded too.
		{"wide alias bomb", []byte("m: &m {pci: {bus_id: \"0000:18:00.0\", device_id: 0x233010DE}, pcie: {max_link_gen: 4}}\ndevices: [" + strings.Repeat("*m,", 400000) + "*m]\n"), "an alias bomb, refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.yaml", tt.data)
			require.ErrorContains(t, err, tt.why)
			require.ErrorContains(t, err, "profile x.yaml: ")
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadFile(filepath.Join(dir, "missing.yaml"))
	require.ErrorContains(t, err, "missing.yaml")
	require.NoError(t, os.Chmod(dir, 0o750))
	_, err = LoadFile(dir)
	// The directory's real mode, not the bare type bits (d---------).
	require.ErrorContains(t, err, "not a regular file (drwxr-x---)")
	big := filepath.Join(dir, "big.yaml")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat("# pad\n", MaxSize/6+10)), 0o644))
	_, err = LoadFile(big)
	require.ErrorContains(t, err, "profile "+big+": larger than the 4 MiB limit")
}

func TestUnknownFieldsIgnored(t *testing.T) {
	p, err := Parse("x", []byte(minimal+"thermal: {fan: 3}\nsomething_new: [1, 2]\n"))
	require.NoError(t, err)
	m, err := Normalize("x", p, Options{})
	require.NoError(t, err)
	require.Len(t, m.Devices, 1)
}

func TestWordForms(t *testing.T) {
	for _, in := range []string{"0x233010DE", "\"0x233010de\"", "590352606"} {
		p, err := Parse("x", []byte("device_defaults:\n  pci: {device_id: "+in+"}\ndevices:\n  - pci: {bus_id: \"0000:18:00.0\"}\n"))
		require.NoError(t, err, in)
		m, err := Normalize("x", p, Options{})
		require.NoError(t, err, in)
		require.Equal(t, uint16(0x2330), m.Devices[0].DeviceID, in)
	}
}

// Devices follow nvml-mock's rules: devices[] entries override the device
// their index names, system.num_devices adds devices that take the
// defaults, and a device without an address gets 0000:<index>:00.0.
func TestDevicesAsNvmlMockCountsThem(t *testing.T) {
	p, err := Parse("x", []byte(`
system: {num_devices: 4}
device_defaults:
  pci: {device_id: 0x20B010DE}
devices:
  - index: 2
    pci: {bus_id: "0000:47:00.0", subsystem_id: 0x134F10DE}
  - index: 5
`))
	require.NoError(t, err)
	m, err := Normalize("x", p, Options{})
	require.NoError(t, err)
	var got []string
	for _, d := range m.Devices {
		got = append(got, fmt.Sprintf("%d@%s sub %04x", d.Index, d.Address, d.SubsystemDevice))
	}
	require.Equal(t, []string{
		"0@0000:00:00.0 sub 20b0", "1@0000:01:00.0 sub 20b0", "3@0000:03:00.0 sub 20b0",
		"5@0000:05:00.0 sub 20b0", "2@0000:47:00.0 sub 134f",
	}, got)
}

// nvml-mock's newest profile shapes (issue 25), in profiles of our own:
// each renders with no unknown key; the Vera Rubin tray's switches are off
// its PCIe bus and leave the machine; every board is known and names its
// machine, by NVML name where the id is a placeholder or ambiguous.
func TestNewestProfileShapes(t *testing.T) {
	tests := []struct {
		file            string
		gpus, switches  int
		offBus          int
		hcaType         string
		hcasPerGPU      int
		hierarchy       boards.Hierarchy
		board, machine  string
		bar1            uint64
		linkGen         int
		rootComplexIDs  []string
		productNameFrom string
	}{
		{"vera-rubin-tray.yaml", 4, 0, 4, "MT4133", 2, boards.Flat, boards.GenericName, "Vera Rubin NVL72", 512 << 30, 6, []string{"pci0002:80", "pci000a:80"}, ProductNameFromBoard},
		{"gb300-tray.yaml", 4, 2, 0, "MT4131", 2, boards.Flat, "NVIDIA GB300", "DGX GB300", 1 << 40, 6, []string{"pci0000:00", "pci0000:40"}, ProductNameFromBoard},
		{"b200-hgx.yaml", 4, 2, 0, "", 0, boards.DGX, "NVIDIA B200", "DGX B200", 256 << 30, 5, []string{"pci0000:00"}, ProductNameFromBoard},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			path := "../../testdata/profiles/" + tc.file
			p, err := LoadFile(path)
			require.NoError(t, err)
			require.Empty(t, p.Unknown, "every key is nvml-mock's or ours")
			m := load(t, path)
			require.Len(t, m.GPUs(), tc.gpus)
			require.Len(t, m.Devices, tc.gpus+tc.switches)
			require.Len(t, m.OffBusSwitches, tc.offBus)
			require.Equal(t, tc.hierarchy, m.Hierarchy)
			require.Equal(t, tc.machine, m.ProductName)
			require.Equal(t, tc.productNameFrom, m.ProductNameFrom)
			var rcs []string
			for _, rc := range m.RootComplexes {
				rcs = append(rcs, rc.ID.String())
			}
			require.Equal(t, tc.rootComplexIDs, rcs)
			for _, g := range m.GPUs() {
				b, ok := g.Board()
				require.True(t, ok)
				require.Equal(t, tc.board, b.Name)
				require.Equal(t, tc.bar1, g.BAR1Bytes)
				require.Equal(t, tc.linkGen, g.Link.MaxGen)
				require.True(t, pciaddr.IsBDF(g.Address.String()), "upper-case bus ids are read lower-case")
			}
			if tc.hcaType == "" {
				require.Nil(t, m.HCAs)
			} else {
				require.Equal(t, tc.hcaType, m.HCAs.Type)
				require.Equal(t, tc.hcasPerGPU, m.HCAs.PerGPU)
			}
			for _, d := range m.Devices {
				if d.Kind == NVSwitch {
					require.Equal(t, ClassNVSwitch, d.Class)
					require.Equal(t, uint16(0x22a3), d.DeviceID)
				}
			}
			// The effective profile reads back to the same machine, its
			// off-bus switches off the bus again.
			again, err := Normalize("effective", m.Effective(), Options{})
			require.NoError(t, err)
			again.Source = m.Source
			require.Equal(t, m, again)
		})
	}
}

// Switch placement, case by case: off the bus without a device_id; a
// device_id on a bus no root complex covers is refused in one line naming
// the file, the field and the value; on a covered bus it renders; on a
// GPU's address it is refused naming both entries.
func TestSwitchPlacement(t *testing.T) {
	const base = "device_defaults: {pci: {device_id: 0x307F10DE}}\ndevices:\n  - pci: {bus_id: \"0002:81:00.0\"}\npcie_topology:\n  root_complexes:\n    - {id: pci0002:80, devices: [\"0002:81:00.0\"]}\nnvlink:\n  switches:\n"
	tests := []struct {
		name, switches string
		offBus, on     int
		err            string
	}{
		{"off the bus", "    - {bdf: \"0000:01:00.0\"}\n", 1, 0, ""},
		{"device id off every root complex", "    - {bdf: \"0000:01:00.0\", device_id: 0x22A310DE}\n", 0, 0,
			"profile x.yaml: nvlink.switches[0].device_id: value \"0x22A310DE\": puts the switch at 0000:01:00.0 on this tray's PCIe bus, but no root complex in pcie_topology covers bus 01 of domain 0000; list 0000:01:00.0 under one, or drop device_id for a switch in a switch tray of its own (rendered off the bus)"},
		{"device id on a covered bus", "    - {bdf: \"0002:90:00.0\", device_id: 0x22A310DE}\n", 0, 1, ""},
		{"no device id on a covered bus", "    - {bdf: \"0002:90:00.0\"}\n", 0, 1, ""},
		{"on a GPU's address", "    - {bdf: \"0002:81:00.0\"}\n", 0, 0,
			"profile x.yaml: nvlink.switches[0].bdf: value \"0002:81:00.0\": the same PCI address as devices[0].pci.bus_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("x.yaml", []byte(base+tc.switches))
			require.NoError(t, err)
			m, err := Normalize("x.yaml", p, Options{})
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				require.NotContains(t, err.Error(), "\n")
				return
			}
			require.NoError(t, err)
			require.Len(t, m.OffBusSwitches, tc.offBus)
			require.Len(t, m.Devices, 1+tc.on)
		})
	}
}

// Boards are known by NVML name first, then by device id (real, then
// nvml-mock's placeholders); the generic name of pre-release boards names
// none.
func TestBoardFind(t *testing.T) {
	tests := []struct {
		name    string
		device  uint16
		want    string
		machine string
	}{
		{"NVIDIA GB300 NVL", 0x2941, "NVIDIA GB300", "DGX GB300"}, // nvml-mock's gb300: GB200's id
		{"", 0x2941, "NVIDIA GB200", "DGX GB200"},
		{"NVIDIA GB200", 0x2341, "NVIDIA GB200", "DGX GB200"},
		{"NVIDIA B200", 0x2340, "NVIDIA B200", "DGX B200"},
		{"", 0x2340, "NVIDIA B200", "DGX B200"},
		{"nvidia b200 ", 0x2901, "NVIDIA B200", "DGX B200"},
		{boards.GenericName, 0x307f, boards.GenericName, "Vera Rubin NVL72"},
		{boards.GenericName, 0x2330, "NVIDIA H100 80GB HBM3", "DGX H100"},
		{"NVIDIA A100-SXM4-40GB", 0x20b0, "NVIDIA A100-SXM4-40GB", "DGX A100"},
		{"NVIDIA H200", 0x2335, "NVIDIA H200", "DGX H200"},
		{"NVIDIA L40S", 0x26b9, "NVIDIA L40S", ""},
		{"Tesla T4", 0x1eb8, "Tesla T4", ""},
		{"NVIDIA H100 PCIe", 0x2331, "NVIDIA H100 PCIe", ""},
	}
	for _, tc := range tests {
		b, ok := boards.Find(tc.name, tc.device)
		require.True(t, ok, "%q %04x", tc.name, tc.device)
		require.Equal(t, tc.want, b.Name, "%q %04x", tc.name, tc.device)
		require.Equal(t, tc.machine, b.Machine, "%q %04x", tc.name, tc.device)
	}
	_, ok := boards.Find(boards.GenericName, 0x1234)
	require.False(t, ok)
}

// The profile's system.product_name always wins over the board's machine.
func TestProductNameWins(t *testing.T) {
	p, err := Parse("x.yaml", []byte("system: {product_name: My Rack}\ndevice_defaults: {name: NVIDIA B200, pci: {device_id: 0x234010DE}}\ndevices: [{}]\n"))
	require.NoError(t, err)
	m, err := Normalize("x.yaml", p, Options{})
	require.NoError(t, err)
	require.Equal(t, "My Rack", m.ProductName)
	require.Equal(t, ProductNameFromProfile, m.ProductNameFrom)
}

// A passthrough node (issue 26): pci.driver binds GPUs, all or some, to
// vfio-pci; the default is nvidia; an unknown driver, or vfio-pci asked of
// a device that is not a GPU, is refused in one line naming the file, the
// field and the value.
func TestVFIODriver(t *testing.T) {
	m := load(t, "../../testdata/profiles/vfio-passthrough.yaml")
	var drivers []string
	for _, g := range m.GPUs() {
		drivers = append(drivers, g.Driver)
	}
	require.Equal(t, []string{DriverVFIO, DriverVFIO, DriverVFIO, DriverNVIDIA}, drivers)
	require.Equal(t, 3, m.VFIOGPUs())
	require.Equal(t, m.GPUs()[:3], m.GPUsOn(DriverVFIO))
	require.Equal(t, m.GPUs()[3:], m.GPUsOn(DriverNVIDIA), "the GPUs NVML lists")
	again, err := Normalize("effective", m.Effective(), Options{})
	require.NoError(t, err)
	again.Source = m.Source
	require.Equal(t, m, again, "the effective profile keeps each GPU's driver")
	require.Equal(t, DriverNVIDIA, load(t, "../../testdata/profiles/domains.yaml").GPUs()[0].Driver, "nvidia by default")

	tests := []struct{ name, doc, err string }{
		{"unknown driver", "device_defaults: {pci: {device_id: 0x233010DE, driver: nouveau}}\ndevices: [{}]\n",
			`profile x.yaml: device_defaults.pci.driver: value "nouveau": want nvidia (the default) or vfio-pci (a GPU for passthrough)`},
		{"unknown driver on one device", "device_defaults: {pci: {device_id: 0x233010DE}}\ndevices: [{}, {pci: {driver: vfio}}]\n",
			`profile x.yaml: devices[1].pci.driver: value "vfio": want nvidia (the default) or vfio-pci (a GPU for passthrough)`},
		{"vfio-pci on an NVSwitch", "device_defaults: {pci: {device_id: 0x233010DE}}\ndevices: [{}]\nnvlink: {switches: [{bdf: \"0000:c4:00.0\", driver: vfio-pci}]}\n",
			`profile x.yaml: nvlink.switches[0].driver: value "vfio-pci": only a GPU can be bound to vfio-pci (pci.driver in devices[] or device_defaults); an NVSwitch keeps nvidia-nvswitch`},
		{"unknown NVSwitch driver", "device_defaults: {pci: {device_id: 0x233010DE}}\ndevices: [{}]\nnvlink: {switches: [{bdf: \"0000:c4:00.0\", driver: nvidia}]}\n",
			`profile x.yaml: nvlink.switches[0].driver: value "nvidia": want nvidia-nvswitch, an NVSwitch's own driver`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("x.yaml", []byte(tc.doc))
			require.NoError(t, err)
			require.Empty(t, p.Unknown, "pci.driver and switches[].driver are known keys")
			_, err = Normalize("x.yaml", p, Options{})
			require.EqualError(t, err, tc.err)
		})
	}
}
