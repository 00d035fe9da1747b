package profile_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// system.driver_version, inline in the system block, is read from a file
// (the module view's /sys/module/nvidia/version) and written back into
// the effective profile's JSON, which reads back to the same version; a
// bad one is refused naming the file, the field and the value.
func TestDriverVersionFromAFile(t *testing.T) {
	data := []byte("version: \"1.0\"\nsystem: {driver_version: \"580.65.06\"}\ndevice_defaults: {pci: {device_id: 0x233010DE}}\ndevices:\n  - {index: 0, pci: {bus_id: \"0000:07:00.0\"}}\n")
	p, err := profile.Parse("v.yaml", data)
	require.NoError(t, err)
	m, err := profile.Normalize("v.yaml", p, profile.Options{})
	require.NoError(t, err)
	require.Equal(t, "580.65.06", m.NVIDIAVersion())
	effective, err := profile.MarshalJSON(m.Effective())
	require.NoError(t, err)
	p, err = profile.Parse("effective-profile.json", effective)
	require.NoError(t, err)
	m, err = profile.Normalize("effective-profile.json", p, profile.Options{})
	require.NoError(t, err)
	require.Equal(t, "580.65.06", m.NVIDIAVersion())

	p, err = profile.Parse("bad.yaml", []byte(strings.Replace(string(data), `"580.65.06"`, `"580 65"`, 1)))
	require.NoError(t, err)
	_, err = profile.Normalize("bad.yaml", p, profile.Options{})
	require.EqualError(t, err, `profile bad.yaml: system.driver_version: value "580 65": want one version such as 550.163.01, without spaces or control characters`)
}
