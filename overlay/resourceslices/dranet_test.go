package resourceslices

import (
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
)

// Every ConnectX a profile can name has its name in dranet's pci.ids here:
// a generation added to boards.HCAs without one would make DRANet refuse
// the profiles that carry it.
func TestConnectXNames(t *testing.T) {
	for _, h := range boards.HCAs() {
		if _, ok := connectXNames[h.Device]; !ok {
			t.Errorf("%s (%s, device %04x): no name in connectXNames", h.Type, h.Name, h.Device)
		}
	}
}
