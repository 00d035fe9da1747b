package plan_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
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
			require.NotEqual(t, "vfio-pci", filepath.Base(driver), bdf)
			require.NoDirExists(t, filepath.Join(links, bdf, "vfio-dev"))
			continue
		}
		require.Equal(t, "vfio-pci", filepath.Base(driver), bdf)
		require.FileExists(t, filepath.Join(driver, bdf, "vendor"), "the driver directory links the GPU back")
		require.Equal(t, "vfio-pci\n", read(bdf, "driver_override"))
		require.Contains(t, read(bdf, "uevent"), "DRIVER=vfio-pci\n")
		entries, err := os.ReadDir(filepath.Join(links, bdf, "vfio-dev"))
		require.NoError(t, err)
		require.Len(t, entries, 1)
		name := entries[0].Name()
		require.Equal(t, "vfio"+strconv.Itoa(vfio), name)
		require.Equal(t, "511:"+strconv.Itoa(vfio)+"\n", read(bdf, "vfio-dev/"+name+"/dev"))
		vfio++
	}
	require.Equal(t, 3, vfio)
}
