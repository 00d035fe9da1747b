package sysfs

import (
	"strconv"
	"strings"
)

// VFIODevDir is the directory the kernel adds to a vfio-pci device's own
// directory (drivers/vfio/device_cdev.c, since Linux 6.2), holding one
// entry vfioN for the device's iommufd character device
// /dev/vfio/devices/vfioN. go-nvlib's IommuFD and
// kubevirt-gpu-device-plugin read its name.
const VFIODevDir = "vfio-dev"

// VFIODevMajor is the character major the kernel gives those device
// files: dynamically allocated, from the top of the extended dynamic
// range down (CHRDEV_MAJOR_DYN_EXT_START, 511), as on a node where vfio
// registers first.
const VFIODevMajor = 511

// vfioDevPrefix begins every vfio device's name: the kernel names them
// "vfio%d" by the device's index (drivers/vfio/vfio_main.c).
const vfioDevPrefix = "vfio"

// VFIODevName is the name of the n-th vfio device (vfio0, vfio1, ...),
// the kernel's order of binding.
func VFIODevName(n int) string { return vfioDevPrefix + strconv.Itoa(n) }

// IsVFIODevName reports whether name is a vfio device's name as the kernel
// writes it: vfio and a decimal number, no sign and no leading zero.
func IsVFIODevName(name string) bool {
	digits, found := strings.CutPrefix(name, vfioDevPrefix)
	n, err := strconv.Atoi(digits)
	return found && err == nil && n >= 0 && strconv.Itoa(n) == digits
}
