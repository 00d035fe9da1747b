package boards

// MachineName is the DMI product name of the machine a GPU board ships in,
// as /sys/class/dmi/id/product_name shows it there and GPU Feature
// Discovery labels it (nvidia.com/gpu.machine), or "" where one board goes
// into many vendors' machines and no single name is true.
func MachineName(gpuDevice uint16) string {
	switch gpuDevice {
	case 0x20b0: // A100-SXM4-40GB
		return "DGX A100"
	case 0x2330: // H100 80GB HBM3 (SXM5)
		return "DGX H100"
	case 0x2335: // H200
		return "DGX H200"
	}
	return ""
}
