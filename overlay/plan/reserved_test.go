package plan_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// twoRootComplexes has a GPU under each of two host bridges of domain 0,
// so that a refusal must say which root complex it was filling: the GPU's
// address alone (0000:45:00.0) does not name pci0000:40.
func twoRootComplexes(t *testing.T) *profile.Machine {
	t.Helper()
	p, err := profile.Parse("reserved.yaml", []byte(`device_defaults:
  pci: {device_id: 0x233010DE}
devices:
  - pci: {bus_id: "0000:03:00.0"}
  - pci: {bus_id: "0000:45:00.0"}
pcie_topology:
  root_complexes:
    - id: "pci0000:00"
      devices: ["0000:03:00.0"]
    - id: "pci0000:40"
      devices: ["0000:45:00.0"]
`))
	require.NoError(t, err)
	m, err := profile.Normalize("reserved.yaml", p, profile.Options{})
	require.NoError(t, err)
	return m
}

// TestReservedBusIsRefused: a mock GPU pinned on a bus the host owns,
// through one of its devices or a bridge's range, is refused naming the
// root complex, the mock device, the bus and the host's owner, each once.
func TestReservedBusIsRefused(t *testing.T) {
	t.Parallel()
	hostBridge := pciaddr.Address{Bus: 0x40, Device: 1}
	for _, tc := range []struct {
		name string
		opts plan.BuildOptions
		want string
	}{
		{
			name: "a host device on the GPU's bus",
			opts: plan.BuildOptions{Reserved: []pciaddr.Address{{Bus: 0x45, Device: 1}}},
			want: "pci0000:40: mock gpu 0000:45:00.0 sits on bus 0000:45, which the host's host device 0000:45:01.0 owns: no mock bridge can lead there",
		},
		{
			name: "a host bridge's range over the GPU's bus",
			opts: plan.BuildOptions{ReservedBuses: []plan.BusRange{{First: 0x44, Last: 0x46, Owner: hostBridge}}},
			want: "pci0000:40: mock gpu 0000:45:00.0 sits on bus 0000:45, which the host's host bridge 0000:40:01.0 (buses 44-46) owns: no mock bridge can lead there",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := plan.BuildTree(twoRootComplexes(t), tc.opts)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestReservedBusThroughNew: plan.New turns host devices into reserved
// buses and names the profile before the root complex.
func TestReservedBusThroughNew(t *testing.T) {
	t.Parallel()
	host := []plan.HostDevice{{Address: pciaddr.Address{Bus: 0x45, Device: 1}, Target: "../../../devices/pci0000:40/0000:40:01.0/0000:45:01.0"}}
	_, err := plan.New(twoRootComplexes(t), plan.Options{HostDevices: host})
	require.ErrorContains(t, err, "plan reserved.yaml: pci0000:40: mock gpu 0000:45:00.0 sits on bus 0000:45, which the host's host device 0000:45:01.0 owns")
	// The remedy names the option; the command line adds its flag.
	var hostErr *plan.HostDevicesError
	require.ErrorAs(t, err, &hostErr)
	require.ErrorContains(t, err, "owns: no mock bridge can lead there: move the mock device, or do not merge the host's devices")
	require.NotContains(t, err.Error(), "--")
}

// TestReservedBusElsewhereIsAvoided is the control: a host device on a bus
// no mock device needs plans, and no mock bridge takes its bus.
func TestReservedBusElsewhereIsAvoided(t *testing.T) {
	t.Parallel()
	reserved := pciaddr.Address{Bus: 0x44}
	tree, err := plan.BuildTree(twoRootComplexes(t), plan.BuildOptions{Reserved: []pciaddr.Address{reserved}})
	require.NoError(t, err)
	for _, n := range tree.Nodes() {
		require.NotEqual(t, reserved, n.Address, "%s takes the host's address", n.Address)
		if n.Role.IsBridge() {
			require.False(t, n.Secondary <= reserved.Bus && reserved.Bus <= n.Subordinate,
				"bridge %s (buses %02x-%02x) swallows the host's bus %02x", n.Address, n.Secondary, n.Subordinate, reserved.Bus)
		}
	}
}
