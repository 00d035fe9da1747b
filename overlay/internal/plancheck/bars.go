package plancheck

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Resource is one "start end flags" line of a resource file.
type Resource struct{ Start, End, Flags uint64 }

// Size is the resource's length; an unused slot (all zero) has none.
func (r Resource) Size() uint64 {
	if r.End == 0 && r.Start == 0 {
		return 0
	}
	return r.End - r.Start + 1
}

// ParseResources reads a resource file: a newline-ended line per resource,
// each exactly three 0x%016x fields, as go-nvlib insists.
func ParseResources(text string) ([]Resource, error) {
	if !strings.HasSuffix(text, "\n") {
		return nil, fmt.Errorf("no final newline")
	}
	var out []Resource
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		f := strings.Split(line, " ")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d %q: go-nvlib wants exactly three fields", i, line)
		}
		var r Resource
		for j, p := range []*uint64{&r.Start, &r.End, &r.Flags} {
			// The kernel's 0x%016llx, exactly: a value that prints back as
			// the field was written so.
			v, err := strconv.ParseUint(f[j], 0, 64)
			if err != nil || fmt.Sprintf("0x%016x", v) != f[j] {
				return nil, fmt.Errorf("line %d %q: field %q is not 0x and 16 hex digits", i, line, f[j])
			}
			*p = v
		}
		out = append(out, r)
	}
	return out, nil
}

// CheckBARs compares a node's BARs in config space with its resource file,
// and an endpoint's sizes with its board's layout, and returns one message
// per violation:
//
//   - a bridge lists 17 resources, an endpoint 13;
//   - each used BAR's type bits and address are config space's, a 64-bit
//     BAR takes the next slot too, and each is aligned to its size;
//   - a GPU has its board's BAR layout, BAR0 of 16 MiB and the profile's
//     BAR1 as a 64-bit prefetchable BAR; any other endpoint a 32 MiB BAR0.
func (t Tree) CheckBARs(n *plan.Node) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	dir := "sys/" + n.SysPath() + "/"
	res, err := ParseResources(string(t[dir+"resource"].Data))
	if err != nil {
		return []string{dir + "resource: " + err.Error()}
	}
	if n.Role.IsBridge() {
		if len(res) != sysfs.ResourceLinesBridge {
			fail("%sresource: %d lines, but the kernel prints %d for a bridge", dir, len(res), sysfs.ResourceLinesBridge)
		}
		return bad
	}
	if len(res) != sysfs.ResourceLinesDevice {
		return []string{fmt.Sprintf("%sresource: %d lines, but the kernel prints %d for a device", dir, len(res), sysfs.ResourceLinesDevice)}
	}
	cfg := t[dir+"config"].Data
	if len(cfg) < sysfs.ConfigHeaderSize {
		return []string{fmt.Sprintf("%sconfig: %d bytes, no whole header", dir, len(cfg))}
	}
	bar := func(i int) uint32 { return binary.LittleEndian.Uint32(cfg[sysfs.ConfigBAR0+4*i:]) }
	for i := 0; i < 6; i++ {
		r, index := res[i], i
		if r.Size() == 0 {
			continue
		}
		low := bar(index)
		if uint32(r.Flags&0xf) != low&0xf {
			fail("%sconfig: BAR%d type bits %x, resource says %x", dir, index, low&0xf, r.Flags&0xf)
		}
		start := uint64(low &^ 0xf)
		if r.Flags&sysfs.BARType64 != 0 {
			// The upper half sits in the next slot, which lists nothing.
			start |= uint64(bar(index+1)) << 32
			if res[index+1].Size() != 0 {
				fail("%sresource: a 64-bit BAR%d takes the next slot, which is used", dir, index)
			}
			i++
		}
		if r.Start != start {
			fail("%sconfig: BAR%d at %#x, resource says %#x", dir, index, start, r.Start)
		}
		if r.Start%r.Size() != 0 {
			fail("%sresource: BAR%d at %#x is not aligned to its size %#x", dir, index, r.Start, r.Size())
		}
	}
	if n.Device == nil || n.Device.Kind != profile.GPU {
		if res[0].Size() != 32<<20 {
			fail("%sresource: BAR0 of %d bytes, want 32 MiB", dir, res[0].Size())
		}
		return bad
	}
	d := n.Device
	want := boards.BARs(d.Name, d.DeviceID, d.BAR1Bytes)
	var got []boards.BAR
	for i, r := range res[:6] {
		if r.Size() > 0 {
			got = append(got, boards.BAR{Index: i, Size: r.Size(), Is64: r.Flags&sysfs.BARType64 != 0, Prefetch: r.Flags&sysfs.BARPrefetchable != 0})
		}
	}
	if !slices.Equal(got, want) {
		fail("%sresource: BARs %+v, but board %04x with BAR1 %d has %+v", dir, got, d.DeviceID, d.BAR1Bytes, want)
	}
	// nvidia-smi's BAR1 is the one sized from the profile, 64-bit
	// prefetchable as on real boards.
	bar1 := 1
	if boards.BARLayoutOf(d.Name, d.DeviceID) == boards.Hopper {
		bar1 = 2
	}
	if res[bar1].Size() != d.BAR1Bytes || res[bar1].Flags != sysfs.ResourceFlagsMem64Pref {
		fail("%sresource: BAR%d %d bytes with flags %#x, want the profile's %d with %#x", dir, bar1, res[bar1].Size(), res[bar1].Flags, d.BAR1Bytes, sysfs.ResourceFlagsMem64Pref)
	}
	if res[0].Size() != 16<<20 {
		fail("%sresource: BAR0 of %d bytes, want 16 MiB", dir, res[0].Size())
	}
	return bad
}

// CheckWindows checks that each bridge's windows hold the BARs and ROM of
// every device below it, as firmware assigns them: a prefetchable BAR in
// the prefetchable window, any other in the memory window.
func (t Tree) CheckWindows(tree *plan.Tree) []string {
	var bad []string
	var walk func(n *plan.Node, windows [][2]Resource)
	walk = func(n *plan.Node, windows [][2]Resource) {
		dir := "sys/" + n.SysPath() + "/"
		res, err := ParseResources(string(t[dir+"resource"].Data))
		if err != nil {
			bad = append(bad, dir+"resource: "+err.Error())
			return
		}
		if n.Role.IsBridge() {
			if len(res) <= sysfs.ResourceWindowPrefLine {
				bad = append(bad, fmt.Sprintf("%sresource: %d lines, no windows", dir, len(res)))
				return
			}
			windows = append(windows, [2]Resource{res[sysfs.ResourceWindowMemLine], res[sysfs.ResourceWindowPrefLine]})
		} else {
			for i, b := range res[:min(len(res), sysfs.ResourceROMLine+1)] {
				if b.Size() == 0 {
					continue
				}
				for _, w := range windows {
					win := w[0]
					if b.Flags&sysfs.ResourceFlagPrefetch != 0 && i != sysfs.ResourceROMLine {
						win = w[1]
					}
					if b.Start < win.Start || b.End > win.End {
						bad = append(bad, fmt.Sprintf("%s resource %d [%x-%x] outside a window above it [%x-%x]", n.Address, i, b.Start, b.End, win.Start, win.End))
					}
				}
			}
		}
		for _, ch := range n.Children {
			walk(ch, windows)
		}
	}
	for _, rc := range tree.RootComplexes {
		for _, n := range rc.Children {
			walk(n, nil)
		}
	}
	return bad
}
