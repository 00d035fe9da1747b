// Package overlay renders nvml-mock profiles into a PCI sysfs overlay: a
// tree of device directories and a links directory that containers mount
// at /sys/bus/pci/devices, leaving the real /sys/devices untouched.
//
// The work is split three ways. profile reads and normalises the user's
// YAML; plan turns it into every path, link text and file content without
// touching disk; writer puts a plan on disk. This package ties them together.
package overlay

import (
	"cmp"
	"crypto/sha256"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// DefaultRoot is where the overlay lives on the host.
const DefaultRoot = "/var/lib/nvml-mock"

// HostDevices says what to do with the node's own PCI devices.
type HostDevices string

const (
	// HostDevicesNone lists only the mock devices.
	HostDevicesNone HostDevices = "none"
	// HostDevicesMerge also lists the node's real devices.
	HostDevicesMerge HostDevices = "merge"
)

// Options configure a render.
type Options struct {
	// Profile is a built-in name or a file. Empty re-uses the effective
	// profile of the render already in Root, so that a re-render without
	// --profile keeps what is there; in a root without one, shipped.Default.
	Profile       string
	Root          string // default DefaultRoot
	ContainerRoot string // default plan.DefaultContainerRoot
	Hierarchy     boards.Hierarchy
	HostDevices   HostDevices
	HostSysfs     string // default /sys
	// HostProcfs is where the node's /proc/modules and /proc/devices are
	// read from, whose lines the rendered proc/modules and proc/devices
	// keep; default /proc.
	HostProcfs string
	// Binary, if set, is a file to install at <root>/bin/nvml-mock-sysfs:
	// render's own executable.
	Binary string
	// Strict refuses a profile with keys nvml-mock's schema does not know;
	// otherwise each is passed to Warn (when set) and rendering goes on.
	Strict bool
	Warn   func(error)
	Writer writer.Options
	// Writable plans the tree the writable mode serves (plan.Options.Writable),
	// listing the host's own drivers beside the mock ones; the state writes
	// left is a Planner's to show.
	Writable bool
}

// ProfileSource returns the profile a render with these options uses: the
// one asked for, else the effective profile of a render already in the
// root (a manifest says a render made it), else shipped.Default.
func (o Options) ProfileSource() string {
	if o.Profile != "" {
		return o.Profile
	}
	root := cmp.Or(o.Root, DefaultRoot)
	effective := path.Join(root, plan.ProfileFile)
	if _, err := os.Lstat(path.Join(root, writer.ManifestFile)); err != nil {
		return shipped.Default
	}
	if info, err := os.Lstat(effective); err != nil || !info.Mode().IsRegular() {
		return shipped.Default
	}
	return effective
}

// LoadMachine resolves and normalises a profile.
func LoadMachine(nameOrPath string, h boards.Hierarchy) (*profile.Machine, error) {
	p, source, err := shipped.Load(nameOrPath)
	if err != nil {
		return nil, err
	}
	return profile.Normalize(source, p, profile.Options{Hierarchy: h})
}

// Plan loads the profile and plans the overlay, reading the host's CPUs
// (and devices, when merging) from its sysfs.
func Plan(opts Options) (*plan.Plan, error) {
	pl, err := NewPlanner(opts)
	if err != nil {
		return nil, err
	}
	return pl.Plan(nil)
}

// Planner is everything a plan is made from but the state writes left: the
// profile read and normalised, and the host's facts. A writable tree plans
// from one at every write(2), so a write reads no file, normalises nothing
// and warns of nothing: the render that made the Planner did.
type Planner struct {
	machine *profile.Machine
	opts    plan.Options
	binary  *plan.FileSource // nil without Options.Binary
}

// NewPlanner reads opts' profile (passing each unknown key to opts.Warn,
// or refusing them with opts.Strict), normalises it, and reads the host's
// CPUs and modules, and its devices and drivers where opts asks for them.
func NewPlanner(opts Options) (*Planner, error) {
	prof, source, err := shipped.Load(opts.ProfileSource())
	if err != nil {
		return nil, err
	}
	if len(prof.Unknown) > 0 && opts.Strict {
		more := ""
		if n := len(prof.Unknown) - 1; n > 0 {
			more = fmt.Sprintf(" (and %d more unknown keys)", n)
		}
		return nil, fmt.Errorf("%w%s; --strict refuses keys nvml-mock does not know", prof.Unknown[0], more)
	}
	if opts.Warn != nil {
		for _, u := range prof.Unknown {
			opts.Warn(u)
		}
	}
	m, err := profile.Normalize(source, prof, profile.Options{Hierarchy: opts.Hierarchy})
	if err != nil {
		return nil, err
	}
	hostSysfs := cmp.Or(opts.HostSysfs, plan.DefaultHostSysfs)
	sysfs := os.DirFS(hostSysfs)
	cpus, err := plan.ReadHostCPUs(sysfs)
	if err != nil {
		// Without the host's CPU topology (a test sysfs, say), render as a
		// one-CPU host rather than fail: only local_cpus depends on it.
		cpus = plan.SingleCPU()
	}
	po := plan.Options{ContainerRoot: opts.ContainerRoot, Host: cpus, HostSysfs: hostSysfs}
	// The node's own modules stay listed beside the module view's, as
	// its devices are beside the mock ones with --host-devices merge.
	if po.HostModules, err = plan.ReadHostModules(sysfs); err != nil {
		return nil, err
	}
	procfs := os.DirFS(cmp.Or(opts.HostProcfs, "/proc"))
	if po.HostProcModules, err = plan.ReadHostProcModules(procfs); err != nil {
		return nil, err
	}
	if po.HostProcDevices, err = plan.ReadHostProcDevices(procfs); err != nil {
		return nil, err
	}
	switch opts.HostDevices {
	case "", HostDevicesNone:
	case HostDevicesMerge:
		devs, err := plan.ReadHostDevices(sysfs.(fs.ReadLinkFS))
		if err != nil {
			return nil, err
		}
		po.HostDevices = devs
	default:
		return nil, fmt.Errorf("host devices %q: want none or merge", opts.HostDevices)
	}
	if opts.Writable {
		po.Writable = true
		// A host without a PCI bus (a test sysfs) has no drivers to list.
		po.HostDrivers, _ = plan.ReadHostDrivers(sysfs)
	}
	pl := &Planner{machine: m, opts: po}
	if opts.Binary != "" {
		if pl.binary, err = binarySource(opts.Binary); err != nil {
			return nil, err
		}
	}
	return pl, nil
}

// Plan plans the tree showing ws, the state writes left (nil for none: the
// profile's tree). It reads nothing.
func (pl *Planner) Plan(ws plan.WrittenState) (*plan.Plan, error) {
	po := pl.opts
	po.Written = ws
	p, err := plan.New(pl.machine, po)
	if err != nil {
		return nil, err
	}
	if pl.binary != nil {
		// Last, in room the planner left: prepending would copy every entry.
		// The source is shared by every plan, and never written to.
		p.Entries = append(p.Entries,
			plan.Entry{Path: "bin", Kind: plan.Dir, Mode: 0o755},
			plan.Entry{Path: plan.BinaryFile, Kind: plan.File, Mode: 0o755, Source: pl.binary})
	}
	return p, nil
}

// binarySource describes the binary to install without reading it: a Go
// binary's build ID is a hash of its content, so it stands in for the 16
// MiB that a render would otherwise read and hash every time. A binary
// without one is hashed.
func binarySource(path string) (*plan.FileSource, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("binary to install: %w", err)
	}
	src := &plan.FileSource{Path: path, Size: info.Size()}
	if f, err := elf.Open(path); err == nil {
		defer f.Close()
		if sec := f.Section(".note.go.buildid"); sec != nil {
			if note, err := sec.Data(); err == nil && len(note) > 0 {
				src.Fingerprint = fmt.Sprintf("go-buildid:%x", note)
				return src, nil
			}
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("binary to install: %w", err)
	}
	src.Fingerprint = fmt.Sprintf("sha256:%x", sha256.Sum256(data))
	return src, nil
}

// Render plans the overlay and writes it into the root.
func Render(opts Options) (*plan.Plan, writer.Stats, error) {
	root := cmp.Or(opts.Root, DefaultRoot)
	if err := writer.CheckRoot(root); err != nil {
		return nil, writer.Stats{}, err
	}
	p, err := Plan(opts)
	if err != nil {
		return nil, writer.Stats{}, err
	}
	st, err := writer.Apply(root, p, opts.Writer)
	if err != nil {
		return p, st, fmt.Errorf("render into %s: %w", root, err)
	}
	return p, st, nil
}
