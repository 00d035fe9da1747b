package plan_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// Bounds on the machines the fuzzer builds, to keep iterations quick.
const (
	maxFuzzRootComplexes = 8
	maxFuzzDevices       = 48
)

// fuzzBoards are the device words a fuzzed GPU may have: boards of every
// hierarchy the planner knows.
func fuzzBoards() []profile.Word {
	return []profile.Word{0x20B010DE, 0x233010DE, 0x1EB810DE, 0x294110DE}
}

// fuzzProfile turns bytes into a profile whose numbering is anything the
// bytes say, so that the planner meets every kind of bus layout:
//
//   - flags: bits 0-1 the hierarchy (profile's own, flat, hgx, dgx), bit 2
//     a pcie_topology, bit 3 the last device an NVSwitch, bit 4 every
//     device listed under a root complex rather than placed by bus range,
//     bit 5 an infiniband block with 1 + bits 6-7 HCAs per GPU, Ethernet
//     when that count is even;
//   - rcs: two bytes per root complex, domain (0-3) and root bus;
//   - devs: three bytes per device, domain (0-3) and board, bus, devfn.
func fuzzProfile(flags byte, rcs, devs []byte) *profile.Profile {
	p := &profile.Profile{}
	boards := fuzzBoards()
	for i := 0; i+2 < len(devs) && len(p.Devices) < maxFuzzDevices; i += 3 {
		id := boards[int(devs[i]>>2)%len(boards)]
		bdf := fmt.Sprintf("%04x:%02x:%02x.%x", devs[i]&3, devs[i+1], devs[i+2]>>3, devs[i+2]&7)
		p.Devices = append(p.Devices, profile.DeviceConfig{PCI: profile.PCIConfig{BusID: bdf, DeviceID: &id}})
	}
	if flags&8 != 0 && len(p.Devices) > 1 {
		last := p.Devices[len(p.Devices)-1]
		p.Devices = p.Devices[:len(p.Devices)-1]
		p.NVLink = &profile.NVLink{Switches: []profile.NVSwitchConfig{{BDF: last.PCI.BusID}}}
	}
	if flags&32 != 0 {
		per := int(flags>>6) + 1
		p.InfiniBand = &profile.InfiniBand{Enabled: true, HCAsPerGPU: &per, LinkLayer: []string{"InfiniBand", "Ethernet"}[(per+1)%2]}
	}
	if flags&4 == 0 {
		return p
	}
	p.PCIeTopology = &profile.PCIeTopology{Hierarchy: []string{"", "flat", "hgx", "dgx"}[flags&3]}
	for i := 0; i+1 < len(rcs) && len(p.PCIeTopology.RootComplexes) < maxFuzzRootComplexes; i += 2 {
		p.PCIeTopology.RootComplexes = append(p.PCIeTopology.RootComplexes, profile.RootComplexConfig{
			ID: fmt.Sprintf("pci%04x:%02x", rcs[i]&3, rcs[i+1]),
		})
	}
	if flags&16 != 0 && len(p.PCIeTopology.RootComplexes) > 0 {
		n := len(p.PCIeTopology.RootComplexes)
		for i, d := range p.Devices {
			rc := &p.PCIeTopology.RootComplexes[int(devs[3*i]>>4)%n]
			rc.Devices = append(rc.Devices, d.PCI.BusID)
		}
	}
	return p
}

// FuzzPlanInvariants plans fuzzed machines: a refusal must be one clear
// line, and every plan must keep every invariant plancheck.CheckPlan knows:
// its tree's (CheckTree: buses, ranges, addresses, anchors, HCAs), its
// entries', its links' and its config space's (CheckConfig). An odd last
// byte of rcs also plans the machine beside a host device on that bus, as
// --host-devices merge brings, so that the checks of reserved addresses
// and buses meet fuzzed layouts too. Seeds: testdata/fuzz/FuzzPlanInvariants.
func FuzzPlanInvariants(f *testing.F) {
	f.Add(byte(0), []byte{}, []byte{0x00, 0x18, 0x00})
	f.Add(byte(0x26), []byte{0x00, 0x00, 0x02}, []byte{0x00, 0x18, 0x00, 0x00, 0x19, 0x00})
	f.Fuzz(func(t *testing.T, flags byte, rcs, devs []byte) {
		p := fuzzProfile(flags, rcs, devs)
		m, err := profile.Normalize("fuzz", p, profile.Options{})
		if err != nil {
			var pe *profile.Error
			require.True(t, errors.As(err, &pe), "%T %v", err, err)
			require.NotContains(t, err.Error(), "\n")
			return
		}
		require.Empty(t, plancheck.CheckMachine(m))
		if len(rcs)%2 == 1 {
			checkBesideHostDevice(t, m, rcs[len(rcs)-1])
		}
	})
}

// checkBesideHostDevice plans m beside a host device at 0000:bus:00.0, in
// the kernel's form, and checks the plan with links into the host's own
// devices allowed.
func checkBesideHostDevice(t *testing.T, m *profile.Machine, bus byte) {
	t.Helper()
	a := pciaddr.Address{Bus: bus}
	host := plan.HostDevice{Address: a, Target: fmt.Sprintf("../../../devices/pci0000:%02x/%s", bus, a)}
	p, err := plan.New(m, plan.Options{HostDevices: []plan.HostDevice{host}})
	if err != nil {
		require.NotContains(t, err.Error(), "\n", "the planner's refusal spans lines")
		return
	}
	require.Empty(t, plancheck.CheckPlan(p, plan.DefaultHostSysfs+"/devices"))
}
