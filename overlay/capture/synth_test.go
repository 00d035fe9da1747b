package capture_test

import (
	"fmt"
	"strings"
)

// synthGPU is one GPU of a capture written by the tests, with every field
// spelt as the capture would spell it ("" leaves the element out).
type synthGPU struct {
	id, busID             string // the <gpu id> attribute and pci_bus_id
	name                  string
	deviceID, subsystemID string
	baseClass, subClass   string
	maxGen, curGen        string
	maxWidth, curWidth    string
	bar1                  string
	noBAR1                bool // leave out bar1_memory_usage entirely
}

// gpu fills in a GPU as a current nvidia-smi writes it for a board.
func gpu(busID, deviceID, subsystemID, bar1 string) synthGPU {
	return synthGPU{
		id: busID, busID: busID, name: "NVIDIA Test GPU",
		deviceID: deviceID, subsystemID: subsystemID, baseClass: "3", subClass: "2",
		maxGen: "4", curGen: "4", maxWidth: "16x", curWidth: "16x", bar1: bar1,
	}
}

func element(indent, name, value string) string {
	if value == "" {
		return ""
	}
	return fmt.Sprintf("%s<%s>%s</%s>\n", indent, name, value, name)
}

// synthCapture writes a whole nvidia-smi -q -x log in the v12 shape, with
// the surrounding elements a real capture has.
func synthCapture(gpus ...synthGPU) string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
	<timestamp>Fri Aug 21 10:21:36 2026</timestamp>
	<driver_version>570.148.08</driver_version>
	<cuda_version>12.8</cuda_version>
`)
	fmt.Fprintf(&b, "\t<attached_gpus>%d</attached_gpus>\n", len(gpus))
	for _, g := range gpus {
		if g.id != "" {
			fmt.Fprintf(&b, "\t<gpu id=%q>\n", g.id)
		} else {
			b.WriteString("\t<gpu>\n")
		}
		b.WriteString(element("\t\t", "product_name", g.name))
		b.WriteString("\t\t<mig_mode>\n\t\t\t<current_mig>N/A</current_mig>\n\t\t</mig_mode>\n\t\t<pci>\n")
		b.WriteString(element("\t\t\t", "pci_base_class", g.baseClass))
		b.WriteString(element("\t\t\t", "pci_sub_class", g.subClass))
		b.WriteString(element("\t\t\t", "pci_device_id", g.deviceID))
		b.WriteString(element("\t\t\t", "pci_bus_id", g.busID))
		b.WriteString(element("\t\t\t", "pci_sub_system_id", g.subsystemID))
		b.WriteString("\t\t\t<pci_gpu_link_info>\n\t\t\t\t<pcie_gen>\n")
		b.WriteString(element("\t\t\t\t\t", "max_link_gen", g.maxGen))
		b.WriteString(element("\t\t\t\t\t", "current_link_gen", g.curGen))
		b.WriteString("\t\t\t\t\t<max_host_link_gen>N/A</max_host_link_gen>\n\t\t\t\t</pcie_gen>\n\t\t\t\t<link_widths>\n")
		b.WriteString(element("\t\t\t\t\t", "max_link_width", g.maxWidth))
		b.WriteString(element("\t\t\t\t\t", "current_link_width", g.curWidth))
		b.WriteString("\t\t\t\t</link_widths>\n\t\t\t</pci_gpu_link_info>\n\t\t\t<tx_util>350 KB/s</tx_util>\n\t\t</pci>\n")
		b.WriteString("\t\t<fb_memory_usage>\n\t\t\t<total>40960 MiB</total>\n\t\t</fb_memory_usage>\n")
		if !g.noBAR1 {
			b.WriteString("\t\t<bar1_memory_usage>\n")
			b.WriteString(element("\t\t\t", "total", g.bar1))
			b.WriteString("\t\t\t<used>1 MiB</used>\n\t\t</bar1_memory_usage>\n")
		}
		b.WriteString("\t</gpu>\n")
	}
	b.WriteString("</nvidia_smi_log>\n")
	return b.String()
}
