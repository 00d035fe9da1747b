package profile

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

func TestNVMLGPUsOfSharedProfiles(t *testing.T) {
	want := map[string][]string{
		"h100.yaml": {"00000000:1A:00.0", "00000000:1B:00.0", "00000000:4A:00.0", "00000000:4B:00.0", "00000000:8A:00.0", "00000000:8B:00.0", "00000000:CA:00.0", "00000000:CB:00.0"},
		"t4.yaml":   {"00000000:3B:00.0", "00000000:86:00.0", "00000000:AF:00.0", "00000000:D8:00.0"},
	}
	for _, f := range sharedProfiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			p, err := LoadFile(f)
			require.NoError(t, err)
			gpus, err := NVMLGPUs(f, p)
			require.NoError(t, err)
			m := load(t, f)
			require.Len(t, gpus, len(m.GPUs()), "every rendered GPU is one NVML reports")
			for i, g := range gpus {
				require.Equal(t, i, g.Index)
				require.Equal(t, IdentityOf(m.GPUs()[i]), g.Identity, "the same identity as rendered")
			}
			if busIDs, ok := want[filepath.Base(f)]; ok {
				var got []string
				for _, g := range gpus {
					got = append(got, g.BusID)
				}
				require.Equal(t, busIDs, got)
			}
		})
	}
}

func TestNVMLGPUsCountsAsTheEngine(t *testing.T) {
	devices := func(n int) string {
		s := "devices:\n"
		for i := 0; i < n; i++ {
			s += fmt.Sprintf("  - index: %d\n    pci: {bus_id: \"0000:%02X:00.0\"}\n", i, 0x10+i)
		}
		return s
	}
	const defaults = "device_defaults:\n  pci: {device_id: 0x233010DE, subsystem_id: 0x165810DE}\n"
	tests := []struct {
		name, yaml string
		want       []string // bus ids NVML reports
		subsystem  uint32
	}{
		{"devices[] counts", defaults + devices(2), []string{"00000000:10:00.0", "00000000:11:00.0"}, 0x165810de},
		{"num_devices below devices[] reports fewer", defaults + "system: {num_devices: 1}\n" + devices(3), []string{"00000000:10:00.0"}, 0x165810de},
		{"num_devices above devices[] adds nvml-mock's default addresses", defaults + "system: {num_devices: 3}\n" + devices(1), []string{"00000000:10:00.0", "00000000:01:00.0", "00000000:02:00.0"}, 0x165810de},
		{"never more than 8", defaults + "system: {num_devices: 12}\n", []string{"00000000:00:00.0", "00000000:01:00.0", "00000000:02:00.0", "00000000:03:00.0", "00000000:04:00.0", "00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0"}, 0x165810de},
		{"NVML's 8-digit domain reads back", defaults + "devices:\n  - pci: {bus_id: \"00000000:1a:00.0\"}\n", []string{"00000000:1A:00.0"}, 0x165810de},
		{"no subsystem_id reports 0", "device_defaults:\n  pci: {device_id: 0x233010DE}\n" + devices(1), []string{"00000000:10:00.0"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("p.yaml", []byte(tt.yaml))
			require.NoError(t, err)
			gpus, err := NVMLGPUs("p.yaml", p)
			require.NoError(t, err)
			var got []string
			for _, g := range gpus {
				got = append(got, g.BusID)
				require.Equal(t, uint32(0x233010de), g.DeviceID)
				require.Equal(t, tt.subsystem, g.SubsystemID)
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestIdentityString(t *testing.T) {
	p, err := Parse("p.yaml", []byte("device_defaults:\n  pci: {device_id: 0x233010DE, subsystem_id: 0x165810DE}\ndevices:\n  - pci: {bus_id: \"0000:1A:00.0\"}\n"))
	require.NoError(t, err)
	gpus, err := NVMLGPUs("p.yaml", p)
	require.NoError(t, err)
	require.Equal(t, "0000:1a:00.0 10de:2330 subsystem 10de:1658", gpus[0].String())
}

func TestMatchIdentities(t *testing.T) {
	a := func(s string) pciaddr.Address {
		x, err := pciaddr.Parse(s)
		require.NoError(t, err)
		return x
	}
	gpu := Identity{Address: a("0000:1a:00.0"), DeviceID: 0x233010de, SubsystemID: 0x165810de}
	tests := []struct {
		name        string
		nvml, other []Identity
		want        []string
	}{
		{"agree", []Identity{gpu}, []Identity{gpu}, nil},
		{"NVML's GPU missing", []Identity{gpu}, nil, []string{"NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, sysfs has no GPU at 0000:1a:00.0"}},
		{"an extra GPU", nil, []Identity{gpu}, []string{"sysfs shows 0000:1a:00.0 10de:2330 subsystem 10de:1658, NVML reports no GPU at 0000:1a:00.0"}},
		{"another device id", []Identity{gpu}, []Identity{{Address: gpu.Address, DeviceID: 0x20b010de, SubsystemID: gpu.SubsystemID}},
			[]string{"NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, sysfs shows 0000:1a:00.0 10de:20b0 subsystem 10de:1658"}},
		{"another subsystem", []Identity{gpu}, []Identity{{Address: gpu.Address, DeviceID: gpu.DeviceID, SubsystemID: 0x16c110de}},
			[]string{"NVML reports 0000:1a:00.0 10de:2330 subsystem 10de:1658, sysfs shows 0000:1a:00.0 10de:2330 subsystem 10de:16c1"}},
		{"NVML's subsystem 0 is not compared", []Identity{{Address: gpu.Address, DeviceID: gpu.DeviceID}}, []Identity{gpu}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, MatchIdentities(tt.nvml, "sysfs", tt.other))
		})
	}
}
