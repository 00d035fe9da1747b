package profile_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// The uuid and minor number Normalize gives each GPU (the driver's /proc
// files name it by them) are NVML's: those DecodeNVMLFields gives it, the
// profile's or IdentifyDevices', for every built-in, every profile of
// testdata and nvml-mock's own; and the effective profile keeps them.
func TestNormalizeIdentifiesAsDecodeNVMLFields(t *testing.T) {
	files := map[string][]byte{
		// A GPU of num_devices alone, and an entry without a bus id.
		"bare.yaml": []byte("system: {num_devices: 3}\ndevice_defaults: {pci: {device_id: 0x233010DE}}\ndevices:\n  - {index: 0, uuid: GPU-own, minor_number: 7, pci: {bus_id: \"0000:07:00.0\"}}\n  - {index: 1}\n"),
	}
	for _, name := range shipped.Names() {
		data, _, err := shipped.File(name)
		require.NoError(t, err)
		files[name] = data
	}
	paths, err := filepath.Glob("../../testdata/profiles/*.yaml")
	require.NoError(t, err)
	shared, _ := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	for _, p := range append(paths, shared...) {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		files[filepath.Base(p)] = data
	}
	for name, data := range files {
		t.Run(name, func(t *testing.T) {
			p, gpus, nv, err := profile.ParseNVML(name, data)
			require.NoError(t, err)
			m, err := profile.Normalize(name, p, profile.Options{})
			require.NoError(t, err)
			effective, err := profile.MarshalJSON(m.Effective())
			require.NoError(t, err)
			ep, err := profile.Parse("effective-profile.json", effective)
			require.NoError(t, err)
			again, err := profile.Normalize("effective-profile.json", ep, profile.Options{})
			require.NoError(t, err)
			require.NotEmpty(t, gpus)
			for _, g := range gpus {
				want, _, ok := nv.Device(g.Index)
				require.True(t, ok)
				for _, mm := range []*profile.Machine{m, again} {
					i := slices.IndexFunc(mm.Devices, func(d profile.Device) bool { return d.Address == g.Address })
					require.GreaterOrEqual(t, i, 0, "GPU %d at %s", g.Index, g.Address)
					require.Equal(t, want.UUID, mm.Devices[i].UUID, "GPU %d", g.Index)
					require.Equal(t, want.Minor(), mm.Devices[i].Minor, "GPU %d", g.Index)
				}
			}
		})
	}
	// By address: GPU 1 (0000:01:00.0), GPU 2, then GPU 0 (0000:07:00.0).
	bare := mustMachine(t, files["bare.yaml"]).GPUs()
	require.Equal(t, "GPU-own", bare[2].UUID)
	require.Equal(t, uint32(7), bare[2].Minor)
	require.Equal(t, profile.DeviceUUID(2, "<nil>"), bare[1].UUID)
	require.Equal(t, uint32(2), bare[1].Minor)
}

func mustMachine(t *testing.T, data []byte) *profile.Machine {
	t.Helper()
	p, err := profile.Parse("m.yaml", data)
	require.NoError(t, err)
	m, err := profile.Normalize("m.yaml", p, profile.Options{})
	require.NoError(t, err)
	return m
}
