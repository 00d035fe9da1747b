package main

import (
	"fmt"
	"os"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/fidelity"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

const fidelityHelp = `Compares each GPU and NVSwitch directory with the attributes a real node's
kernel shows for a GPU (vendor ... config, driver, iommu_group, link speed
and width, msi_irqs, resource0 ...), and marks each one:
  present    there, in the kernel's format, and as the profile says;
  missing    a real node shows it, this tree does not;
  different  there, but not what the kernel would write or the profile says.
NEED is "consumer" when a consumer (go-nvlib, deviceattribute, GFD, lspci,
ghw, hwloc, NFD) reads it, "kernel" when only the kernel is known to show it.
The exit status is 1 when any attribute is different, or a consumer's one is
missing; missing kernel-only attributes are listed gaps, not failures.
Without a profile (a real node: --sysfs /sys --device BDF), only the
kernel's formats and the files' agreement with each other are checked.
`

func runFidelity(e *env, args []string) int {
	flags := newFlags(e, "fidelity", "[--root DIR | --sysfs /sys [--container-root DIR]] [--device BDF] [--profile NAME|FILE] [--gaps] [--format table|json]", fidelityHelp)
	var root, sysfsDir, prof, containerRoot, device string
	var format outputFormat
	var gapsOnly bool
	flags.StringVar(&root, "root", "", "check the tree on the host, at <root>/sys (default "+overlay.DefaultRoot+")")
	flags.StringVar(&sysfsDir, "sysfs", "", "check at this sysfs instead, e.g. /sys in a container or on a real node")
	flags.StringVar(&prof, "profile", "", "the profile to expect (default: the effective profile the render left in the overlay)")
	flags.StringVar(&containerRoot, "container-root", "", "with --sysfs: where the overlay is mounted, to find its effective profile (default "+plan.DefaultContainerRoot+")")
	flags.StringVar(&device, "device", "", "check only this PCI address")
	format.register(flags)
	flags.BoolVar(&gapsOnly, "gaps", false, "list only the attributes that are missing or different")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if root != "" && sysfsDir != "" {
		return usageError(e, "fidelity", "give --root or --sysfs, not both")
	}
	if code, ok := format.check(e, "fidelity"); !ok {
		return code
	}
	if root != "" {
		if err := writer.CheckRoot(root); err != nil {
			return usageError(e, "fidelity", "--root: %v", err)
		}
	}
	var only pciaddr.Address
	if device != "" {
		a, err := pciaddr.Parse(device)
		if err != nil {
			return usageError(e, "fidelity", "--device: %v", err)
		}
		only = a
	}
	overlayDir, sysfsDir := whereToCheck(root, sysfsDir, containerRoot)
	m, err := expectedMachine(prof, overlayDir)
	if err != nil && (device == "" || prof != "") {
		return failLoad(e, "fidelity", err)
	}
	dirFS := os.DirFS(sysfsDir)
	var rows []fidelity.Row
	switch {
	case m == nil:
		// A real node, or a tree without its profile: formats only.
		rows = fidelity.Check(dirFS, sysfs.LinksDir+"/"+only.String(), nil)
	case device != "":
		d, found := deviceOf(m, only)
		if !found {
			return fail(e, "fidelity: %s is not a device of %s", only, m.Source)
		}
		rows = fidelity.Check(dirFS, sysfs.LinksDir+"/"+only.String(), fidelity.ExpectFor(d))
	default:
		rows = fidelity.CheckMachine(dirFS, m)
	}
	report := &fidelity.Report{Sysfs: sysfsDir, Rows: rows}
	if err := writeFidelity(e, report, &format, gapsOnly); err != nil {
		return fail(e, "fidelity: %v", err)
	}
	if len(report.Failures()) > 0 {
		return exitFailure
	}
	return exitOK
}

func deviceOf(m *profile.Machine, a pciaddr.Address) (profile.Device, bool) {
	for _, d := range m.Devices {
		if d.Address == a {
			return d, true
		}
	}
	return profile.Device{}, false
}

func writeFidelity(e *env, r *fidelity.Report, format *outputFormat, gapsOnly bool) error {
	rows := r.Rows
	if gapsOnly {
		rows = nil
		for _, x := range r.Rows {
			if x.Status != fidelity.Present {
				rows = append(rows, x)
			}
		}
	}
	return format.write(e.stdout, &fidelity.Report{Sysfs: r.Sysfs, Rows: rows}, func() error {
		var cells [][]string
		for _, x := range rows {
			status := string(x.Status)
			if x.Failing() {
				status += " (FAIL)"
			}
			detail := x.Detail
			if x.Status == fidelity.Missing {
				detail = "real nodes show it for " + string(x.Scope)
			}
			cells = append(cells, []string{x.Device, x.Attribute, string(x.Need), status, detail})
		}
		if err := writeTable(e.stdout, []string{"DEVICE", "ATTRIBUTE", "NEED", "STATUS", "DETAIL"}, cells); err != nil {
			return err
		}
		_, err := fmt.Fprintf(e.stdout, "%d attributes at %s: %d present, %d missing, %d different; %d failing\n",
			len(r.Rows), r.Sysfs, r.Count(fidelity.Present), r.Count(fidelity.Missing), r.Count(fidelity.Different), len(r.Failures()))
		return err
	})
}
