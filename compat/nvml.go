package compat

import (
	"fmt"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// NVMLProfileEnv is the variable nvml-mock's NVML reads its profile from
// (pkg/gpu/mocknvml/engine LoadConfig), set in every container nvml-mock
// serves.
const NVMLProfileEnv = "MOCK_NVML_CONFIG"

// NVMLAgreement is the row that compares NVML's GPUs with the sysfs's.
const NVMLAgreement = "nvml-mock: same GPUs"

// NVMLCheck checks that the GPUs nvml-mock's NVML reports for its profile
// are exactly the GPUs go-nvlib finds in the sysfs, with the same bus ids,
// device and subsystem ids. GPU Feature Discovery and the DRA driver take a
// GPU's bus id from NVML and look it up in sysfs: a GPU NVML names that the
// sysfs does not have loses its labels and its pcieRoot, silently.
func NVMLCheck(nvmlProfile, sysfs string) Result {
	r := Result{Check: NVMLAgreement, Device: nvmlProfile}
	detail := func(format string, args ...any) Result {
		r.Detail = fmt.Sprintf(format, args...)
		return r
	}
	p, err := profile.LoadFile(nvmlProfile)
	if err != nil {
		return detail("NVML's profile: %v", err)
	}
	gpus, err := profile.NVMLGPUs(nvmlProfile, p)
	if err != nil {
		return detail("NVML's profile: %v", err)
	}
	lib, _ := (&checker{sysfs: sysfs}).nvpci()
	devs, err := lib.GetGPUs()
	if err != nil {
		return detail("go-nvlib at %s: %v", sysfs, err)
	}
	// A real node's NVML lists no GPU bound to vfio-pci (no nvidia driver
	// holds it): NVML's GPUs must be the sysfs's other GPUs, and one that
	// NVML reports on a vfio-pci GPU is a problem of its own.
	var shown []profile.Identity
	vfio := map[pciaddr.Address]bool{}
	for _, d := range devs {
		a, err := pciaddr.Parse(d.Address)
		if err != nil {
			return detail("go-nvlib at %s: GPU %q: %v", sysfs, d.Address, err)
		}
		if d.Driver == profile.DriverVFIO {
			vfio[a] = true
			continue
		}
		shown = append(shown, profile.Identity{
			Address:     a,
			DeviceID:    uint32(*profile.Pack(d.Vendor, d.Device)),
			SubsystemID: uint32(*profile.Pack(d.SubsystemVendor, d.SubsystemDevice)),
		})
	}
	var problems []string
	var listed []profile.Identity
	for _, id := range profile.Identities(gpus) {
		if vfio[id.Address] {
			problems = append(problems, fmt.Sprintf("NVML reports %s, which sysfs binds to %s: a real node's NVML lists no GPU bound for passthrough; serve nvml-mock a profile without it (or no nvml-mock NVML where every GPU is on %s)", id, profile.DriverVFIO, profile.DriverVFIO))
			continue
		}
		listed = append(listed, id)
	}
	problems = append(problems, profile.MatchIdentities(listed, "sysfs", shown)...)
	if len(problems) > 0 {
		return detail("%s", strings.Join(problems, "; "))
	}
	r.OK = true
	var busIDs []string
	for _, g := range gpus {
		busIDs = append(busIDs, g.BusID)
	}
	passthrough := ""
	if len(vfio) > 0 {
		passthrough = fmt.Sprintf(" (besides %d bound to %s, which NVML does not list)", len(vfio), profile.DriverVFIO)
	}
	return detail("the %d GPUs NVML reports (%s), with their device and subsystem ids, are the sysfs's GPUs%s, and no others", len(gpus), strings.Join(busIDs, " "), passthrough)
}
