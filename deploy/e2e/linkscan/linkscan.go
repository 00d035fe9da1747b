// Package linkscan reads a PCI links directory (/sys/bus/pci/devices) as
// a reader that never stops reading sees it during re-renders: it lists the
// directory and reads vendor, class and resource of every entry, and tells
// a whole entry from a torn one (a link that does not resolve, a file read
// empty, partial or malformed) and from one a re-render removed. The
// reliability tests and the DaemonSet's CRI run share it; it has no
// cgo dependency, so a static reader program can run it in a container.
package linkscan

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Entry is what a scan read through one entry of the links directory:
// the files go-nvlib reads of every entry (vendor) and of NVIDIA ones.
type Entry struct {
	Vendor   string `json:"vendor"`
	Class    string `json:"class"`
	Resource string `json:"resource"`
}

// Result is one pass over the links directory, as a reader that lists
// it and then reads vendor, class and resource of every entry sees it.
type Result struct {
	Entries map[string]Entry `json:"entries"`
	Files   int              `json:"files"`
	// Vanished counts entries that were listed and then removed before all
	// their files were read: a flip took the device away. Not torn.
	Vanished int `json:"vanished"`
	// Torn describes entries that still exist but did not resolve, and
	// files that read empty, partial or malformed.
	Torn []string `json:"torn"`
}

// Files are read in this order from every entry.
func Files() []string { return []string{"vendor", "class", "resource"} }

// Links lists fsys (the links directory) and reads every entry's files.
func Links(fsys fs.FS) Result {
	res := Result{Entries: map[string]Entry{}}
	names, err := fs.ReadDir(fsys, ".")
	if err != nil {
		res.Torn = append(res.Torn, "readdir: "+err.Error())
		return res
	}
	for _, d := range names {
		name := d.Name()
		if !pciaddr.IsBDF(name) || strings.ToLower(name) != name {
			res.Torn = append(res.Torn, fmt.Sprintf("%s: not a lower-case BDF", name))
			continue
		}
		// The node's own devices (--host-devices merge) keep the kernel's
		// link text and files, whose format varies by machine and which
		// no render rewrites: they must resolve, not match the planner's
		// format.
		target, _ := fs.ReadLink(fsys, name)
		own := plan.IsKernelLinkText(target)
		var e Entry
		whole := true
		for _, f := range Files() {
			data, err := fs.ReadFile(fsys, name+"/"+f)
			if err != nil {
				if _, lerr := fs.Lstat(fsys, name); errors.Is(lerr, fs.ErrNotExist) {
					res.Vanished++
				} else {
					res.Torn = append(res.Torn, fmt.Sprintf("%s/%s: entry exists but does not resolve: %v", name, f, err))
				}
				whole = false
				break
			}
			res.Files++
			if err := CheckAttr(f, string(data)); err != nil && !own {
				res.Torn = append(res.Torn, fmt.Sprintf("%s/%s: %v", name, f, err))
				whole = false
				break
			}
			switch f {
			case "vendor":
				e.Vendor = string(data)
			case "class":
				e.Class = string(data)
			default:
				e.Resource = string(data)
			}
		}
		if whole {
			res.Entries[name] = e
		}
	}
	return res
}

// CheckAttr tells a whole sysfs attribute from an empty, partial or
// malformed one, by the exact format the kernel (and the planner) writes.
func CheckAttr(name, s string) error {
	switch name {
	case "vendor":
		return checkHexLine(s, 4)
	case "class":
		return checkHexLine(s, 6)
	case "resource":
		lines := strings.SplitAfter(s, "\n")
		if lines[len(lines)-1] != "" {
			return fmt.Errorf("read %d bytes that do not end in a newline: partial", len(s))
		}
		lines = lines[:len(lines)-1]
		if len(lines) != sysfs.ResourceLinesDevice && len(lines) != sysfs.ResourceLinesBridge {
			return fmt.Errorf("%d lines; want %d (device) or %d (bridge)", len(lines), sysfs.ResourceLinesDevice, sysfs.ResourceLinesBridge)
		}
		for i, l := range lines {
			fields := strings.Split(strings.TrimSuffix(l, "\n"), " ")
			if len(fields) != 3 {
				return fmt.Errorf("line %d has %d fields, want 3", i, len(fields))
			}
			for _, f := range fields {
				if err := checkHexLine(f+"\n", 16); err != nil {
					return fmt.Errorf("line %d: %w", i, err)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("no format known for %s", name)
}

// checkHexLine accepts exactly "0x" and digits lower-case hex digits and a newline.
func checkHexLine(s string, digits int) error {
	if len(s) == 0 {
		return errors.New("empty")
	}
	if len(s) != digits+3 || !strings.HasPrefix(s, "0x") || s[len(s)-1] != '\n' {
		return fmt.Errorf("%q is not 0x and %d hex digits and a newline", s, digits)
	}
	for _, c := range s[2 : len(s)-1] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return fmt.Errorf("%q is not lower-case hex", s)
		}
	}
	return nil
}

// MaxSamples bounds the examples Totals keeps of torn reads.
const MaxSamples = 20

// Totals add up the scans of a reader that never stops reading.
type Totals struct {
	Scans    int      `json:"scans"`
	Entries  int      `json:"entries"`
	Files    int      `json:"files"`
	Vanished int      `json:"vanished"`
	Torn     int      `json:"torn"`
	Samples  []string `json:"samples"`
}

// Add counts one scan, and keeps its first torn reads as samples.
func (st *Totals) Add(r Result) {
	st.Scans++
	st.Entries += len(r.Entries)
	st.Files += r.Files
	st.Vanished += r.Vanished
	st.Torn += len(r.Torn)
	for _, s := range r.Torn {
		if len(st.Samples) < MaxSamples {
			st.Samples = append(st.Samples, fmt.Sprintf("scan %d: %s", st.Scans, s))
		}
	}
}
