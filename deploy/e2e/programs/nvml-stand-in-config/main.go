// Command nvml-stand-in-config prints, in the flat form the suites' NVML
// stand-in reads (deploy/e2e/programs/testdata/nvml-stand-in/nvml.c), the
// GPUs of the nvml-mock profile file named by its one argument. The
// stand-in runs it from its own directory at nvmlInit, so it serves the
// same file nvml-mock's NVML would (MOCK_NVML_CONFIG), re-read on every
// init as nvml-mock's is: a ConfigMap that changes is followed.
//
//	nvml-stand-in-config PROFILE
package main

import (
	"fmt"
	"os"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: nvml-stand-in-config PROFILE")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-stand-in-config:", err)
		os.Exit(1)
	}
	out, err := programs.StandInConfig(os.Args[1], data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvml-stand-in-config:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fmt.Fprintln(os.Stderr, "nvml-stand-in-config:", err)
		os.Exit(1)
	}
}
