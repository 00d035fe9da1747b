package consumermatrix_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// suiteProfile is one profile of the suite (programs.SuiteProfile, the
// one profile set of every end-to-end suite).
type suiteProfile = programs.SuiteProfile

// suiteProfiles is programs.SuiteProfiles.
func suiteProfiles(t *testing.T) []suiteProfile {
	t.Helper()
	return programs.SuiteProfiles(t)
}

// TestServableProfileIdentifiesDevices: a profile without uuids and minor
// numbers (a built-in's effective profile) is served with distinct ones;
// one that has them all is served as it is.
func TestServableProfileIdentifiesDevices(t *testing.T) {
	dir := t.TempDir()
	bare := []byte("version: \"1.0\"\nsystem: {driver_version: \"550.163.01\"}\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:07:00.0\"}}\n  - {index: 1, pci: {bus_id: \"0000:0f:00.0\"}}\n")
	out, err := programs.ServableProfile(dir, "bare", filepath.Join(dir, "bare.yaml"), bare)
	require.NoError(t, err)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		Devices []struct {
			UUID  string `yaml:"uuid"`
			Minor *int   `yaml:"minor_number"`
		} `yaml:"devices"`
	}
	require.NoError(t, yaml.Unmarshal(data, &doc))
	require.Len(t, doc.Devices, 2)
	require.NotEqual(t, doc.Devices[0].UUID, doc.Devices[1].UUID)
	require.Regexp(t, `^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, doc.Devices[0].UUID)
	require.Equal(t, 0, *doc.Devices[0].Minor)
	require.Equal(t, 1, *doc.Devices[1].Minor)

	full := filepath.Join(dir, "full.yaml")
	again, err := programs.ServableProfile(t.TempDir(), "full", full, data)
	require.NoError(t, err)
	require.Equal(t, full, again, "a profile with every field is served as it is")
}

// TestNVMLProfileOfPassthroughNode: for a profile with GPUs on vfio-pci,
// nvml-mock's NVML is served the nvidia-bound GPUs alone, at their own bus
// ids and with their own uuids; a profile without any is served as it is,
// and one with every GPU on vfio-pci is refused (NVML would make 8 GPUs of
// an empty devices[]).
func TestNVMLProfileOfPassthroughNode(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("../../../testdata/profiles/vfio-passthrough.yaml")
	require.NoError(t, err)
	file, err := programs.ServableProfile(dir, "vfio-passthrough", "", data)
	require.NoError(t, err)
	nvml, err := programs.NVMLProfile(dir, "vfio-passthrough", file)
	require.NoError(t, err)
	require.NotEqual(t, file, nvml)

	whole, err := profile.LoadFile(file)
	require.NoError(t, err)
	m, err := profile.Normalize(file, whole, profile.Options{})
	require.NoError(t, err)
	p, err := profile.LoadFile(nvml)
	require.NoError(t, err)
	gpus, err := profile.NVMLGPUs(nvml, p)
	require.NoError(t, err)
	require.Len(t, gpus, 1)
	require.Equal(t, 0, gpus[0].Index)
	require.Equal(t, "00000000:DB:00.0", gpus[0].BusID)
	require.Equal(t, profile.IdentityOf(m.GPUs()[3]), gpus[0].Identity, "the nvidia-bound GPU keeps its identity")
	var uuids [2][]string
	for i, f := range []string{file, nvml} {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var doc struct {
			Devices []struct {
				UUID string `yaml:"uuid"`
			} `yaml:"devices"`
		}
		require.NoError(t, yaml.Unmarshal(data, &doc))
		for _, d := range doc.Devices {
			uuids[i] = append(uuids[i], d.UUID)
		}
	}
	require.Equal(t, uuids[0][3:], uuids[1], "the nvidia-bound GPU keeps its uuid")

	plain := filepath.Join(dir, "plain.yaml")
	require.NoError(t, os.WriteFile(plain, []byte("version: \"1.0\"\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:07:00.0\", device_id: 0x233010DE}}\n"), 0o644))
	same, err := programs.NVMLProfile(dir, "plain", plain)
	require.NoError(t, err)
	require.Equal(t, plain, same, "a profile without vfio-pci GPUs is served as it is")

	allVFIO := filepath.Join(dir, "all-vfio.yaml")
	require.NoError(t, os.WriteFile(allVFIO, []byte("version: \"1.0\"\ndevice_defaults: {pci: {driver: vfio-pci}}\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:07:00.0\", device_id: 0x233010DE}}\n"), 0o644))
	_, err = programs.NVMLProfile(dir, "all-vfio", allVFIO)
	require.ErrorContains(t, err, "every GPU is bound to vfio-pci")
}
