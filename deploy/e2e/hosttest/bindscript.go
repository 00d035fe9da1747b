package hosttest

import "fmt"

// VFIOBindScript is the shell that binds gpu to vfio-pci as go-nvlib's
// nvpassthrough does, by plain writes (its driver_override, its driver's
// unbind, vfio-pci's bind), and prints what it read before and after:
// "(null)", the driver's name, its vfio-dev entry. A container of a
// writable tree's spec runs it; on the read-only tree the first write
// fails.
func VFIOBindScript(gpu string) string {
	return fmt.Sprintf(`cat /sys/bus/pci/devices/%[1]s/driver_override
echo vfio-pci > /sys/bus/pci/devices/%[1]s/driver_override
echo %[1]s > /sys/bus/pci/devices/%[1]s/driver/unbind
echo %[1]s > /sys/bus/pci/drivers/vfio-pci/bind
basename "$(readlink /sys/bus/pci/devices/%[1]s/driver)"
ls /sys/bus/pci/devices/%[1]s/vfio-dev
`, gpu)
}
