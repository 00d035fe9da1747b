package main

import (
	"cmp"
	"fmt"
	"os"
	"path"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func runCompat(e *env, args []string) int {
	flags := newFlags(e, "compat", "[--root DIR | --sysfs /sys [--container-root DIR]] [--profile NAME|FILE] [--nvml-profile FILE] [--format table|json]")
	var root, sysfs, prof, nvmlProfile, containerRoot string
	var format outputFormat
	flags.StringVar(&root, "root", "", "check the tree on the host, at <root>/sys (default "+overlay.DefaultRoot+")")
	flags.StringVar(&sysfs, "sysfs", "", "check at this sysfs instead, e.g. /sys where the links directory is mounted")
	flags.StringVar(&prof, "profile", "", "the profile to expect (default: the effective profile the render left in the overlay)")
	flags.StringVar(&nvmlProfile, "nvml-profile", "", "the profile nvml-mock's NVML serves, to check that it names the sysfs's GPUs (default with --sysfs: $"+compat.NVMLProfileEnv+")")
	flags.StringVar(&containerRoot, "container-root", "", "where the overlay is mounted: with --sysfs, to find its effective profile (default "+plan.DefaultContainerRoot+"); on the host, must match the render's")
	format.register(flags)
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if root != "" && sysfs != "" {
		return usageError(e, "compat", "give --root or --sysfs, not both")
	}
	if code, ok := format.check(e, "compat"); !ok {
		return code
	}
	if root != "" {
		if err := writer.CheckRoot(root); err != nil {
			return usageError(e, "compat", "--root: %v", err)
		}
	}
	hostSide := sysfs == ""
	overlayDir, sysfs := whereToCheck(root, sysfs, containerRoot)
	if hostSide {
		// The links must resolve where the render said containers mount it.
		served, err := cdispec.ServedContainerRoot(os.DirFS(overlayDir), overlayDir, containerRoot)
		if err != nil {
			return containerRootError(e, "compat", containerRoot, err)
		}
		containerRoot = served
	}
	m, err := expectedMachine(prof, overlayDir)
	if err != nil {
		return failLoad(e, "compat", err)
	}
	report := compat.Run(m, sysfs)
	if hostSide {
		report.Results = append(report.Results, compat.CheckServedLinks(overlayDir, containerRoot))
	}
	if nvmlProfile == "" && !hostSide && e.lookupEnv != nil {
		// Where a container sees the tree, nvml-mock's NVML reads the
		// profile its environment names.
		nvmlProfile, _ = e.lookupEnv(compat.NVMLProfileEnv)
	}
	if nvmlProfile != "" {
		report.Results = append(report.Results, compat.NVMLCheck(nvmlProfile, sysfs))
	}
	if err := writeReport(e, report, &format, "CONSUMER"); err != nil {
		return fail(e, "compat: %v", err)
	}
	if !report.OK() {
		return exitFailure
	}
	return exitOK
}

// whereToCheck resolves --root, --sysfs and --container-root into the
// overlay directory holding the effective profile and the sysfs to read:
// <root> and <root>/sys on the host, or the container root and the given
// sysfs in a container.
func whereToCheck(root, sysfs, containerRoot string) (overlayDir, sysfsDir string) {
	if sysfs == "" {
		root = cmp.Or(root, overlay.DefaultRoot)
		return root, path.Join(root, "sys")
	}
	if root != "" {
		return root, sysfs
	}
	containerRoot = cmp.Or(containerRoot, plan.DefaultContainerRoot)
	return containerRoot, sysfs
}

// expectedMachine loads the profile to check against: the one named, or the
// effective profile a render left in the overlay.
func expectedMachine(prof, overlayDir string) (*profile.Machine, error) {
	if prof == "" {
		p, err := profile.LoadFile(path.Join(overlayDir, plan.ProfileFile))
		if err != nil {
			return nil, fmt.Errorf("no profile given and no effective profile in the overlay: %w", err)
		}
		return profile.Normalize(path.Join(overlayDir, plan.ProfileFile), p, profile.Options{})
	}
	return overlay.LoadMachine(prof, "")
}

// writeReport prints a report; verify's rows are checks, compat's consumers.
func writeReport(e *env, r *compat.Report, format *outputFormat, what string) error {
	return format.write(e.stdout, r, func() error {
		var rows [][]string
		for _, x := range r.Results {
			res := "ok"
			if !x.OK {
				res = "FAIL"
			}
			rows = append(rows, []string{x.Check, x.Device, res, x.Detail})
		}
		if err := writeTable(e.stdout, []string{what, "DEVICE", "RESULT", "DETAIL"}, rows); err != nil {
			return err
		}
		_, err := fmt.Fprintf(e.stdout, "%d checks at %s, %d failed\n", len(r.Results), r.Sysfs, len(r.Failures()))
		return err
	})
}
