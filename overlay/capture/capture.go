// Package capture turns what real GPU nodes report into nvml-mock profiles.
//
// The one format today is `nvidia-smi -q -x`: ParseNvidiaSMI reads the PCI
// facts of every GPU (bus id, device and subsystem ids, class, BAR1 size,
// link generation and width, product name) and Capture.Profile writes them
// as a profile that renders back to exactly those facts. nvidia-smi does not
// show root complexes or NUMA nodes; Options say how to fill them in.
//
// Parsing is pure: it reads an io.Reader and never touches the filesystem.
package capture

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// MaxCaptureSize bounds the capture read: a real 8-GPU capture is about
// 200 KiB, so 64 MiB covers hundreds of GPUs and keeps a hostile file cheap.
const MaxCaptureSize = 64 << 20

// Error refuses a capture. It names the source, the GPU and field, and the
// value on one line.
type Error struct {
	Source string // the capture's file name
	Field  string // e.g. gpu[2] (00000000:3F:00.0).pci.pci_device_id
	Value  string
	Err    error
}

func (e *Error) Error() string {
	return profile.Refusal("nvidia-smi capture", e.Source, e.Field, e.Value, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Capture is the PCI part of an nvidia-smi -q -x log.
type Capture struct {
	Source        string
	DriverVersion string
	GPUs          []GPU // in the capture's order
}

// GPU is one <gpu> element. Optional facts are nil where the capture says
// N/A or leaves them out.
type GPU struct {
	Address          pciaddr.Address
	BusID            string // as the capture spells it
	Name             string
	Vendor, Device   uint16
	SubsystemVendor  *uint16
	SubsystemDevice  *uint16
	Class            *uint32 // from pci_base_class and pci_sub_class
	BAR1Bytes        *uint64
	MaxLinkGen       *int
	CurrentLinkGen   *int
	MaxLinkWidth     *int
	CurrentLinkWidth *int
	// Notes say what the capture held that could not be used.
	Notes []string
}

// The XML shape, as nvsmi_device_v12.dtd and older versions write it.
type xmlLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	GPUs          []xmlGPU `xml:"gpu"`
}

type xmlGPU struct {
	ID          string `xml:"id,attr"`
	ProductName string `xml:"product_name"`
	PCI         struct {
		Domain      string `xml:"pci_domain"`
		Bus         string `xml:"pci_bus"`
		Device      string `xml:"pci_device"`
		BaseClass   string `xml:"pci_base_class"`
		SubClass    string `xml:"pci_sub_class"`
		DeviceID    string `xml:"pci_device_id"`
		BusID       string `xml:"pci_bus_id"`
		SubSystemID string `xml:"pci_sub_system_id"`
		Link        struct {
			Gen struct {
				Max     string `xml:"max_link_gen"`
				Current string `xml:"current_link_gen"`
			} `xml:"pcie_gen"`
			Widths struct {
				Max     string `xml:"max_link_width"`
				Current string `xml:"current_link_width"`
			} `xml:"link_widths"`
		} `xml:"pci_gpu_link_info"`
	} `xml:"pci"`
	BAR1 struct {
		Total string `xml:"total"`
	} `xml:"bar1_memory_usage"`
}

// ParseNvidiaSMI reads an `nvidia-smi -q -x` log. source names it in errors.
func ParseNvidiaSMI(r io.Reader, source string) (*Capture, error) {
	fail := func(err error) (*Capture, error) { return nil, &Error{Source: source, Err: err} }
	data, err := io.ReadAll(io.LimitReader(r, MaxCaptureSize+1))
	if err != nil {
		return fail(err)
	}
	if len(data) > MaxCaptureSize {
		return fail(fmt.Errorf("larger than the %d MiB limit", MaxCaptureSize>>20))
	}
	var log xmlLog
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.CharsetReader = asciiCharset
	if err := dec.Decode(&log); err != nil {
		return fail(fmt.Errorf("not an nvidia-smi -q -x log: %w", err))
	}
	if len(log.GPUs) == 0 {
		return fail(errors.New("no <gpu> element: capture nvidia-smi -q -x on a node with GPUs"))
	}
	c := &Capture{Source: source, DriverVersion: strings.TrimSpace(log.DriverVersion)}
	seen := map[pciaddr.Address]string{}
	for i, x := range log.GPUs {
		g, err := parseGPU(source, i, x)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[g.Address]; dup {
			return nil, &Error{Source: source, Field: fmt.Sprintf("gpu[%d].pci.pci_bus_id", i), Value: g.BusID, Err: fmt.Errorf("the same PCI address as %s", other)}
		}
		seen[g.Address] = fmt.Sprintf("gpu[%d]", i)
		c.GPUs = append(c.GPUs, g)
	}
	return c, nil
}

// asciiCharset accepts the 8-bit encodings an XML declaration may name:
// every value the importer reads (ids, sizes, product names) is ASCII, which
// they all spell alike.
func asciiCharset(label string, input io.Reader) (io.Reader, error) {
	switch strings.ToLower(label) {
	case "us-ascii", "ascii", "iso-8859-1", "latin1", "iso-8859-15", "windows-1252":
		return input, nil
	}
	return nil, fmt.Errorf("encoding %q: want UTF-8, as nvidia-smi writes", label)
}

// gpuParser reads one GPU's fields, naming each in its errors.
type gpuParser struct {
	source string
	prefix string // gpu[2] (00000000:3F:00.0)
	g      *GPU
}

func (p *gpuParser) fail(field, value string, format string, args ...any) error {
	return &Error{Source: p.source, Field: p.prefix + "." + field, Value: value, Err: fmt.Errorf(format, args...)}
}

func (p *gpuParser) note(field, value, why string) {
	p.g.Notes = append(p.g.Notes, fmt.Sprintf("%s.%s %q %s", p.prefix, field, value, why))
}

func parseGPU(source string, i int, x xmlGPU) (GPU, error) {
	g := GPU{Name: strings.TrimSpace(x.ProductName)}
	busID := strings.TrimSpace(x.PCI.BusID)
	field := "pci.pci_bus_id"
	if notAvailable(busID) {
		busID, field = strings.TrimSpace(x.ID), "id"
	}
	p := &gpuParser{source: source, prefix: fmt.Sprintf("gpu[%d]", i), g: &g}
	if busID == "" {
		return g, p.fail("pci.pci_bus_id", "", "missing, and the <gpu> element has no id either")
	}
	a, err := pciaddr.Parse(busID)
	if err != nil {
		return g, p.fail(field, busID, "%s", pciaddr.Reason(err))
	}
	g.Address, g.BusID = a, busID
	p.prefix = fmt.Sprintf("gpu[%d] (%s)", i, busID)
	if id := strings.TrimSpace(x.ID); id != "" && field != "id" {
		if b, err := pciaddr.Parse(id); err != nil || b != a {
			return g, p.fail("id", id, "differs from pci.pci_bus_id %s", busID)
		}
	}

	dev, ok, err := hexWord(x.PCI.DeviceID)
	switch {
	case err != nil:
		return g, p.fail("pci.pci_device_id", x.PCI.DeviceID, "%v", err)
	case !ok:
		return g, p.fail("pci.pci_device_id", x.PCI.DeviceID, "missing: the device id is what the GPU is")
	}
	g.Vendor, g.Device = uint16(dev), uint16(dev>>16)
	if g.Vendor != 0x10de {
		return g, p.fail("pci.pci_device_id", x.PCI.DeviceID, "vendor 0x%04x is not NVIDIA (0x10de); the word is (device<<16)|vendor", g.Vendor)
	}
	sub, ok, err := hexWord(x.PCI.SubSystemID)
	switch {
	case err != nil:
		return g, p.fail("pci.pci_sub_system_id", x.PCI.SubSystemID, "%v", err)
	case ok:
		sv, sd := uint16(sub), uint16(sub>>16)
		g.SubsystemVendor, g.SubsystemDevice = &sv, &sd
	}
	if err := p.class(x.PCI.BaseClass, x.PCI.SubClass); err != nil {
		return g, err
	}
	p.bar1(x.BAR1.Total)
	g.MaxLinkGen = p.link("pci.pci_gpu_link_info.pcie_gen.max_link_gen", x.PCI.Link.Gen.Max, sysfs.ValidLinkGen)
	g.CurrentLinkGen = p.link("pci.pci_gpu_link_info.pcie_gen.current_link_gen", x.PCI.Link.Gen.Current, sysfs.ValidLinkGen)
	g.MaxLinkWidth = p.link("pci.pci_gpu_link_info.link_widths.max_link_width", x.PCI.Link.Widths.Max, sysfs.ValidLinkWidth)
	g.CurrentLinkWidth = p.link("pci.pci_gpu_link_info.link_widths.current_link_width", x.PCI.Link.Widths.Current, sysfs.ValidLinkWidth)
	return g, nil
}

// class reads pci_base_class and pci_sub_class (NVML's hex values); older
// captures have neither, and then the profile keeps its 3D-controller
// default.
func (p *gpuParser) class(base, sub string) error {
	b, okB, err := hexValue(base, 8)
	if err != nil {
		return p.fail("pci.pci_base_class", base, "%v", err)
	}
	s, okS, err := hexValue(sub, 8)
	if err != nil {
		return p.fail("pci.pci_sub_class", sub, "%v", err)
	}
	if !okB || !okS {
		return nil
	}
	class := uint32(b)<<16 | uint32(s)<<8
	if class != 0x030200 && class != 0x030000 {
		return p.fail("pci.pci_base_class", fmt.Sprintf("%s/%s", base, sub), "class 0x%06x is not a GPU class nvml-mock-sysfs renders: 0x030200 (3D controller) or 0x030000 (VGA)", class)
	}
	p.g.Class = &class
	return nil
}

func (p *gpuParser) bar1(total string) {
	const field = "bar1_memory_usage.total"
	n, ok, err := memory(total)
	switch {
	case err != nil:
		p.note(field, total, "is not a size; the board's BAR1 is rendered")
	case !ok:
	case n < 1<<20 || n > 1<<44:
		p.note(field, total, "is outside 1 MiB..16 TiB; the board's BAR1 is rendered")
	default:
		if n&(n-1) != 0 {
			p.note(field, total, "is not a power of two, as a BAR is; the next power of two is rendered")
		}
		p.g.BAR1Bytes = &n
	}
}

func (p *gpuParser) link(field, s string, valid func(int) bool) *int {
	s = strings.TrimSpace(s)
	if notAvailable(s) {
		return nil
	}
	v, err := strconv.Atoi(strings.Trim(s, "x")) // 16x, or x16
	if err != nil || !valid(v) {
		p.note(field, s, "is not a usable link value; the board's is rendered")
		return nil
	}
	return &v
}

// notAvailable reports the ways nvidia-smi says it has no value.
func notAvailable(s string) bool {
	s = strings.Trim(strings.TrimSpace(s), "[]")
	switch strings.ToLower(s) {
	case "", "n/a", "not supported", "unknown error", "insufficient permissions", "requested functionality has been deprecated":
		return true
	}
	return false
}

// hexWord parses a 32-bit id as nvidia-smi writes it: 20B010DE, or
// 0x20B010DE in older versions. ok is false for N/A.
func hexWord(s string) (uint32, bool, error) {
	v, ok, err := hexValue(s, 32)
	return uint32(v), ok, err
}

func hexValue(s string, bits int) (uint64, bool, error) {
	s = strings.TrimSpace(s)
	if notAvailable(s) {
		return 0, false, nil
	}
	digits := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	v, err := strconv.ParseUint(digits, 16, bits)
	if err != nil || digits == "" || strings.ContainsAny(digits, "+-_") {
		return 0, false, fmt.Errorf("want a %d-bit hex number such as %s", bits, map[int]string{8: "3", 32: "20B010DE"}[bits])
	}
	return v, true, nil
}

// memory parses "65536 MiB".
func memory(s string) (uint64, bool, error) {
	s = strings.TrimSpace(s)
	if notAvailable(s) {
		return 0, false, nil
	}
	num, unit, _ := strings.Cut(s, " ")
	shift := map[string]uint{"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}
	sh, known := shift[strings.TrimSpace(unit)]
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil || !known || v > (^uint64(0))>>sh {
		return 0, false, fmt.Errorf("want a size such as 65536 MiB")
	}
	return v << sh, true, nil
}
