// Package pciaddr parses and formats PCI addresses the way sysfs names them.
//
// The kernel names every PCI device in /sys/bus/pci/devices by a lower-case
// "dddd:bb:dd.f" address, and every host bridge directory under /sys/devices
// by "pcidddd:bb". Consumers such as libpci and deviceattribute treat any other
// spelling as fatal, so every address that reaches the rendered tree goes
// through this package.
package pciaddr

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ParseError says why a string is not an address or root complex id.
type ParseError struct {
	Input string
	Want  string // what was expected, e.g. "a PCI address (DDDD:BB:DD.F ...)"
	Why   string
}

func (e *ParseError) Error() string { return fmt.Sprintf("%q %s", e.Input, e.Reason()) }

// Reason is the message without the input, for callers that name it already.
func (e *ParseError) Reason() string { return fmt.Sprintf("is not %s: %s", e.Want, e.Why) }

// Reason is err's message without the input when err can say why without
// it (a ParseError, or any error with a Reason method, such as
// boards.UnknownHCAError), for callers whose own error names the value
// already.
func Reason(err error) string {
	var r interface{ Reason() string }
	if errors.As(err, &r) {
		return r.Reason()
	}
	return err.Error()
}

// Address is a PCI function address: domain, bus, device and function.
type Address struct {
	Domain   uint16
	Bus      uint8
	Device   uint8 // 0..31
	Function uint8 // 0..7
}

// Parse accepts "DDDD:BB:DD.F" or NVML's 8-digit-domain form
// "0000DDDD:BB:DD.F", in either case, and nothing else.
func Parse(s string) (Address, error) {
	bad := func(why string) (Address, error) {
		return Address{}, &ParseError{Input: s, Want: "a PCI address (DDDD:BB:DD.F or 0000DDDD:BB:DD.F)", Why: why}
	}
	domain, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("no domain")
	}
	switch len(domain) {
	case 4:
	case 8:
		if domain[:4] != "0000" {
			return bad("an 8-digit domain must start with 0000")
		}
		domain = domain[4:]
	default:
		return bad("the domain has 4 or 8 hex digits")
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok || len(bus) != 2 {
		return bad("the bus has 2 hex digits")
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok || len(dev) != 2 || len(fn) != 1 {
		return bad("want DD.F after the bus")
	}
	var a Address
	d, err := parseHex(domain, 16)
	if err != nil {
		return bad("domain: " + err.Error())
	}
	b, err := parseHex(bus, 8)
	if err != nil {
		return bad("bus: " + err.Error())
	}
	v, err := parseHex(dev, 8)
	if err != nil || v > 0x1f {
		return bad("the device number is 00..1f")
	}
	f, err := parseHex(fn, 8)
	if err != nil || f > 7 {
		return bad("the function number is 0..7")
	}
	a.Domain, a.Bus, a.Device, a.Function = uint16(d), uint8(b), uint8(v), uint8(f)
	return a, nil
}

// parseHex parses only hex digits: strconv alone would accept a sign or "0x".
func parseHex(s string, bits int) (uint64, error) {
	if strings.ContainsFunc(s, func(c rune) bool { return !isHexDigit(c) }) {
		return 0, fmt.Errorf("%q is not hex", s)
	}
	return strconv.ParseUint(s, 16, bits)
}

func isHexDigit(c rune) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
}

// String gives the sysfs spelling, "dddd:bb:dd.f".
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// DevFn is the device and function packed as in config space and the kernel.
func (a Address) DevFn() uint8 { return a.Device<<3 | a.Function }

// RootComplex returns the host bridge that has this address's bus as its root bus.
func (a Address) RootComplex() RootComplex { return RootComplex{Domain: a.Domain, Bus: a.Bus} }

// Compare orders addresses numerically, as lspci and go-nvlib sort them.
func (a Address) Compare(b Address) int { return cmp.Compare(a.Key(), b.Key()) }

// Key is a number that sorts like the address.
func (a Address) Key() uint32 {
	return uint32(a.Domain)<<16 | uint32(a.Bus)<<8 | uint32(a.DevFn())
}

// RootComplex names a PCI host bridge: the directory /sys/devices/pciDDDD:BB.
type RootComplex struct {
	Domain uint16
	Bus    uint8
}

// ParseRootComplex accepts "pciDDDD:BB" in either case.
func ParseRootComplex(s string) (RootComplex, error) {
	bad := func() (RootComplex, error) {
		return RootComplex{}, &ParseError{Input: s, Want: "a root complex id", Why: "want pciDDDD:BB, as in /sys/devices"}
	}
	if len(s) != len("pci0000:00") || !strings.EqualFold(s[:3], "pci") || s[7] != ':' {
		return bad()
	}
	d, err := parseHex(s[3:7], 16)
	if err != nil {
		return bad()
	}
	b, err := parseHex(s[8:], 8)
	if err != nil {
		return bad()
	}
	return RootComplex{Domain: uint16(d), Bus: uint8(b)}, nil
}

// String gives the sysfs directory name, "pcidddd:bb".
func (r RootComplex) String() string { return fmt.Sprintf("pci%04x:%02x", r.Domain, r.Bus) }

// Compare orders root complexes by domain, then root bus.
func (r RootComplex) Compare(o RootComplex) int {
	return cmp.Compare(uint32(r.Domain)<<8|uint32(r.Bus), uint32(o.Domain)<<8|uint32(o.Bus))
}

// IsBDF reports whether name is exactly a lower-case sysfs PCI address, the
// only kind of name libpci and ghw accept in /sys/bus/pci/devices.
func IsBDF(name string) bool {
	a, err := Parse(name)
	return err == nil && a.String() == name
}

// LastBus is the last bus rc owns: a root complex owns its root bus and
// every bus up to the next root complex of its domain, or to ff when none
// follows, as the kernel assigns a host bridge's bus range. rcs need not be
// sorted; rc need not be in it.
//
// This is the one place the bus range is computed: the planner, the
// profile and import checks, and plancheck all ask it.
func LastBus(rcs []RootComplex, rc RootComplex) uint8 {
	last := uint8(0xff)
	for _, o := range rcs {
		if o.Domain == rc.Domain && o.Bus > rc.Bus {
			last = min(last, o.Bus-1)
		}
	}
	return last
}

// Covering finds the root complex whose bus range holds a: the one of a's
// domain with the highest root bus at or below a's bus, as the kernel
// finds a device's host bridge.
func Covering(rcs []RootComplex, a Address) (RootComplex, bool) {
	for _, rc := range rcs {
		if rc.Domain == a.Domain && rc.Bus <= a.Bus && a.Bus <= LastBus(rcs, rc) {
			return rc, true
		}
	}
	return RootComplex{}, false
}
