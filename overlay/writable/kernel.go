// Package writable gives a rendered tree the kernel's answers to writes:
// driver_override, a driver's bind and unbind, the bus's drivers_probe and
// a physical function's sriov_numvfs act as drivers/base and drivers/pci
// make them act, with the kernel's errno for every refusal.
//
// A write never edits the tree. It moves the written state
// (plan.WrittenState) from one value to the next (Apply, a pure function
// of the plan and the state), and the tree is planned and written again
// from the machine and that state, through the same planner and writer a
// render uses. So a restart, a re-render and a write cannot disagree about
// what the tree shows; the state file is the only thing a write adds.
//
// This package is the pure part: which attribute a path is (Classify), the
// step (Apply), the state file's name and form, and what a new plan does
// to a state (Prune). It reads and writes nothing. The controller that
// holds a tree's state, plans and writes it after each write(2), and
// answers the FUSE view is serve's (deploy/serve, writabletree.go);
// docs/design/writable.md tells the whole design.
package writable

import (
	"bytes"
	"cmp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// AttrKind is which writable attribute a write goes to.
type AttrKind int

const (
	DriverOverride AttrKind = iota + 1 // <device>/driver_override
	SRIOVNumVFs                        // <device>/sriov_numvfs
	Bind                               // drivers/<driver>/bind
	Unbind                             // drivers/<driver>/unbind
	DriversProbe                       // bus/pci/drivers_probe
)

// Attr is a writable attribute of a planned tree.
type Attr struct {
	Kind     AttrKind
	Function pciaddr.Address // the device's, for DriverOverride and SRIOVNumVFs
	Driver   string          // the driver's, for Bind and Unbind
}

// The file names of the writable attributes (and drivers_probe's,
// plan.DriversProbe).
const (
	nameOverride = "driver_override"
	nameNumVFs   = "sriov_numvfs"
	nameBind     = "bind"
	nameUnbind   = "unbind"
)

// AttributeName reports whether rel's file name is one a writable
// attribute has: a check of the name alone, which most files fail.
func AttributeName(rel string) bool {
	_, name := splitLast(rel)
	switch name {
	case nameOverride, nameNumVFs, nameBind, nameUnbind:
		return true
	}
	return rel == plan.DriversProbe
}

// maxOverride is the longest driver_override the kernel takes: it refuses
// a write of a page less one (driver_set_override, drivers/base/driver.c).
const maxOverride = 4096 - 1

// Classify says which writable attribute rel (a path relative to the tree's
// root, as the FUSE server sees it after the kernel followed every link) is,
// if any: only the attributes of the planned functions and of the mock
// drivers are, so no write can name the node's own devices or drivers.
func Classify(p *plan.Plan, rel string) (Attr, bool) {
	if rel == plan.DriversProbe {
		return Attr{Kind: DriversProbe}, true
	}
	dir, name := splitLast(rel)
	if drivers, driver := splitLast(dir); drivers == plan.DriversDir && plan.IsMockDriver(driver) {
		switch name {
		case nameBind:
			return Attr{Kind: Bind, Driver: driver}, true
		case nameUnbind:
			return Attr{Kind: Unbind, Driver: driver}, true
		}
		return Attr{}, false
	}
	_, bdf := splitLast(dir)
	a, err := pciaddr.Parse(bdf)
	if err != nil {
		return Attr{}, false
	}
	f, ok := p.Functions[a]
	if !ok || f.Dir != dir {
		return Attr{}, false
	}
	switch {
	case name == nameOverride:
		return Attr{Kind: DriverOverride, Function: a}, true
	case name == nameNumVFs && f.TotalVFs > 0:
		return Attr{Kind: SRIOVNumVFs, Function: a}, true
	}
	return Attr{}, false
}

func splitLast(p string) (string, string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// Apply is the kernel's answer to one write(2) of data to a: the state the
// tree moves to, or the errno the writer gets (and the state unchanged).
// ws is never modified.
func Apply(p *plan.Plan, ws plan.WrittenState, a Attr, data []byte) (plan.WrittenState, syscall.Errno) {
	next := transition{plan: p, ws: clone(ws)}
	var errno syscall.Errno
	switch a.Kind {
	case DriverOverride:
		errno = next.setOverride(a.Function, data)
	case SRIOVNumVFs:
		errno = next.setNumVFs(a.Function, data)
	case Bind:
		errno = next.bind(a.Driver, data)
	case Unbind:
		errno = next.unbind(a.Driver, data)
	case DriversProbe:
		errno = next.probe(data)
	default:
		errno = syscall.EINVAL
	}
	if errno != 0 {
		return ws, errno
	}
	return next.ws, 0
}

// transition is a runtime state being moved by one write, with the plan
// that shows the state before it.
type transition struct {
	plan *plan.Plan
	ws   plan.WrittenState
}

func clone(ws plan.WrittenState) plan.WrittenState {
	out := make(plan.WrittenState, len(ws))
	for a, s := range ws {
		out[a] = s
	}
	return out
}

// current is what function a shows now.
func (s *transition) current(a pciaddr.Address) plan.FunctionState {
	if st, ok := s.ws[a]; ok {
		return st
	}
	return s.plan.Functions[a].State
}

// lookup finds the function a bind, unbind or drivers_probe names: the
// kernel compares the written name with each device's name, a trailing
// newline ignored (sysfs_streq), and answers ENODEV for no match.
func (s *transition) lookup(data []byte) (*plan.Function, syscall.Errno) {
	name := string(bytes.TrimSuffix(data, []byte("\n")))
	a, err := pciaddr.Parse(name)
	if err != nil || a.String() != name {
		return nil, syscall.ENODEV
	}
	f, ok := s.plan.Functions[a]
	if !ok {
		return nil, syscall.ENODEV
	}
	return f, 0
}

// setOverride is driver_set_override: the string up to its first NUL
// (strlen: "python likes to" send them, says the kernel), then up to its
// first newline; empty clears it. One deviation: text that is not UTF-8 is
// refused (EINVAL), where the kernel keeps the bytes, since the state file
// is JSON and would not give them back. A driver's name is ASCII, so such
// an override could match no driver anyway.
func (s *transition) setOverride(a pciaddr.Address, data []byte) syscall.Errno {
	if len(data) >= maxOverride {
		return syscall.EINVAL
	}
	v, _, _ := bytes.Cut(data, []byte{0})
	v, _, _ = bytes.Cut(v, []byte("\n"))
	if !utf8.Valid(v) {
		return syscall.EINVAL
	}
	st := s.current(a)
	st.Override = string(v)
	s.ws[a] = st
	return 0
}

// matches is pci_bus_match: a driver_override matches only the driver it
// names; without one, a driver matches the functions its id table claims
// (vfio-pci's is empty: it binds through driver_override alone).
func matches(f *plan.Function, st plan.FunctionState, driver string) bool {
	if st.Override != "" {
		return st.Override == driver
	}
	return f.Native == driver
}

// bind is bind_store: ENODEV for a name no function has or a driver that
// does not match it, EBUSY for a function already bound.
func (s *transition) bind(driver string, data []byte) syscall.Errno {
	f, errno := s.lookup(data)
	if errno != 0 {
		return errno
	}
	st := s.current(f.Address)
	if !matches(f, st, driver) {
		return syscall.ENODEV
	}
	if st.Driver != "" {
		return syscall.EBUSY
	}
	s.attach(f.Address, st, driver)
	return 0
}

func (s *transition) attach(a pciaddr.Address, st plan.FunctionState, driver string) {
	st.Driver, st.VFIODev = driver, 0
	if driver == profile.DriverVFIO {
		st.VFIODev = s.freeVFIODev()
	}
	s.ws[a] = st
}

// freeVFIODev is the lowest vfio device number no bound function holds:
// the kernel allocates them from an IDA.
func (s *transition) freeVFIODev() int {
	used := map[int]bool{}
	for a := range s.plan.Functions {
		if st := s.current(a); st.Driver == profile.DriverVFIO {
			used[st.VFIODev] = true
		}
	}
	n := 0
	for used[n] {
		n++
	}
	return n
}

// unbind is unbind_store: ENODEV unless the function is bound to this
// driver. A physical function's driver disables its virtual functions as
// it goes (mlx5's remove does), so they vanish with their state.
func (s *transition) unbind(driver string, data []byte) syscall.Errno {
	f, errno := s.lookup(data)
	if errno != 0 {
		return errno
	}
	st := s.current(f.Address)
	if st.Driver != driver {
		return syscall.ENODEV
	}
	st.Driver, st.VFIODev = "", 0
	s.disableVFs(f, &st)
	s.ws[f.Address] = st
	return 0
}

func (s *transition) disableVFs(f *plan.Function, st *plan.FunctionState) {
	for _, vf := range f.VFs[:st.NumVFs] {
		delete(s.ws, vf)
	}
	st.NumVFs = 0
}

// probe is drivers_probe_store: ENODEV for an unknown name; an unbound
// function is bound to its driver_override's driver, or to the driver
// that claims it, when the tree lists that driver; anything else succeeds
// and changes nothing, as the kernel's device_attach does.
func (s *transition) probe(data []byte) syscall.Errno {
	f, errno := s.lookup(data)
	if errno != 0 {
		return errno
	}
	st := s.current(f.Address)
	if st.Driver != "" {
		return 0
	}
	driver := cmp.Or(st.Override, f.Native)
	// Only a driver the tree lists binds: mlx5_core is not loaded on a
	// node without HCAs.
	if plan.IsMockDriver(driver) && slices.Contains(s.plan.Drivers, driver) {
		s.attach(f.Address, st, driver)
	}
	return 0
}

// setNumVFs is sriov_numvfs_store: EINVAL for what kstrtou16 refuses,
// ERANGE above sriov_totalvfs, ENOENT with no driver bound, EBUSY for N
// to M without 0 between; 0 disables them all, and equal is a no-op.
func (s *transition) setNumVFs(a pciaddr.Address, data []byte) syscall.Errno {
	f := s.plan.Functions[a]
	n, ok := kstrtou16(data)
	if !ok {
		return syscall.EINVAL
	}
	if int(n) > f.TotalVFs {
		return syscall.ERANGE
	}
	st := s.current(a)
	switch {
	case int(n) == st.NumVFs:
		return 0
	case st.Driver == "":
		return syscall.ENOENT
	case n == 0:
		s.disableVFs(f, &st)
	case st.NumVFs > 0:
		return syscall.EBUSY
	default:
		st.NumVFs = int(n)
	}
	s.ws[a] = st
	return 0
}

// kstrtou16 parses as the kernel's kstrtou16 with base 0 does: an optional
// "+", then hex after "0x", octal after "0", else decimal, then at most one
// newline. strconv's base 0 also takes "0b", "0o" and underscores, which
// the kernel refuses.
func kstrtou16(data []byte) (uint64, bool) {
	s := strings.TrimPrefix(strings.TrimSuffix(string(data), "\n"), "+")
	base := 10
	switch {
	case len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) > 1 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" || s[0] == '+' || s[0] == '-' || strings.Contains(s, "_") {
		return 0, false
	}
	n, err := strconv.ParseUint(s, base, 16)
	return n, err == nil
}
