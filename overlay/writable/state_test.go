package writable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// TestBadStateFile: a state file that does not parse is one line naming it.
func TestBadStateFile(t *testing.T) {
	const file = "/root/" + StateFile
	for _, bad := range []string{`{"functions": {"zz": {}}}`, `{"functions": {"0000:18:00.0": {"sriov_numvfs": -1}}}`, `{"x": 1}`, `[`} {
		_, err := ParseState(file, []byte(bad))
		require.ErrorContains(t, err, "writable state "+file, bad)
		require.NotContains(t, err.Error(), "\n", bad)
	}
}

// TestStateRoundTrip: the state file's form gives back the state it holds.
func TestStateRoundTrip(t *testing.T) {
	a, err := pciaddr.Parse("0000:18:00.0")
	require.NoError(t, err)
	vf, err := pciaddr.Parse("0000:19:00.2")
	require.NoError(t, err)
	ws := plan.WrittenState{
		a:  {Driver: "vfio-pci", Override: "vfio-pci", VFIODev: 2, ID: "10de:2330"},
		vf: {NumVFs: 0, Override: "x"},
	}
	got, err := ParseState("f", FormatState(ws))
	require.NoError(t, err)
	require.Equal(t, ws, got)
	empty, err := ParseState("f", FormatState(nil))
	require.NoError(t, err)
	require.Empty(t, empty)
}
