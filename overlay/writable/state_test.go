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

// TestPruneKeepsEnabledVFs: a re-render keeps the state of the virtual
// functions their physical function still enables, and drops the rest;
// the map's order, which Go varies from run to run, changes nothing (a
// kept VF once taken for a physical function panicked: found by FuzzWrite).
func TestPruneKeepsEnabledVFs(t *testing.T) {
	addr := func(s string) pciaddr.Address {
		a, err := pciaddr.Parse(s)
		require.NoError(t, err)
		return a
	}
	pf, vf0, vf1, vf2 := addr("0000:18:00.0"), addr("0000:18:00.4"), addr("0000:18:00.5"), addr("0000:18:00.6")
	base := &plan.Plan{Functions: map[pciaddr.Address]*plan.Function{
		pf: {ID: "10de:2330", TotalVFs: 4, VFs: []pciaddr.Address{vf0, vf1, vf2}},
	}}
	want := plan.WrittenState{
		pf:  {NumVFs: 2, ID: "10de:2330"},
		vf0: {Override: "vfio-pci"},
		vf1: {Driver: "vfio-pci"},
	}
	for range 200 {
		ws := plan.WrittenState{vf2: {Override: "x"}}
		for a, st := range want {
			ws[a] = st
		}
		require.Equal(t, want, Prune(base, ws))
	}
}
