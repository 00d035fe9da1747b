package main

import (
	"flag"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// renderHelp says what the render flags do with the profile and the root,
// for render and serve alike.
const renderHelp = `Keys of the profile that nvml-mock's schema does not know (a typo such as
subsytem_id would otherwise be ignored and the device rendered with a
default) are warnings that name the file, the field and the nearest known
key; --strict makes them an error.

A first render into a directory that holds files where the overlay goes
(an effective-profile.json or bin/nvml-mock-sysfs of your own) refuses and
names them; --force replaces them.
`

// renderProfileHelp is what render alone does without --profile: serve
// keeps the root equal to its flags, so its own output is never its input.
const renderProfileHelp = `Without --profile, render re-uses the effective profile of the render
already in --root (<root>/effective-profile.json), so a re-render keeps what
is there; a root without a render gets the built-in ` + shipped.Default + `.

`

// renderArgs are the flags that render and serve share: both render
// through overlay.Render with the same options. --profile is each
// command's own: its default differs (see renderProfileHelp).
type renderArgs struct {
	o                      overlay.Options
	hierarchy, hostDevices string
	noBinary               bool
}

func (a *renderArgs) register(flags *flag.FlagSet) {
	flags.StringVar(&a.o.Root, "root", overlay.DefaultRoot, "the overlay directory on the host")
	flags.StringVar(&a.o.ContainerRoot, "container-root", plan.DefaultContainerRoot, "where containers mount the overlay")
	flags.StringVar(&a.hierarchy, "hierarchy", "", "PCIe tree above each GPU: flat, hgx or dgx (default: the profile's, else its board's)")
	flags.StringVar(&a.hostDevices, "host-devices", string(overlay.HostDevicesNone), "none, or merge to also list the node's own PCI devices")
	flags.StringVar(&a.o.HostSysfs, "host-sysfs", plan.DefaultHostSysfs, "the host's sysfs, for CPUs and --host-devices merge")
	flags.DurationVar(&a.o.Writer.LockTimeout, "lock-timeout", time.Minute, "how long to wait for another render of the same root")
	flags.BoolVar(&a.o.Writer.CompareContent, "compare-content", false, "compare every file byte for byte, even when the marker vouches for the tree")
	flags.BoolVar(&a.noBinary, "no-binary", false, "do not install this binary at <root>/bin/nvml-mock-sysfs")
	flags.BoolVar(&a.o.Strict, "strict", false, "refuse a profile with keys nvml-mock's schema does not know, instead of warning")
	flags.BoolVar(&a.o.Writer.Force, "force", false, "let a first render replace files already in the root that no render made")
}

// options checks the flags and returns the render options, the binary to
// install left unset; on refusal it returns the exit code to stop with.
func (a *renderArgs) options(e *env, cmd string) (overlay.Options, int, bool) {
	o := a.o
	o.Writer.SkipSync = e.skipSync
	o.Hierarchy = boards.Hierarchy(a.hierarchy)
	if a.hierarchy != "" && !o.Hierarchy.Valid() {
		return o, usageError(e, cmd, "--hierarchy %q: want one of %v", a.hierarchy, boards.Hierarchies()), false
	}
	o.HostDevices = overlay.HostDevices(a.hostDevices)
	if o.HostDevices != overlay.HostDevicesNone && o.HostDevices != overlay.HostDevicesMerge {
		return o, usageError(e, cmd, "--host-devices %q: want none or merge", a.hostDevices), false
	}
	if err := writer.CheckRoot(o.Root); err != nil {
		return o, usageError(e, cmd, "--root: %v", err), false
	}
	if err := plan.ValidateContainerRoot(o.ContainerRoot); err != nil {
		return o, usageError(e, cmd, "--container-root: %v", err), false
	}
	return o, 0, true
}

// withBinary sets the binary to install: this executable, unless
// --no-binary.
func (a *renderArgs) withBinary(e *env, cmd string, o *overlay.Options) (int, bool) {
	if a.noBinary || e.executable == nil {
		return 0, true
	}
	bin, err := e.executable()
	if err != nil {
		return fail(e, "%s: find own binary to install: %v", cmd, err), false
	}
	o.Binary = bin
	return 0, true
}

func runRender(e *env, args []string) int {
	flags := newFlags(e, "render", "[--profile NAME|FILE] [--root DIR] [--container-root DIR] [--hierarchy flat|hgx|dgx] [--host-devices none|merge] [--host-sysfs /sys] [--lock-timeout DURATION] [--dry-run] [--no-binary] [--compare-content] [--strict] [--force]", renderProfileHelp+renderHelp)
	var a renderArgs
	flags.StringVar(&a.o.Profile, "profile", "", "a built-in profile name or a profile file (default: the root's effective profile, else "+shipped.Default+")")
	a.register(flags)
	var dryRun bool
	flags.BoolVar(&dryRun, "dry-run", false, "print the planned PCI tree and write nothing")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	o, code, ok := a.options(e, "render")
	if !ok {
		return code
	}
	o.Warn = func(err error) {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: render: warning: %s\n", oneLine(err.Error()))
	}
	if o.Profile == "" {
		if src := o.ProfileSource(); src != shipped.Default {
			fmt.Fprintf(e.stderr, "nvml-mock-sysfs: render: no --profile: re-using the effective profile of the render in %s\n", o.Root)
		}
	}
	if dryRun {
		p, err := overlay.Plan(o)
		if err != nil {
			return failLoad(e, "render", err)
		}
		printSummary(e, p, o, nil)
		if err := p.Tree.Format(e.stdout); err != nil {
			return fail(e, "%v", err)
		}
		return exitOK
	}
	if code, ok := a.withBinary(e, "render", &o); !ok {
		return code
	}
	p, st, err := overlay.Render(o)
	if err != nil {
		return failLoad(e, "render", err)
	}
	printSummary(e, p, o, &st)
	return exitOK
}

// machineSource names where a machine type came from: the profile's
// field, or the board and its name.
func machineSource(m *profile.Machine) string {
	if m.ProductNameFrom != profile.ProductNameFromBoard {
		return m.ProductNameFrom
	}
	g := m.GPUs()[0]
	return fmt.Sprintf("the board of GPU %d (%04x:%04x %q)", g.Index, g.Vendor, g.DeviceID, g.Name)
}

func printSummary(e *env, p *plan.Plan, o overlay.Options, st *writer.Stats) {
	m := p.Machine
	var gpus, switches, bridges int
	for _, n := range p.Tree.Nodes() {
		switch {
		case n.Role.IsBridge():
			bridges++
		case n.Device.Kind == profile.NVSwitch:
			switches++
		case n.Device.Kind == profile.GPU:
			gpus++
		}
	}
	verb := "planned"
	if st != nil {
		verb = "rendered"
	}
	fmt.Fprintf(e.stdout, "%s %s into %s\n", verb, m.Source, o.Root)
	fmt.Fprintf(e.stdout, "  GPUs %d, NVSwitches %d, root complexes %d, bridges %d, hierarchy %s\n",
		gpus, switches, len(p.Tree.RootComplexes), bridges, m.Hierarchy)
	if n := len(m.OffBusSwitches); n > 0 {
		fmt.Fprintf(e.stdout, "  NVSwitches off the bus %d: on buses no root complex covers and without device_id, so in switch trays of their own (as on NVL72); not rendered\n", n)
	}
	if n := m.VFIOGPUs(); n > 0 {
		fmt.Fprintf(e.stdout, "  vfio-pci    %d of %d GPUs bound for passthrough (own IOMMU group, vfio-dev entry); a real node's NVML lists none of them\n", n, len(m.GPUs()))
	}
	if s := m.HCAs; s != nil {
		beside := "each GPU"
		if s.GPUs != nil {
			beside = fmt.Sprintf("each of GPUs %v (infiniband.gpus)", s.GPUs)
		}
		fmt.Fprintf(e.stdout, "  HCAs %d (%s %s, %s), one PCIe switch or root port beside %s\n", len(p.Tree.HCAs), s.Type, s.Name, s.LinkLayer, beside)
	}
	if m.ProductName != "" {
		fmt.Fprintf(e.stdout, "  machine     %q from %s, in %s (GFD: the CDI spec's %s, or --machine-type-file=%s)\n",
			m.ProductName, machineSource(m), plan.ProductNameFile, cdispec.MachineTypeFileEnv, path.Join(p.ContainerRoot, plan.ProductNameFile))
	}
	fmt.Fprintf(e.stdout, "  overlay     %s -> mount at %s\n", o.Root, p.ContainerRoot)
	fmt.Fprintf(e.stdout, "  links       %s -> mount at %s\n", path.Join(o.Root, plan.LinksDir), sysfs.KernelLinksDir)
	fmt.Fprintf(e.stdout, "  modules     %s -> mount at /%s: %s, beside %d of the node's (mounted at %s)\n",
		path.Join(o.Root, plan.ModulesDir), plan.ModulesDir, strings.Join(p.Modules, ", "), len(p.HostModules), path.Join(p.ContainerRoot, plan.HostModulesDir))
	if st == nil {
		return
	}
	fmt.Fprintf(e.stdout, "  wrote %d files, %d links, %d directories (%d bytes); unchanged %d files, %d links; removed %d\n",
		st.FilesWritten, st.LinksWritten, st.DirsCreated, st.BytesWritten, st.FilesUnchanged, st.LinksUnchanged, st.Removed)
	for _, f := range st.Foreign {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: warning: %s holds %q, which no render made; go-nvlib aborts its scan on an unreadable entry\n", path.Join(o.Root, plan.LinksDir), f)
	}
	for _, k := range st.Kept {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: warning: kept stale %s: it holds files no render made\n", path.Join(o.Root, k))
	}
}
