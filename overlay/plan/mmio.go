package plan

import (
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

const (
	mib = uint64(1) << 20
	// The 32-bit MMIO hole below 4 GiB, and where 64-bit BARs start.
	mmio32Start = uint64(0x80000000)
	mmio32End   = uint64(0xfc000000)
	mmio64Start = uint64(0x200000000000)
	romSize     = 512 << 10
)

// bar is one resource line with an address.
type bar struct {
	index int
	start uint64
	size  uint64
	flags uint64
}

func (b bar) end() uint64    { return b.start + b.size - 1 }
func (b bar) is64() bool     { return b.flags&sysfs.BARType64 != 0 && b.index < sysfs.ResourceROMLine }
func (b bar) prefetch() bool { return b.flags&sysfs.ResourceFlagPrefetch != 0 }

// barSpec is a BAR before it has an address.
type barSpec struct {
	index int
	size  uint64
	flags uint64
}

// endpointBARs gives a device its BAR layout: the real board's, with BAR1's
// size from the profile.
func endpointBARs(n *Node) []barSpec {
	d := n.Device
	switch d.Kind {
	case profile.NVSwitch:
		return []barSpec{{0, 32 * mib, sysfs.ResourceFlagsMem32}}
	case profile.HCA:
		return hcaBARs()
	}
	var specs []barSpec
	for _, b := range boards.BARs(d.Name, d.DeviceID, d.BAR1Bytes) {
		flags := uint64(sysfs.ResourceFlagsMem32)
		switch {
		case b.Is64 && b.Prefetch:
			flags = sysfs.ResourceFlagsMem64Pref
		case b.Is64:
			flags = sysfs.ResourceFlagsMem64
		}
		specs = append(specs, barSpec{b.Index, b.Size, flags})
	}
	return append(specs, barSpec{sysfs.ResourceROMLine, romSize, sysfs.ResourceFlagsROM})
}

// allocator hands out addresses in depth-first order, so that every
// bridge's window covers exactly its subtree.
type allocator struct {
	next32, next64 uint64
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) &^ (a - 1) }

func (al *allocator) take(size uint64, is64 bool) uint64 {
	if is64 {
		al.next64 = alignUp(al.next64, size)
		start := al.next64
		al.next64 += size
		return start
	}
	start := alignUp(al.next32, size)
	if start+size > mmio32End {
		// The hole below 4 GiB fits about a hundred GPUs. Past that, reuse it
		// from the start: overlapping windows are harmless in a mock, while a
		// 32-bit BAR above 4 GiB could not be written into config space.
		start = mmio32Start
	}
	al.next32 = start + size
	return start
}

// assignBARs gives every endpoint its BARs and every bridge its windows.
func assignBARs(t *Tree) {
	al := &allocator{next32: mmio32Start, next64: mmio64Start}
	for i := range t.RootComplexes {
		for _, n := range t.RootComplexes[i].Children {
			al.assign(n)
		}
	}
}

func (al *allocator) assign(n *Node) {
	if n.Role == Endpoint {
		specs := endpointBARs(n)
		// Largest first within each space, as firmware does, to waste
		// least to alignment.
		order := slices.Clone(specs)
		slices.SortStableFunc(order, func(a, b barSpec) int {
			switch {
			case a.size > b.size:
				return -1
			case a.size < b.size:
				return 1
			}
			return 0
		})
		for _, s := range order {
			is64 := s.flags&sysfs.BARType64 != 0 && s.index < sysfs.ResourceROMLine
			n.bars = append(n.bars, bar{index: s.index, start: al.take(s.size, is64), size: s.size, flags: s.flags})
		}
		slices.SortFunc(n.bars, func(a, b bar) int { return a.index - b.index })
		return
	}
	// Align each bridge's windows to their 1 MiB granularity.
	al.next32 = alignUp(al.next32, mib)
	al.next64 = alignUp(al.next64, mib)
	for _, c := range n.Children {
		al.assign(c)
	}
	var lo32, hi32, lo64, hi64 uint64
	walk(n, func(x *Node) {
		for _, b := range x.bars {
			if b.index > sysfs.ResourceROMLine {
				continue
			}
			if b.prefetch() && b.index != sysfs.ResourceROMLine {
				if lo64 == 0 || b.start < lo64 {
					lo64 = b.start
				}
				hi64 = max(hi64, b.end())
			} else {
				if lo32 == 0 || b.start < lo32 {
					lo32 = b.start
				}
				hi32 = max(hi32, b.end())
			}
		}
	})
	if hi32 != 0 {
		lo32 &^= mib - 1
		hi32 = alignUp(hi32+1, mib) - 1
		n.bars = append(n.bars, bar{index: sysfs.ResourceWindowMemLine, start: lo32, size: hi32 - lo32 + 1, flags: sysfs.ResourceFlagsWindow})
	}
	if hi64 != 0 {
		lo64 &^= mib - 1
		hi64 = alignUp(hi64+1, mib) - 1
		n.bars = append(n.bars, bar{index: sysfs.ResourceWindowPrefLine, start: lo64, size: hi64 - lo64 + 1, flags: sysfs.ResourceFlagsWindowPref})
	}
}
