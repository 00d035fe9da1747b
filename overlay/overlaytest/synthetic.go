package overlaytest

import (
	"fmt"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// SyntheticMachine normalises SyntheticProfile(n).
func SyntheticMachine(tb testing.TB, n int) *profile.Machine {
	tb.Helper()
	m, err := profile.Normalize("synthetic", SyntheticProfile(n), profile.Options{})
	if err != nil {
		tb.Fatalf("synthetic profile of %d GPUs: %v", n, err)
	}
	return m
}

// SyntheticProfile builds an HGX-like profile with n GPUs for benchmarks and
// scale tests: H100 ids, four GPUs per root complex with room for a switch
// each, eight root complexes per PCI domain, as many domains as it takes.
func SyntheticProfile(n int) *profile.Profile {
	const perRC, rcsPerDomain, rcSpan = 4, 8, 0x20
	p := &profile.Profile{
		DeviceDefaults: profile.DeviceConfig{PCI: profile.PCIConfig{
			DeviceID:    profile.Pack(0x10de, 0x2330),
			SubsystemID: profile.Pack(0x10de, 0x16c1),
		}},
		PCIeTopology: &profile.PCIeTopology{Hierarchy: "hgx"},
	}
	for i := 0; i < n; i++ {
		rc := i / perRC
		domain, rootBus := rc/rcsPerDomain, (rc%rcsPerDomain)*rcSpan
		bus := rootBus + 3 + (i%perRC)*5
		bdf := fmt.Sprintf("%04x:%02x:00.0", domain, bus)
		index := i
		p.Devices = append(p.Devices, profile.DeviceConfig{Index: &index, PCI: profile.PCIConfig{BusID: bdf}})
		if i%perRC == 0 {
			numa := rc % 2
			p.PCIeTopology.RootComplexes = append(p.PCIeTopology.RootComplexes, profile.RootComplexConfig{
				ID: fmt.Sprintf("pci%04x:%02x", domain, rootBus), NUMANode: &numa,
			})
		}
		last := &p.PCIeTopology.RootComplexes[len(p.PCIeTopology.RootComplexes)-1]
		last.Devices = append(last.Devices, bdf)
	}
	return p
}
