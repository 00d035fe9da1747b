package plan_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// A passthrough node (issue 26): each vfio-pci GPU's driver link names the
// vfio-pci driver directory, which links it back; driver_override says
// vfio-pci; vfio-dev/vfioN numbers the iommufd devices in tree order; the
// GPU holds its IOMMU group alone. The nvidia-bound GPU beside them, and
// the bridges, keep their drivers and have no vfio-dev entry.
func TestVFIOPassthroughTree(t *testing.T) {
	m := machine(t, "../../testdata/profiles/vfio-passthrough.yaml", "")
	root, p := overlaytest.Render(t, m, plan.Options{})
	links := filepath.Join(root, plan.LinksDir)
	read := func(bdf, name string) string {
		data, err := os.ReadFile(filepath.Join(links, bdf, name))
		require.NoError(t, err)
		return string(data)
	}
	groups := map[string]string{}
	vfio := 0
	for _, n := range p.Tree.Nodes() {
		bdf := n.Address.String()
		driver, err := filepath.EvalSymlinks(filepath.Join(links, bdf, "driver"))
		require.NoError(t, err)
		group, err := filepath.EvalSymlinks(filepath.Join(links, bdf, "iommu_group"))
		require.NoError(t, err)
		require.NotContains(t, groups, group, "%s shares the IOMMU group of %s", bdf, groups[group])
		groups[group] = bdf
		members, err := os.ReadDir(filepath.Join(group, "devices"))
		require.NoError(t, err)
		require.Len(t, members, 1, "%s: its group holds it alone", bdf)
		if n.Device == nil || n.Device.Driver != profile.DriverVFIO {
			require.NotEqual(t, profile.DriverVFIO, filepath.Base(driver), bdf)
			require.NoDirExists(t, filepath.Join(links, bdf, sysfs.VFIODevDir))
			continue
		}
		require.Equal(t, profile.DriverVFIO, filepath.Base(driver), bdf)
		require.FileExists(t, filepath.Join(driver, bdf, "vendor"), "the driver directory links the GPU back")
		require.Equal(t, profile.DriverVFIO+"\n", read(bdf, "driver_override"))
		require.Contains(t, read(bdf, "uevent"), "DRIVER="+profile.DriverVFIO+"\n")
		entries, err := os.ReadDir(filepath.Join(links, bdf, sysfs.VFIODevDir))
		require.NoError(t, err)
		require.Len(t, entries, 1)
		name := entries[0].Name()
		require.Equal(t, sysfs.VFIODevName(vfio), name)
		require.Equal(t, fmt.Sprintf("%d:%d\n", sysfs.VFIODevMajor, vfio), read(bdf, sysfs.VFIODevDir+"/"+name+"/dev"))
		vfio++
	}
	require.Equal(t, 3, vfio)
}

// vfioWithCompanions is a passthrough HGX B200 with its companions: every
// GPU on vfio-pci through device_defaults, two NVSwitches (one with the
// default device id, one with its own) and two ConnectX-9 HCAs per GPU.
const vfioWithCompanions = `version: "1.0"
device_defaults:
  name: "NVIDIA B200"
  pci: {device_id: 0x234010DE, subsystem_id: 0x181810DE, driver: "vfio-pci"}
devices:
  - {index: 0, pci: {bus_id: "0000:1B:00.0"}}
  - {index: 1, pci: {bus_id: "0000:9B:00.0"}}
nvlink:
  switches:
    - {bdf: "0000:E1:00.0"}
    - {bdf: "0000:E2:00.0", device_id: 0x22A310DE}
infiniband: {enabled: true, hcas_per_gpu: 2, hca_type: "MT4133"}
`

// TestVFIOBesideNVSwitchesAndHCAs renders vfio-bound GPUs beside NVSwitches
// and HCAs: pci.driver in device_defaults binds the GPUs alone, so the
// NVSwitches keep nvidia-nvswitch and the HCAs mlx5_core, with no vfio-dev
// entry and no driver_override of vfio-pci, as the vfio-manager leaves a
// passthrough node's companion functions.
func TestVFIOBesideNVSwitchesAndHCAs(t *testing.T) {
	p, err := profile.Parse("vfio-companions.yaml", []byte(vfioWithCompanions))
	require.NoError(t, err)
	m, err := profile.Normalize("vfio-companions.yaml", p, profile.Options{})
	require.NoError(t, err)
	root, pl := overlaytest.Render(t, m, plan.Options{})
	checkPlan(t, pl)
	links := filepath.Join(root, plan.LinksDir)
	want := map[profile.DeviceKind]string{profile.GPU: profile.DriverVFIO, profile.NVSwitch: profile.DriverNVSwitch, profile.HCA: profile.DriverMLX5}
	seen := map[profile.DeviceKind]int{}
	for _, n := range pl.Tree.Nodes() {
		if n.Device == nil {
			continue
		}
		bdf := n.Address.String()
		kind := n.Device.Kind
		seen[kind]++
		driver, err := filepath.EvalSymlinks(filepath.Join(links, bdf, "driver"))
		require.NoError(t, err, bdf)
		require.Equal(t, want[kind], filepath.Base(driver), "%s (%v)", bdf, kind)
		override, err := os.ReadFile(filepath.Join(links, bdf, "driver_override"))
		require.NoError(t, err, bdf)
		if kind == profile.GPU {
			require.Equal(t, profile.DriverVFIO+"\n", string(override), bdf)
			require.DirExists(t, filepath.Join(links, bdf, sysfs.VFIODevDir), bdf)
			continue
		}
		require.NotEqual(t, profile.DriverVFIO+"\n", string(override), "%s (%v)", bdf, kind)
		require.NoDirExists(t, filepath.Join(links, bdf, sysfs.VFIODevDir), "%s (%v)", bdf, kind)
	}
	require.Equal(t, map[profile.DeviceKind]int{profile.GPU: 2, profile.NVSwitch: 2, profile.HCA: 4}, seen)
	require.Equal(t, 2, m.VFIOGPUs())
}
