package main

import (
	"errors"
	"os"
	"path"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// runVerify checks the container it runs in (kubectl exec ... verify).
func runVerify(e *env, args []string) int {
	flags := newFlags(e, "verify", "[--profile NAME|FILE] [--nvml-profile FILE] [--sysfs /sys] [--container-root DIR] [--format table|json]")
	var prof, nvmlProfile, sysfs, containerRoot string
	var format outputFormat
	flags.StringVar(&prof, "profile", "", "the profile to expect (default: the effective profile the render left in the overlay)")
	flags.StringVar(&nvmlProfile, "nvml-profile", "", "the profile nvml-mock's NVML serves, to check that it names the sysfs's GPUs (default: $"+compat.NVMLProfileEnv+")")
	flags.StringVar(&sysfs, "sysfs", compat.KernelSysfs, "the sysfs consumers read")
	flags.StringVar(&containerRoot, "container-root", plan.DefaultContainerRoot, "where the overlay is mounted")
	format.register(flags)
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if code, ok := format.check(e, "verify"); !ok {
		return code
	}
	if err := plan.ValidateContainerRoot(containerRoot); err != nil {
		return usageError(e, "verify", "--container-root: %v", err)
	}
	m, err := expectedMachine(prof, containerRoot)
	if err != nil {
		if prof == "" && errors.Is(err, os.ErrNotExist) {
			return fail(e, "verify: no effective profile at %s: verify checks the container it runs in, which must have been given the %s=%s device (the overlay mounted at %s); to check a render on the host, run 'nvml-mock-sysfs compat --root DIR'",
				path.Join(containerRoot, plan.ProfileFile), cdispec.DefaultKind, cdispec.DeviceName, containerRoot)
		}
		return failLoad(e, "verify", err)
	}
	sys := verify.Live(sysfs, containerRoot)
	sys.LookupEnv = e.lookupEnv
	sys.NVMLProfile = nvmlProfile
	r := verify.Run(m, sys)
	if err := writeReport(e, r, &format, "CHECK"); err != nil {
		return fail(e, "verify: %v", err)
	}
	if !r.OK() {
		return exitFailure
	}
	return exitOK
}
