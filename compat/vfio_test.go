package compat_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

const vfioProfile = "../testdata/profiles/vfio-passthrough.yaml"

// A passthrough node (issue 26) as go-nvlib reads it: every GPU with the
// driver its profile binds it to and an IOMMU group of its own, the
// vfio-pci ones with their iommufd device.
func TestVFIODriverRows(t *testing.T) {
	r, _, _ := sharedReport(t, vfioProfile)
	requireOK(t, r)
	var details []string
	for _, x := range r.Results {
		if x.Check == compat.GPUDriver {
			details = append(details, x.Device+" "+x.Detail)
		}
	}
	require.Len(t, details, 4)
	require.Regexp(t, `^0000:18:00.0 `+regexp.QuoteMeta(profile.DriverVFIO)+`, IOMMU group \d+ alone, iommufd `+sysfs.VFIODevName(0)+`$`, details[0])
	require.Regexp(t, `^0000:db:00.0 `+profile.DriverNVIDIA+`, IOMMU group \d+ alone$`, details[3])
}

// NVML and sysfs on a passthrough node: a real node's NVML lists only the
// GPUs left on nvidia. nvml-mock's NVML lists every GPU of its profile, so
// served the passthrough profile itself it reports the vfio-pci GPUs and
// the pairing fails, naming them; served a profile of the nvidia-bound GPU
// alone, as a user runs it for such a node, the pairing holds.
func TestVFIONVMLPairing(t *testing.T) {
	_, root, _ := sharedReport(t, vfioProfile)
	sys := filepath.Join(root, "sys")
	whole := compat.NVMLCheck(vfioProfile, sys)
	require.False(t, whole.OK)
	require.Equal(t, 3, strings.Count(whole.Detail, "which sysfs binds to vfio-pci"), whole.Detail)
	require.Contains(t, whole.Detail, "NVML reports 0000:18:00.0 10de:2330 subsystem 10de:16c1, which sysfs binds to vfio-pci")

	nvidiaOnly := filepath.Join(t.TempDir(), "nvml.yaml")
	require.NoError(t, os.WriteFile(nvidiaOnly, []byte(`version: "1.0"
device_defaults:
  pci: {device_id: 0x233010DE, subsystem_id: 0x16C110DE}
devices:
  - {index: 0, pci: {bus_id: "0000:DB:00.0"}}
`), 0o644))
	served := compat.NVMLCheck(nvidiaOnly, sys)
	require.True(t, served.OK, served.Detail)
	require.Contains(t, served.Detail, "besides 3 bound to vfio-pci, which NVML does not list")
}
