package resourceslices_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

// fakeDriver is a driver this package does not know, added through the
// Driver interface alone, as a third driver would be: a device per GPU
// NVML lists, in one slice of the node's.
type fakeDriver struct{ err error }

const fakeDriverName = "fake.example.com"

func (fakeDriver) Name() string { return fakeDriverName }

func (f fakeDriver) Slices(p *resourceslices.Profile, node string) ([]resourcev1.ResourceSlice, error) {
	if f.err != nil {
		return nil, f.err
	}
	var devices []resourcev1.Device
	for _, g := range p.NVMLGPUs {
		devices = append(devices, resourcev1.Device{Name: fmt.Sprintf("fake-%d", g.Index)})
	}
	return []resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{
		Driver: fakeDriverName, NodeName: &node, Pool: resourcev1.ResourcePool{Name: node}, Devices: devices,
	}}}, nil
}

// hgxH100 is the built-in that gives both default drivers' slices.
func hgxH100(t *testing.T) *resourceslices.Profile {
	t.Helper()
	source, data, err := resourceslices.ReadProfile("hgx-h100")
	require.NoError(t, err)
	p, err := resourceslices.Parse(source, data)
	require.NoError(t, err)
	return p
}

// A Planner's zero value plans the default drivers, which the package's
// functions plan: the slices command's and the publisher's drivers.
func TestPlannerZeroValueIsTheDefaultDrivers(t *testing.T) {
	p := hgxH100(t)
	require.Equal(t, []string{resourceslices.NVIDIAGPUDriver, resourceslices.DRANetDriver}, resourceslices.Planner{}.DriverNames())
	require.Equal(t, resourceslices.Planner{Drivers: resourceslices.DefaultDrivers()}.DriverNames(), resourceslices.Drivers())
	require.Equal(t, 1, resourceslices.DriverOrder(resourceslices.DRANetDriver))
	require.Equal(t, -1, resourceslices.DriverOrder(fakeDriverName))
	planned, err := resourceslices.Planner{}.ForNode(p, "n")
	require.NoError(t, err)
	source, data, err := resourceslices.ReadProfile("hgx-h100")
	require.NoError(t, err)
	fromData, err := resourceslices.ForNode(source, data, "n")
	require.NoError(t, err)
	require.Equal(t, fromData, planned)
	require.Len(t, planned, 2)
	for i, s := range planned {
		require.Equal(t, i, resourceslices.DriverOrder(s.Spec.Driver), "slice %d, of %s", i, s.Spec.Driver)
	}
}

// A third driver, added through the interface in a Planner's list, is
// planned in its place there: ForNode gives its slices after the default
// drivers', DriverNames and DriverOrder name it.
func TestPlannerPlansAnAddedDriver(t *testing.T) {
	p := hgxH100(t)
	defaults, err := resourceslices.Planner{}.ForNode(p, "n")
	require.NoError(t, err)
	pl := resourceslices.Planner{Drivers: append(resourceslices.DefaultDrivers(), fakeDriver{})}
	planned, err := pl.ForNode(p, "n")
	require.NoError(t, err)
	require.Len(t, planned, len(defaults)+1)
	require.Equal(t, defaults, planned[:len(defaults)], "the default drivers' slices, unchanged")
	fake := planned[len(defaults)].Spec
	require.Equal(t, fakeDriverName, fake.Driver)
	require.Len(t, fake.Devices, 8, "a device per GPU of hgx-h100")
	require.Equal(t, []string{resourceslices.NVIDIAGPUDriver, resourceslices.DRANetDriver, fakeDriverName}, pl.DriverNames())
	require.Equal(t, 2, pl.DriverOrder(fakeDriverName))

	first := resourceslices.Planner{Drivers: []resourceslices.Driver{fakeDriver{}, resourceslices.NVIDIAGPU{}}}
	planned, err = first.ForNode(p, "n")
	require.NoError(t, err)
	require.Equal(t, []string{fakeDriverName, resourceslices.NVIDIAGPUDriver}, []string{planned[0].Spec.Driver, planned[1].Spec.Driver}, "the Planner's order")
	require.Equal(t, -1, first.DriverOrder(resourceslices.DRANetDriver))
}

// A driver's refusal is ForNode's, and a node without a name is refused
// before any driver plans.
func TestPlannerRefusals(t *testing.T) {
	p := hgxH100(t)
	refusal := errors.New("profile hgx-h100: the fake driver refuses it")
	_, err := resourceslices.Planner{Drivers: append(resourceslices.DefaultDrivers(), fakeDriver{err: refusal})}.ForNode(p, "n")
	require.ErrorIs(t, err, refusal)
	_, err = resourceslices.Planner{}.ForNode(p, "")
	require.EqualError(t, err, "profile built-in hgx-h100: no node name for the ResourceSlices")
	_, err = resourceslices.ForNode("broken.yaml", []byte("devices: ["), "")
	require.EqualError(t, err, "profile broken.yaml: no node name for the ResourceSlices", "the node before the profile")
}
