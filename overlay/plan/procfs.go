package plan

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// Paths of the /proc files a node with this profile has, rendered beside
// the module view for a createContainer hook to bind-mount over the
// container's /proc (runc refuses mounts inside /proc; the hook is
// deploy/prochook, docs/design/prochook.md). ValidateContainerRoot keeps the
// container root out of proc/, so nothing else of the overlay lands here.
const (
	// ProcDir is the overlay's stand-in for /proc.
	ProcDir = "proc"
	// ProcModulesFile is /proc/modules: the node's own lines, then ours.
	ProcModulesFile = ProcDir + "/modules"
	// NVIDIAVersionFile is /proc/driver/nvidia/version.
	NVIDIAVersionFile = ProcDir + "/driver/nvidia/version"
	// HostProcModules is the node's /proc/modules, relative to its procfs.
	HostProcModules = "modules"
)

// What a real driver prints in /proc/driver/nvidia/version beside the
// version, which no profile states: stand-ins of the driver's own form
// (the build date, date(1)'s, and the compiler's --version line).
const (
	nvidiaBuildDate = "Tue Oct 14 22:38:19 UTC 2025"
	nvidiaGCC       = "gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)"
)

// procAddress is a module's load address as /proc/modules shows it to a
// reader without CAP_SYSLOG (kptr_restrict): zeros.
const procAddress = "0x0000000000000000"

// ProcModulesLine is m's /proc/modules line, in the kernel's format
// (kernel/module/procfs.c): name, size, refcnt, each holder followed by a
// comma or "-" for none, state, address, and the taint flags in
// parentheses where it has some. The refcnt and holders are the module
// view's (KernelModule.Refcnt, Holders), so the two never disagree.
func ProcModulesLine(m KernelModule, loaded []KernelModule) string {
	deps := "-"
	if holders := m.Holders(loaded); len(holders) > 0 {
		deps = strings.Join(holders, ",") + ","
	}
	line := fmt.Sprintf("%s %d %d %s Live %s", m.Name, m.Size, m.Refcnt(loaded), deps, procAddress)
	if m.Taint != "" {
		line += " (" + m.Taint + ")"
	}
	return line
}

// procModulesName checks a node's /proc/modules line as far as a reader
// of ours (lsmod, grep '^nvidia ') depends on it, and returns its name:
// the module name, a decimal size, a refcnt ("-" without module unload),
// the holders, the state and the address.
func procModulesName(line string) (string, error) {
	f := strings.Fields(line)
	bad := func(field, value, want string) error {
		return fmt.Errorf("node /proc/modules: line %q: %s: value %q: %s", line, field, value, want)
	}
	if len(f) < 6 {
		return "", bad("fields", strconv.Itoa(len(f)), "want at least name, size, refcnt, holders, state and address")
	}
	if err := CheckModuleName(f[0]); err != nil {
		return "", bad("name", f[0], "not a module name (letters, digits, '_', '-' and '.')")
	}
	if _, err := strconv.ParseUint(f[1], 10, 64); err != nil {
		return "", bad("size", f[1], "want a decimal number")
	}
	if _, err := strconv.ParseUint(f[2], 10, 32); err != nil && f[2] != "-" {
		return "", bad("refcnt", f[2], "want a decimal number or -")
	}
	return f[0], nil
}

// ReadHostProcModules reads the node's own /proc/modules lines from its
// procfs, each checked. A kernel built without loadable modules (this
// project's machines) has no such file: then none.
func ReadHostProcModules(proc fs.FS) ([]string, error) {
	data, err := fs.ReadFile(proc, HostProcModules)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read node /proc/modules: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if _, err := procModulesName(sc.Text()); err != nil {
			return nil, err
		}
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read node /proc/modules: %w", err)
	}
	return out, nil
}

// procFiles plans the /proc files: proc/modules with the node's lines
// first and then ours, proc/devices with the node's majors and the NVIDIA
// modules', and the NVIDIA driver's version and its GPUs' information
// where the view loads nvidia.
func (b *builder) procFiles() error {
	var buf strings.Builder
	for _, line := range b.opts.HostProcModules {
		name, err := procModulesName(line)
		if err != nil {
			return err
		}
		// A node module of one of our names (a real nvidia on a GPU node
		// that also serves mock GPUs) is ours here, as in the module view:
		// its refcnt and holders must be the view's.
		if !b.ours(name) {
			buf.WriteString(line + "\n")
		}
	}
	for _, m := range b.loaded {
		buf.WriteString(ProcModulesLine(m, b.loaded) + "\n")
	}
	b.dir(ProcDir)
	b.text(ProcDir, path.Base(ProcModulesFile), buf.String())
	devices, err := b.procDevices()
	if err != nil {
		return err
	}
	b.text(ProcDir, path.Base(ProcDevicesFile), devices.Text())
	if !b.ours("nvidia") {
		// A passthrough node with no GPU on nvidia has no driver loaded,
		// so no /proc/driver/nvidia.
		return nil
	}
	dir := path.Dir(NVIDIAVersionFile)
	b.dir(dir)
	b.text(dir, path.Base(NVIDIAVersionFile), NVIDIAVersionText(b.machine.NVIDIAVersion()))
	b.gpuInformation()
	return nil
}

// NVIDIAVersionText is /proc/driver/nvidia/version for the proprietary
// module of version v, the version the module view's version files hold.
func NVIDIAVersionText(v string) string {
	return fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  %s\nGCC version:  %s\n", v, nvidiaBuildDate, nvidiaGCC)
}
