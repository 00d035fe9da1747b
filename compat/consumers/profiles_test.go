package consumers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/consumers"
)

// suiteProfile is one profile of the suite (consumers.SuiteProfile, the
// one profile set of every end-to-end suite).
type suiteProfile = consumers.SuiteProfile

// suiteProfiles is consumers.SuiteProfiles.
func suiteProfiles(t *testing.T) []suiteProfile {
	t.Helper()
	return consumers.SuiteProfiles(t)
}

// TestServableProfileIdentifiesDevices: a profile without uuids and minor
// numbers (a built-in's effective profile) is served with distinct ones;
// one that has them all is served as it is.
func TestServableProfileIdentifiesDevices(t *testing.T) {
	dir := t.TempDir()
	bare := []byte("version: \"1.0\"\nsystem: {driver_version: \"550.163.01\"}\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:07:00.0\"}}\n  - {index: 1, pci: {bus_id: \"0000:0f:00.0\"}}\n")
	out, err := consumers.ServableProfile(dir, "bare", filepath.Join(dir, "bare.yaml"), bare)
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
	again, err := consumers.ServableProfile(t.TempDir(), "full", full, data)
	require.NoError(t, err)
	require.Equal(t, full, again, "a profile with every field is served as it is")
}
