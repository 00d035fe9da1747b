// Command nvml-list loads an NVML library (nvml-mock's, or the suites'
// stand-in) through go-nvml, as GPU Feature Discovery does, and prints
// every device's PCI identity as NVML reports it: a JSON array on standard
// output. It is the NVML side of the check that NVML and the served sysfs
// name the same GPUs. For each GPU it also asks deviceattribute, the
// library the DRA drivers publish resource.kubernetes.io/pcieRoot with,
// for the PCIe root of NVML's bus id, as the NVIDIA DRA driver's discovery
// does: the sysfs it reads is the one this process sees.
//
//	nvml-list [-library PATH]
//
// Without -library the dynamic loader finds libnvidia-ml.so.1
// (LD_LIBRARY_PATH).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// device is one GPU as NVML reports it. consumers.NVMLDevice reads it:
// this module is built on its own, so it cannot share the type.
type device struct {
	Index int `json:"index"`
	// BusID is NVML's form, with an 8-digit domain: 00000000:3B:00.0.
	BusID string `json:"busId"`
	// DeviceID and SubsystemID are packed as NVML packs them:
	// (device << 16) | vendor.
	DeviceID    uint32 `json:"pciDeviceId"`
	SubsystemID uint32 `json:"pciSubSystemId"`
	// PCIeRoot is deviceattribute's pcieRoot for BusID; PCIeRootError
	// says why there is none (no mock sysfs: the bus id is not a device).
	PCIeRoot      string `json:"pcieRoot,omitempty"`
	PCIeRootError string `json:"pcieRootError,omitempty"`
	// What NVML reports of the board, which the DRA driver and GFD
	// publish; each omitted where NVML answers with an error (the
	// stand-in supports no architecture and no brand, and reports no
	// memory for a profile without it).
	Name         string `json:"name,omitempty"`
	Brand        string `json:"brand,omitempty"`
	Architecture string `json:"architecture,omitempty"`
	// ComputeCapability is major.minor.
	ComputeCapability string `json:"computeCapability,omitempty"`
	MemoryBytes       uint64 `json:"memoryBytes,omitempty"`
}

func main() {
	library := flag.String("library", "", "the NVML library to load; empty lets the dynamic loader find libnvidia-ml.so.1")
	flag.Parse()
	devices, err := list(*library)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-list:", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(devices, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-list:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

func list(library string) ([]device, error) {
	var opts []nvml.LibraryOption
	if library != "" {
		opts = append(opts, nvml.WithLibraryPath(library))
	}
	lib := nvml.New(opts...)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlInit: %v", ret)
	}
	defer lib.Shutdown()
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %v", ret)
	}
	devices := []device{}
	for i := range count {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %v", i, ret)
		}
		pci, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetPciInfo(%d): %v", i, ret)
		}
		dev := device{Index: i, BusID: cString(pci.BusId[:]), DeviceID: pci.PciDeviceId, SubsystemID: pci.PciSubSystemId}
		if attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(sysfsBusID(dev.BusID)); err != nil {
			dev.PCIeRootError = err.Error()
		} else if attr.Value.StringValue != nil {
			dev.PCIeRoot = *attr.Value.StringValue
		}
		facts(lib, d, &dev)
		devices = append(devices, dev)
	}
	return devices, nil
}

// facts fills in what NVML reports of d's board, each where it answers.
// Architecture and brand are asked only of a library that has their
// entry points, and printed in nvml-mock's profile names (lower case).
func facts(lib nvml.Interface, d nvml.Device, dev *device) {
	if name, ret := d.GetName(); ret == nvml.SUCCESS {
		dev.Name = name
	}
	if major, minor, ret := d.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		dev.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		dev.MemoryBytes = mem.Total
	}
	ext := lib.Extensions()
	if ext.LookupSymbol("nvmlDeviceGetArchitecture") == nil {
		if arch, ret := d.GetArchitecture(); ret == nvml.SUCCESS {
			dev.Architecture = cmpOr(architectures()[arch], fmt.Sprintf("unknown (%d)", arch))
		}
	}
	if ext.LookupSymbol("nvmlDeviceGetBrand") == nil {
		if brand, ret := d.GetBrand(); ret == nvml.SUCCESS {
			dev.Brand = cmpOr(brands()[brand], fmt.Sprintf("unknown (%d)", brand))
		}
	}
}

// architectures are NVML's architectures by nvml-mock's profile names.
func architectures() map[nvml.DeviceArchitecture]string {
	return map[nvml.DeviceArchitecture]string{
		nvml.DEVICE_ARCH_KEPLER: "kepler", nvml.DEVICE_ARCH_MAXWELL: "maxwell", nvml.DEVICE_ARCH_PASCAL: "pascal",
		nvml.DEVICE_ARCH_VOLTA: "volta", nvml.DEVICE_ARCH_TURING: "turing", nvml.DEVICE_ARCH_AMPERE: "ampere",
		nvml.DEVICE_ARCH_ADA: "ada", nvml.DEVICE_ARCH_HOPPER: "hopper", nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
	}
}

// brands are NVML's brands by nvml-mock's profile names.
func brands() map[nvml.BrandType]string {
	return map[nvml.BrandType]string{
		nvml.BRAND_NVIDIA: "nvidia", nvml.BRAND_TESLA: "tesla", nvml.BRAND_QUADRO: "quadro",
		nvml.BRAND_GEFORCE: "geforce", nvml.BRAND_TITAN: "titan", nvml.BRAND_NVIDIA_RTX: "nvidia_rtx",
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// sysfsBusID is NVML's bus id (an 8-digit domain, upper case:
// 00000000:1A:00.0) as sysfs names the device (0000:1a:00.0), which is
// what the NVIDIA DRA driver hands deviceattribute (go-nvlib's
// GetPCIBusID does the same).
func sysfsBusID(nvml string) string {
	id := strings.ToLower(nvml)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) == 8 {
		id = domain[4:] + ":" + rest
	}
	return id
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
