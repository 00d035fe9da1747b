package plan

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// Paths of /proc/devices, rendered and read.
const (
	// ProcDevicesFile is /proc/devices: the node's majors, and the NVIDIA
	// driver's where the module view loads it.
	ProcDevicesFile = ProcDir + "/devices"
	// HostProcDevices is the node's /proc/devices, relative to its procfs.
	HostProcDevices = "devices"
)

// The section headers of /proc/devices (fs/proc/devices.c).
const (
	charDevicesHeader  = "Character devices:"
	blockDevicesHeader = "Block devices:"
)

// The kernel's majors (include/linux/fs.h, fs/char_dev.c): a character
// or block major is below 512, and a dynamic character major is the first
// free one from 254 down to 234, then from 511 down to 384.
const (
	maxMajor         = 511
	dynMajorStart    = 254
	dynMajorEnd      = 234
	dynMajorExtStart = 511
	dynMajorExtEnd   = 384
	// majorHashSize is the size of the kernel's chrdevs table: a major of
	// the first range is free only where no major of its slot (major %
	// 255) is taken, the one above 255 included.
	majorHashSize = 255
)

// nvidiaMajor is the NVIDIA driver's fixed major (nv-chardev-numbers.h),
// of /dev/nvidia<N>, nvidiactl and nvidia-modeset.
const nvidiaMajor = 195

// DeviceMajor is a line of /proc/devices: a major and the name its
// driver registered it under.
type DeviceMajor struct {
	Major int
	Name  string
}

// String is the line as the kernel prints it ("%3d %s").
func (d DeviceMajor) String() string { return fmt.Sprintf("%3d %s", d.Major, d.Name) }

// ProcDevices is /proc/devices: its character and block majors, each in
// the kernel's order (by major).
type ProcDevices struct {
	Char, Block []DeviceMajor
}

// Text is p as the kernel prints it.
func (p ProcDevices) Text() string {
	var buf strings.Builder
	for i, section := range []struct {
		header string
		lines  []DeviceMajor
	}{{charDevicesHeader, p.Char}, {blockDevicesHeader, p.Block}} {
		if i > 0 {
			buf.WriteString("\n")
		}
		buf.WriteString(section.header + "\n")
		for _, d := range section.lines {
			buf.WriteString(d.String() + "\n")
		}
	}
	return buf.String()
}

// checkDeviceMajor checks a node's /proc/devices line as far as a reader
// of ours (nvidia-container-toolkit's "%d %s") depends on it: a major the
// kernel can list, and a name.
func checkDeviceMajor(line string, d DeviceMajor) error {
	bad := func(field, value, want string) error {
		return fmt.Errorf("node /proc/devices: line %q: %s: value %q: %s", line, field, value, want)
	}
	if d.Major < 0 || d.Major > maxMajor {
		return bad("major", strconv.Itoa(d.Major), "want a decimal number 0..511")
	}
	if d.Name == "" || strings.ContainsFunc(d.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return bad("name", d.Name, "want one name without spaces or control characters")
	}
	return nil
}

// ReadHostProcDevices reads the node's own /proc/devices from its procfs,
// each line checked. A procfs without one (a test's) has none.
func ReadHostProcDevices(proc fs.FS) (ProcDevices, error) {
	var out ProcDevices
	data, err := fs.ReadFile(proc, HostProcDevices)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read node /proc/devices: %w", err)
	}
	var section *[]DeviceMajor
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch line {
		case charDevicesHeader:
			section = &out.Char
			continue
		case blockDevicesHeader:
			section = &out.Block
			continue
		case "":
			continue
		}
		f := strings.Fields(line)
		if section == nil || len(f) != 2 {
			return out, fmt.Errorf("node /proc/devices: line %q: fields: value %q: want \"<major> <name>\" below %q or %q", line, strconv.Itoa(len(f)), charDevicesHeader, blockDevicesHeader)
		}
		major, err := strconv.Atoi(f[0])
		if err != nil {
			return out, fmt.Errorf("node /proc/devices: line %q: major: value %q: want a decimal number 0..511", line, f[0])
		}
		d := DeviceMajor{Major: major, Name: f[1]}
		if err := checkDeviceMajor(line, d); err != nil {
			return out, err
		}
		*section = append(*section, d)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read node /proc/devices: %w", err)
	}
	return out, nil
}

// nvidiaChrdev is a character device region an NVIDIA module registers:
// at nvidiaMajor, or at a dynamic major (Major 0) the kernel picks.
type nvidiaChrdev struct {
	Module string
	DeviceMajor
}

// nvidiaChrdevs are the regions the NVIDIA modules register, in the order
// they register them, for driver version v. nvidia.ko registers
// nvidia-caps, nvidia-nvlink and nvidia-nvswitch whatever the node has
// (an RTX 5060 desktop lists all three, as an 8-GPU node does), and from
// the 550 branch nvidia-caps-imex-channels; nvidia_uvm registers nvidia-uvm
// when it loads, after nvidia. The order is the one real nodes' dynamic
// majors show (the first registered gets the highest): imex-channels,
// caps, nvlink, nvswitch, then uvm. From 550.40 the fixed major's regions
// are "nvidia" (the GPUs), "nvidia-modeset" and "nvidiactl" (NVIDIA's
// release notes; nvidia-container-toolkit #324); before, one
// "nvidia-frontend", which nvidia-container-toolkit still falls back to.
func nvidiaChrdevs(v string) []nvidiaChrdev {
	fixed := func(module, name string) nvidiaChrdev { return nvidiaChrdev{module, DeviceMajor{nvidiaMajor, name}} }
	dynamic := func(module, name string) nvidiaChrdev { return nvidiaChrdev{module, DeviceMajor{0, name}} }
	if !driverAtLeast(v, 550, 40) {
		return []nvidiaChrdev{
			fixed("nvidia", "nvidia-frontend"),
			dynamic("nvidia", "nvidia-caps"), dynamic("nvidia", "nvidia-nvlink"), dynamic("nvidia", "nvidia-nvswitch"),
			dynamic("nvidia_uvm", "nvidia-uvm"),
		}
	}
	return []nvidiaChrdev{
		fixed("nvidia", "nvidia"), fixed("nvidia_modeset", "nvidia-modeset"), fixed("nvidia", "nvidiactl"),
		dynamic("nvidia", "nvidia-caps-imex-channels"), dynamic("nvidia", "nvidia-caps"),
		dynamic("nvidia", "nvidia-nvlink"), dynamic("nvidia", "nvidia-nvswitch"),
		dynamic("nvidia_uvm", "nvidia-uvm"),
	}
}

// driverAtLeast says whether driver version v (550.163.01) is major.minor
// or later. A version that does not read so (a profile's own spelling) is
// taken as a current one.
func driverAtLeast(v string, major, minor int) bool {
	f := strings.SplitN(v, ".", 3)
	ma, errMa := strconv.Atoi(f[0])
	mi, errMi := 0, error(nil)
	if len(f) > 1 {
		mi, errMi = strconv.Atoi(f[1])
	}
	if errMa != nil || errMi != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}

// dynamicMajor is the major the kernel gives a region registered with
// none (fs/char_dev.c, find_dynamic_major), taken the majors taken: the
// first free one from 254 down to 234 whose slot no major shares, then
// the first free one from 511 down to 384.
func dynamicMajor(taken map[int]bool) (int, bool) {
	for m := dynMajorStart; m >= dynMajorEnd; m-- {
		if !taken[m] && !taken[m+majorHashSize] {
			return m, true
		}
	}
	for m := dynMajorExtStart; m >= dynMajorExtEnd; m-- {
		if !taken[m] {
			return m, true
		}
	}
	return 0, false
}

// procDevices is /proc/devices on a node whose module view loads ours:
// the node's lines, and the character regions of the NVIDIA modules the
// view loads, each dynamic one at the major the kernel would give it
// beside the node's. A node line of one of our names or at our fixed
// major (a real NVIDIA driver's on a node that also serves mock GPUs)
// gives way to ours, as its modules do in the module view: the majors a
// reader takes must be the ones ours are listed at.
func (b *builder) procDevices() (ProcDevices, error) {
	node := b.opts.HostProcDevices
	for _, section := range [][]DeviceMajor{node.Char, node.Block} {
		for _, d := range section {
			if err := checkDeviceMajor(d.String(), d); err != nil {
				return ProcDevices{}, err
			}
		}
	}
	var ours []DeviceMajor
	for _, c := range nvidiaChrdevs(b.machine.NVIDIAVersion()) {
		if b.ours(c.Module) {
			ours = append(ours, c.DeviceMajor)
		}
	}
	out := ProcDevices{Block: node.Block}
	taken := map[int]bool{}
	for _, d := range node.Char {
		if slices.ContainsFunc(ours, func(o DeviceMajor) bool { return o.Name == d.Name || o.Major != 0 && o.Major == d.Major }) {
			continue
		}
		out.Char = append(out.Char, d)
		taken[d.Major] = true
	}
	for i, o := range ours {
		if o.Major != 0 {
			continue
		}
		m, ok := dynamicMajor(taken)
		if !ok {
			return ProcDevices{}, fmt.Errorf("node /proc/devices: majors: value %q: no dynamic character major left for %s", strconv.Itoa(len(taken)), o.Name)
		}
		ours[i].Major, taken[m] = m, true
	}
	// The kernel lists by major, and a major's regions by first minor,
	// which is the order ours are registered in.
	out.Char = append(out.Char, ours...)
	slices.SortStableFunc(out.Char, func(x, y DeviceMajor) int { return x.Major - y.Major })
	return out, nil
}
