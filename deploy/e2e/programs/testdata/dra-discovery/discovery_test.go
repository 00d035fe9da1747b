// This file is compiled into the NVIDIA DRA driver's gpu-kubelet-plugin
// package (package main) by the consumers package's DRADiscovery recipe.
// The plugin itself cannot run without a kubelet and an API server, so this
// test runs the plugin's own device discovery, exactly as its startup does
// (newDeviceLib, then enumerateAllPossibleDevices), and prints what it
// would announce in its ResourceSlice: each device's name and attributes.
//
// Environment: NVML_MOCK_SYSFS_DRIVER_ROOT names the driver root (it holds
// the NVML library as usr/lib64/libnvidia-ml.so.1 and a usr/bin/nvidia-smi).
// Each device is one line on standard output: the prefix below, then JSON.

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

func TestNVMLMockSysfsDiscovery(t *testing.T) {
	driverRoot := os.Getenv("NVML_MOCK_SYSFS_DRIVER_ROOT")
	if driverRoot == "" {
		t.Fatal("NVML_MOCK_SYSFS_DRIVER_ROOT is not set")
	}
	lib, err := newDeviceLib(root(driverRoot))
	if err != nil {
		t.Fatalf("newDeviceLib(%s): %v", driverRoot, err)
	}
	perGPU, err := lib.enumerateAllPossibleDevices()
	if err != nil {
		t.Fatalf("enumerateAllPossibleDevices: %v", err)
	}
	for busID, devices := range perGPU.allocatablesMap {
		for _, d := range devices {
			if d.Type() == MigDynamicDeviceType {
				continue // abstract: GetDevice refuses it, and it has no PCI attributes
			}
			dev := d.GetDevice()
			line, err := json.Marshal(map[string]any{
				"gpuPCIBusID": busID,
				"type":        d.Type(),
				"name":        dev.Name,
				"attributes":  dev.Attributes,
			})
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("nvml-mock-sysfs-dra-device: %s\n", line)
		}
	}
}
