package compat

import (
	"io/fs"
	"testing/fstest"

	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// reference keeps the two link forms side by side in memory and asks the
// real deviceattribute about each. Today the plain escaped form is rejected
// ("must start with devices/pci") and the anchored one gives the root
// complex. If a future deviceattribute changes its rule, these rows say so.
func (c *checker) reference() {
	const (
		rc     = "pci0000:15"
		anchor = "0000:16:00.0"
		gpu    = "0000:18:00.0"
	)
	anchorPath := "devices/" + rc + "/0000:15:01.0/" + anchor
	gpuPath := anchorPath + "/0000:17:00.0/" + gpu
	anchorAddr, _ := pciaddr.Parse(anchor)
	link := func(target string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte(target), Mode: fs.ModeSymlink}
	}
	ask := func(target string) (deviceattribute.DeviceAttribute, error) {
		fsys := fstest.MapFS{sysfs.LinksDir + "/" + gpu: link(target)}
		return deviceattribute.GetPCIeRootAttributeByPCIBusID(gpu, deviceattribute.WithFS(fsys))
	}
	plain := plan.EscapedTarget(plan.DefaultContainerRoot, gpuPath)
	if _, err := ask(plain); err != nil {
		c.add(ReferencePlain, gpu, true, "pcieRoot rejects %s as expected: %v", plain, err)
	} else {
		c.add(ReferencePlain, gpu, false, "pcieRoot now accepts %s: deviceattribute changed its rule; the plain form may be enough", plain)
	}
	anchored := plan.AnchoredTarget(anchorAddr, gpuPath)
	attr, err := ask(anchored)
	switch {
	case err != nil:
		c.add(ReferenceAnchor, gpu, false, "pcieRoot rejects %s: %v", anchored, err)
	case describe(attr) != rc:
		c.add(ReferenceAnchor, gpu, false, "pcieRoot of %s is %s, want %s", anchored, describe(attr), rc)
	default:
		c.add(ReferenceAnchor, gpu, true, "pcieRoot of %s is %s", anchored, rc)
	}
}
