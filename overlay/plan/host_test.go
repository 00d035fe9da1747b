package plan

import (
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
	"k8s.io/utils/cpuset"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

func TestCPUMask(t *testing.T) {
	tests := []struct {
		cpus     string
		possible int
		want     string
	}{
		{"0-1", 2, "3"},
		{"0-7", 8, "ff"},
		{"0-31", 32, "ffffffff"},
		{"32-63", 64, "ffffffff,00000000"},
		{"0,71", 72, "80,00000000,00000001"},
	}
	for _, tt := range tests {
		h := HostCPUs{Possible: tt.possible}
		set, err := cpuset.Parse(tt.cpus)
		require.NoError(t, err)
		require.Equal(t, tt.want, cpuMask(set, h.Possible), tt.cpus)
	}
}

// TestReadHostDevicesBridgeRange reads a host bridge's secondary and
// subordinate bus from its config space, as the kernel's sysfs shows it.
func TestReadHostDevicesBridgeRange(t *testing.T) {
	bridgeConfig := make([]byte, sysfs.ConfigHeaderSize)
	bridgeConfig[sysfs.ConfigHeaderType] = sysfs.HeaderTypeBridge
	bridgeConfig[sysfs.ConfigSecondaryBus], bridgeConfig[sysfs.ConfigSubordinateBus] = 0x01, 0x05
	endpointConfig := make([]byte, sysfs.ConfigHeaderSize)
	sys := fstest.MapFS{
		sysfs.LinksDir + "/0000:00:01.0":                      {Data: []byte("../../../devices/pci0000:00/0000:00:01.0"), Mode: fs.ModeSymlink},
		sysfs.LinksDir + "/0000:01:00.0":                      {Data: []byte("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0"), Mode: fs.ModeSymlink},
		"devices/pci0000:00/0000:00:01.0/config":              {Data: bridgeConfig},
		"devices/pci0000:00/0000:00:01.0/0000:01:00.0/config": {Data: endpointConfig},
	}
	host, err := ReadHostDevices(sys)
	require.NoError(t, err)
	require.Len(t, host, 2)
	require.Equal(t, BusRange{First: 1, Last: 5, Owner: host[0].Address}, host[0].Buses)
	require.Equal(t, BusRange{}, host[1].Buses, "an endpoint owns no buses")
	require.Equal(t, []BusRange{host[0].Buses}, hostBusRanges(host))
}
