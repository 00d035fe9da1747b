package fidelity

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Status is what Check found for one attribute.
type Status string

const (
	Present   Status = "present"   // there, and as the kernel would write it
	Missing   Status = "missing"   // a real node shows it; this tree does not
	Different Status = "different" // there, but not what the kernel or profile says
)

// Expect is what the profile says a device shows. Check without it only
// checks formats and the files' agreement with each other.
type Expect struct {
	Vendor, Device                   uint16
	SubsystemVendor, SubsystemDevice uint16
	Class                            uint32
	Revision                         uint8
	NUMANode                         int
	Link                             profile.Link
	BARs                             []boards.BAR // nil: not checked
	Driver                           string
}

// ExpectFor is what a profile device must show. The driver is the one the
// profile binds the device to (a GPU on a passthrough node is on vfio-pci);
// a device built by hand without one gets its kind's default, as the
// profile's normaliser would give it.
func ExpectFor(d profile.Device) *Expect {
	e := &Expect{
		Vendor: d.Vendor, Device: d.DeviceID, SubsystemVendor: d.SubsystemVendor, SubsystemDevice: d.SubsystemDevice,
		Class: d.Class, Revision: d.Revision, NUMANode: d.NUMANode, Link: d.Link, Driver: d.Driver,
	}
	if d.Kind == profile.GPU {
		e.BARs = boards.BARs(d.Name, d.DeviceID, d.BAR1Bytes)
		e.Driver = cmp.Or(e.Driver, profile.DriverNVIDIA)
	} else {
		e.Driver = cmp.Or(e.Driver, profile.DriverNVSwitch)
	}
	return e
}

// Row is one attribute's finding.
type Row struct {
	Device    string        `json:"device"`
	Attribute string        `json:"attribute"`
	Kind      AttributeKind `json:"kind"`
	Need      Need          `json:"need"`
	Scope     Scope         `json:"scope"`
	Status    Status        `json:"status"`
	// Detail is the evidence: the value seen and what was expected.
	Detail string `json:"detail"`
}

// Failing reports whether the row should fail a check: anything present
// but wrong (a wrong or dangling entry misleads or breaks a consumer), and
// a consumer's attribute that is missing.
func (r Row) Failing() bool {
	return r.Status == Different || (r.Status == Missing && r.Need == Consumer)
}

// Check compares the device directory dir of fsys (for example
// bus/pci/devices/0000:18:00.0 of os.DirFS("/sys")) with Attributes().
func Check(fsys fs.FS, dir string, exp *Expect) []Row {
	return check(fsys, dir, exp, patterns{})
}

// check is Check with the run's compiled patterns, so a machine's devices
// compile each pattern once.
func check(fsys fs.FS, dir string, exp *Expect, compiled patterns) []Row {
	p := &probe{fsys: fsys, dir: dir, exp: exp, cache: map[string]string{}, patterns: compiled}
	var rows []Row
	for _, a := range Attributes() {
		r := Row{Device: path.Base(dir), Attribute: a.Name, Kind: a.Kind, Need: a.Need, Scope: a.Scope}
		r.Status, r.Detail = p.attribute(a)
		rows = append(rows, r)
	}
	return rows
}

type probe struct {
	fsys     fs.FS
	dir      string
	exp      *Expect
	cache    map[string]string
	patterns patterns
}

// patterns holds the regexps of one check run, compiled on first use.
type patterns map[string]*regexp.Regexp

// match reports whether s matches pattern, one of the fixed patterns of
// this file.
func (ps patterns) match(pattern, s string) bool {
	re, ok := ps[pattern]
	if !ok {
		re = regexp.MustCompile(pattern)
		ps[pattern] = re
	}
	return re.MatchString(s)
}

func (p *probe) attribute(a Attribute) (Status, string) {
	name := p.dir + "/" + a.Name
	info, err := fs.Lstat(p.fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return Missing, ""
	}
	if err != nil {
		return Different, err.Error()
	}
	var kind AttributeKind
	switch {
	case info.Mode()&fs.ModeSymlink != 0:
		kind = Link
	case info.IsDir():
		kind = Dir
	default:
		kind = File
	}
	if kind != a.Kind {
		return Different, fmt.Sprintf("a %s, want a %s", kind, a.Kind)
	}
	if a.check == nil {
		return Present, ""
	}
	return a.check(p)
}

// read returns a file's content, or the error that stops a reader.
func (p *probe) read(name string) (string, error) {
	if v, ok := p.cache[name]; ok {
		return v, nil
	}
	b, err := fs.ReadFile(p.fsys, p.dir+"/"+name)
	if err != nil {
		return "", err
	}
	p.cache[name] = string(b)
	return string(b), nil
}

// value is a one-line file without its newline.
func (p *probe) value(name string) (string, error) {
	s, err := p.read(name)
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(s, "\n") {
		return s, fmt.Errorf("%q has no trailing newline, as the kernel writes one", clip(s))
	}
	return strings.TrimSuffix(s, "\n"), nil
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func bad(format string, args ...any) (Status, string) { return Different, fmt.Sprintf(format, args...) }

func ok(format string, args ...any) (Status, string) { return Present, fmt.Sprintf(format, args...) }

func (p *probe) matching(name, pattern string) (string, Status, string) {
	v, err := p.value(name)
	if err != nil {
		s, d := bad("%v", err)
		return "", s, d
	}
	if !p.patterns.match(pattern, v) {
		s, d := bad("%q is not in the kernel's format %s", clip(v), pattern)
		return v, s, d
	}
	return v, Present, ""
}

// checkValue checks a one-line file against the kernel's format and, with a
// profile, against the value the profile gives (want spells it as the
// kernel does); differ says whose value it is in the detail.
func checkValue(name, pattern, differ string, want func(*Expect) string) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		v, st, d := p.matching(name, pattern)
		if st != Present {
			return st, d
		}
		if p.exp != nil && v != want(p.exp) {
			return bad("%s, %s %s", v, differ, want(p.exp))
		}
		return ok("%s", v)
	}
}

func checkID(name string, want func(*Expect) uint16) func(p *probe) (Status, string) {
	return checkValue(name, `^0x[0-9a-f]{4}$`, "profile says", func(e *Expect) string { return fmt.Sprintf("0x%04x", want(e)) })
}

func checkClass() func(p *probe) (Status, string) {
	return checkValue("class", `^0x[0-9a-f]{6}$`, "profile says", func(e *Expect) string { return fmt.Sprintf("0x%06x", e.Class) })
}

func checkRevision() func(p *probe) (Status, string) {
	return checkValue("revision", `^0x[0-9a-f]{2}$`, "want", func(e *Expect) string { return fmt.Sprintf("0x%02x", e.Revision) })
}

func checkNUMA() func(p *probe) (Status, string) {
	return checkValue("numa_node", `^(-1|[0-9]+)$`, "profile says", func(e *Expect) string { return strconv.Itoa(e.NUMANode) })
}

func checkDecimal(name string) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		v, st, d := p.matching(name, `^[0-9]+$`)
		if st != Present {
			return st, d
		}
		return ok("%s", v)
	}
}

func checkOneOf(name string, values ...string) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		v, err := p.value(name)
		if err != nil {
			return bad("%v", err)
		}
		if !slices.Contains(values, v) {
			return bad("%q, the kernel writes one of %s", clip(v), strings.Join(values, ", "))
		}
		return ok("%s", v)
	}
}

// bar is one resource line.
type bar struct{ start, end, flags uint64 }

func (b bar) size() uint64 {
	if b.start == 0 && b.end == 0 {
		return 0
	}
	return b.end - b.start + 1
}

func (p *probe) resources() ([]bar, error) {
	s, err := p.read("resource")
	if err != nil {
		return nil, err
	}
	var out []bar
	for i, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		f := strings.Split(line, " ")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d %q: go-nvlib wants exactly 3 space-separated fields", i, clip(line))
		}
		var v [3]uint64
		for j := range f {
			if !p.patterns.match(`^0x[0-9a-f]{16}$`, f[j]) {
				return nil, fmt.Errorf("line %d field %q is not the kernel's 0x%%016x", i, f[j])
			}
			v[j], _ = strconv.ParseUint(f[j], 0, 64)
		}
		if v[1] < v[0] {
			return nil, fmt.Errorf("line %d ends before it starts", i)
		}
		out = append(out, bar{v[0], v[1], v[2]})
	}
	return out, nil
}

func checkResource(p *probe) (Status, string) {
	bars, err := p.resources()
	if err != nil {
		return bad("%v", err)
	}
	// 7 lines (BARs and ROM), 13 with SR-IOV BARs (CONFIG_PCI_IOV);
	// bridges add four windows.
	if !slices.Contains([]int{7, 11, 13, 17}, len(bars)) {
		return bad("%d lines; the kernel prints 7 or 13 for a device, 11 or 17 for a bridge", len(bars))
	}
	var got []boards.BAR
	for i, b := range bars[:6] {
		if b.size() > 0 {
			got = append(got, boards.BAR{Index: i, Size: b.size(), Is64: b.flags&0x4 != 0, Prefetch: b.flags&0x2000 != 0})
		}
	}
	desc := describeBARs(got)
	if p.exp != nil && p.exp.BARs != nil && !slices.Equal(got, p.exp.BARs) {
		return bad("BARs %s, want %s", desc, describeBARs(p.exp.BARs))
	}
	return ok("%d lines, BARs %s", len(bars), desc)
}

func describeBARs(bars []boards.BAR) string {
	var parts []string
	for _, b := range bars {
		s := fmt.Sprintf("%d:%s", b.Index, ByteSize(b.Size, Short))
		if b.Is64 {
			s += " 64-bit"
		}
		if b.Prefetch {
			s += " pref"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// SizeStyle is how ByteSize spells a unit.
type SizeStyle int

const (
	// Short is lspci's "64G", down to K; a size of no whole unit is a bare
	// number.
	Short SizeStyle = iota
	// IEC is "64 GiB", down to MiB; a size of no whole unit is "N B".
	IEC
)

// ByteSize spells n in the largest binary unit that divides it.
func ByteSize(n uint64, style SizeStyle) string {
	for _, u := range []struct {
		short, iec string
		size       uint64
	}{{"T", "TiB", 1 << 40}, {"G", "GiB", 1 << 30}, {"M", "MiB", 1 << 20}, {"K", "", 1 << 10}} {
		if n < u.size || n%u.size != 0 {
			continue
		}
		switch {
		case style == Short:
			return fmt.Sprintf("%d%s", n/u.size, u.short)
		case u.iec != "":
			return fmt.Sprintf("%d %s", n/u.size, u.iec)
		}
	}
	if style == IEC {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprint(n)
}

func checkConfig(p *probe) (Status, string) {
	s, err := p.read("config")
	if err != nil {
		return bad("%v", err)
	}
	c := []byte(s)
	if len(c) < sysfs.ConfigSizePCI {
		return bad("%d bytes; the kernel shows at least %d (%d for PCIe)", len(c), sysfs.ConfigSizePCI, sysfs.ConfigSize)
	}
	le16 := func(off int) uint16 { return binary.LittleEndian.Uint16(c[off:]) }
	var problems []string
	for _, f := range []struct {
		name string
		off  int
	}{{"vendor", sysfs.ConfigVendorID}, {"device", sysfs.ConfigDeviceID}} {
		if v, err := p.value(f.name); err == nil && v != fmt.Sprintf("0x%04x", le16(f.off)) {
			problems = append(problems, fmt.Sprintf("%s 0x%04x differs from the %s file %s", f.name, le16(f.off), f.name, v))
		}
	}
	// The class code's three bytes: programming interface, sub-class, base.
	class := uint32(c[sysfs.ConfigClass+2])<<16 | uint32(c[sysfs.ConfigClass+1])<<8 | uint32(c[sysfs.ConfigClass])
	if v, err := p.value("class"); err == nil && v != fmt.Sprintf("0x%06x", class) {
		problems = append(problems, fmt.Sprintf("class 0x%06x differs from the class file %s", class, v))
	}
	if header := c[sysfs.ConfigHeaderType] & sysfs.HeaderTypeMask; header != sysfs.HeaderTypeEndpoint {
		problems = append(problems, fmt.Sprintf("header type %d, want %d for a GPU", header, sysfs.HeaderTypeEndpoint))
	}
	caps, pcie := capabilities(c)
	if p.exp != nil {
		switch {
		case len(c) != sysfs.ConfigSize:
			problems = append(problems, fmt.Sprintf("%d bytes, a PCIe function shows %d", len(c), sysfs.ConfigSize))
		case pcie == 0:
			problems = append(problems, "no PCI Express capability")
		default:
			lnkCap := binary.LittleEndian.Uint32(c[pcie+sysfs.PCIeLinkCap:])
			gen, width := sysfs.LinkSpeedGen(lnkCap), sysfs.LinkWidth(lnkCap)
			if gen != p.exp.Link.MaxGen || width != p.exp.Link.MaxWidth {
				problems = append(problems, fmt.Sprintf("LnkCap Gen%d x%d, profile says Gen%d x%d", gen, width, p.exp.Link.MaxGen, p.exp.Link.MaxWidth))
			}
		}
	}
	detail := fmt.Sprintf("%d bytes, capabilities %s", len(c), caps)
	if len(problems) > 0 {
		return bad("%s: %s", detail, strings.Join(problems, "; "))
	}
	return ok("%s", detail)
}

// capabilities walks the capability list and returns it as "PM@40 ..." and
// the offset of the PCI Express capability (0 if none).
func capabilities(c []byte) (string, int) {
	if binary.LittleEndian.Uint16(c[sysfs.ConfigStatus:])&sysfs.StatusCapList == 0 {
		return "none", 0
	}
	names := map[byte]string{sysfs.CapPM: "PM", sysfs.CapMSI: "MSI", sysfs.CapPCIe: "PCIe", sysfs.CapMSIX: "MSI-X", sysfs.CapVendor: "vendor", sysfs.CapSSVID: "SSVID"}
	var parts []string
	pcie := 0
	seen := map[int]bool{}
	for off := int(c[sysfs.ConfigCapPointer]) &^ 3; off >= sysfs.ConfigHeaderSize && off < sysfs.ConfigSizePCI && !seen[off]; off = int(c[off+1]) &^ 3 {
		seen[off] = true
		name, known := names[c[off]]
		if !known {
			name = fmt.Sprintf("%#02x", c[off])
		}
		if c[off] == sysfs.CapPCIe {
			pcie = off
		}
		parts = append(parts, fmt.Sprintf("%s@%02x", name, off))
	}
	return strings.Join(parts, " "), pcie
}

func checkModalias(p *probe) (Status, string) {
	v, st, d := p.matching("modalias", `^pci:v[0-9A-F]{8}d[0-9A-F]{8}sv[0-9A-F]{8}sd[0-9A-F]{8}bc[0-9A-F]{2}sc[0-9A-F]{2}i[0-9A-F]{2}$`)
	if st != Present {
		return st, d
	}
	var ids [5]uint64
	for i, f := range []struct {
		name string
		bits int
	}{{"vendor", 16}, {"device", 16}, {"subsystem_vendor", 16}, {"subsystem_device", 16}, {"class", 24}} {
		s, err := p.value(f.name)
		if err == nil {
			ids[i], err = strconv.ParseUint(s, 0, f.bits)
		}
		if err != nil {
			return ok("%s", v) // the id files' own rows report them
		}
	}
	want := sysfs.Modalias(uint16(ids[0]), uint16(ids[1]), uint16(ids[2]), uint16(ids[3]), uint32(ids[4]))
	if v != want {
		return bad("%s, the id files make %s", v, want)
	}
	return ok("%s", v)
}

func checkLocalCPUs(p *probe) (Status, string) {
	v, st, d := p.matching("local_cpus", `^[0-9a-f]{1,8}(,[0-9a-f]{8})*$`)
	if st != Present {
		return st, d
	}
	var cpus []int
	words := strings.Split(v, ",")
	for i, w := range words {
		n, _ := strconv.ParseUint(w, 16, 32)
		base := 32 * (len(words) - 1 - i)
		for b := 0; b < 32; b++ {
			if n&(1<<b) != 0 {
				cpus = append(cpus, base+b)
			}
		}
	}
	set := cpuset.New(cpus...)
	if list, err := p.value("local_cpulist"); err == nil {
		if l, err := cpuset.Parse(list); err == nil && !l.Equals(set) {
			return bad("%s is CPUs %s, local_cpulist says %s", v, set, list)
		}
	}
	return ok("%s (CPUs %s)", v, set)
}

func checkLocalCPUList(p *probe) (Status, string) {
	v, err := p.value("local_cpulist")
	if err != nil {
		return bad("%v", err)
	}
	if _, err := cpuset.Parse(v); err != nil || v == "" {
		return bad("%q is not a CPU list", clip(v))
	}
	return ok("%s", v)
}

func checkUevent(p *probe) (Status, string) {
	s, err := p.read("uevent")
	if err != nil {
		return bad("%v", err)
	}
	kv := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		k, v, found := strings.Cut(line, "=")
		if !found {
			return bad("line %q is not KEY=VALUE", clip(line))
		}
		kv[k] = v
	}
	var problems []string
	for _, k := range []string{"PCI_CLASS", "PCI_ID", "PCI_SUBSYS_ID", "PCI_SLOT_NAME", "MODALIAS"} {
		if _, found := kv[k]; !found {
			problems = append(problems, "no "+k)
		}
	}
	if slot := kv["PCI_SLOT_NAME"]; slot != "" && slot != path.Base(p.dir) {
		problems = append(problems, fmt.Sprintf("PCI_SLOT_NAME %s is not %s", slot, path.Base(p.dir)))
	}
	if m, err := p.value("modalias"); err == nil && kv["MODALIAS"] != "" && kv["MODALIAS"] != m {
		problems = append(problems, "MODALIAS differs from the modalias file")
	}
	if driver, err := fs.ReadLink(p.fsys, p.dir+"/driver"); err == nil && kv["DRIVER"] != path.Base(driver) {
		problems = append(problems, fmt.Sprintf("DRIVER=%s, the driver link names %s", kv["DRIVER"], path.Base(driver)))
	}
	if len(problems) > 0 {
		return bad("%s", strings.Join(problems, "; "))
	}
	return ok("%d keys", len(kv))
}

// depth is how many levels below sys/ the device's directory sits, from the
// links-directory entry's text as the kernel writes it; -1 if unknown.
func (p *probe) depth() int {
	dir := p.dir
	if t, err := fs.ReadLink(p.fsys, p.dir); err == nil {
		dir = path.Clean(path.Join(path.Dir(p.dir), t))
	}
	if !strings.HasPrefix(dir, "devices/") {
		return -1
	}
	return strings.Count(dir, "/") + 1
}

// link checks a link's text against the kernel's form and that it
// resolves, as go-nvlib's EvalSymlinks needs.
func (p *probe) link(name, pattern string) (string, Status, string) {
	t, err := fs.ReadLink(p.fsys, p.dir+"/"+name)
	if err != nil {
		s, d := bad("%v", err)
		return "", s, d
	}
	if !p.patterns.match(pattern, t) {
		s, d := bad("-> %s is not the kernel's form %s", t, pattern)
		return t, s, d
	}
	if d := p.depth(); d > 0 && strings.Count(t, "../") != d {
		s, det := bad("-> %s climbs %d levels from a directory %d below sys/", t, strings.Count(t, "../"), d)
		return t, s, det
	}
	if _, err := fs.Stat(p.fsys, p.dir+"/"+name); err != nil {
		s, d := bad("-> %s does not resolve: %v", t, err)
		return t, s, d
	}
	return t, Present, ""
}

func checkLinkTo(name, pattern string) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		t, st, d := p.link(name, pattern)
		if st != Present {
			return st, d
		}
		return ok("-> %s", t)
	}
}

func checkDriver(p *probe) (Status, string) {
	t, st, d := p.link("driver", `^(\.\./)+bus/pci/drivers/[^/]+$`)
	if st != Present {
		return st, d
	}
	if p.exp != nil && path.Base(t) != p.exp.Driver {
		return bad("-> %s, want driver %s", t, p.exp.Driver)
	}
	return ok("-> %s", t)
}

func checkIOMMUGroup(p *probe) (Status, string) {
	t, st, d := p.link("iommu_group", `^(\.\./)+kernel/iommu_groups/[0-9]+$`)
	if st != Present {
		return st, d
	}
	members := p.dir + "/iommu_group/devices/" + path.Base(p.dir)
	if _, err := fs.Stat(p.fsys, members); err != nil {
		return bad("-> %s, but the group's devices/ does not list %s", t, path.Base(p.dir))
	}
	return ok("-> %s", t)
}

func checkLinkSpeed(name string, current bool) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		v, err := p.value(name)
		if err != nil {
			return bad("%v", err)
		}
		gen, known := sysfs.LinkGen(v)
		if !known {
			return bad("%q is not a speed the kernel writes, such as %s", clip(v), sysfs.LinkSpeed(5))
		}
		if p.exp != nil {
			want := p.exp.Link.MaxGen
			if current {
				want = p.exp.Link.CurrentGen
			}
			if gen != want {
				return bad("%s (Gen%d), profile says Gen%d", v, gen, want)
			}
		}
		return ok("%s", v)
	}
}

// linkWidthPattern matches the widths a PCIe link can have:
// ^(1|2|4|8|12|16|32)$.
func linkWidthPattern() string {
	var ws []string
	for _, w := range sysfs.LinkWidths() {
		ws = append(ws, strconv.Itoa(w))
	}
	return "^(" + strings.Join(ws, "|") + ")$"
}

func checkLinkWidth(name string, current bool) func(p *probe) (Status, string) {
	return func(p *probe) (Status, string) {
		v, st, d := p.matching(name, linkWidthPattern())
		if st != Present {
			return st, d
		}
		if p.exp != nil {
			want := p.exp.Link.MaxWidth
			if current {
				want = p.exp.Link.CurrentWidth
			}
			if v != strconv.Itoa(want) {
				return bad("x%s, profile says x%d", v, want)
			}
		}
		return ok("x%s", v)
	}
}
