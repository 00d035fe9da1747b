package fusetree

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// sysfsTree writes a tree shaped like a node's PCI sysfs: 48 devices, each
// a directory of attributes, links and two subdirectories, reached through
// bus/pci/devices and bound to a driver. It returns how many entries it
// holds.
func sysfsTree(tb testing.TB, dir string) int {
	tb.Helper()
	attrs := []string{"vendor", "device", "subsystem_vendor", "subsystem_device", "class", "revision",
		"config", "resource", "irq", "numa_node", "local_cpus", "local_cpulist", "enable",
		"current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
		"driver_override", "modalias", "uevent", "d3cold_allowed", "msi_bus", "broken_parity_status", "ari_enabled"}
	entries := 0
	write := func(name, content string) {
		p := filepath.Join(dir, name)
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.WriteFile(p, []byte(content), 0o444))
		entries++
	}
	link := func(name, target string) {
		p := filepath.Join(dir, name)
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.Symlink(target, p))
		entries++
	}
	for i := range 48 {
		addr := fmt.Sprintf("0000:%02x:00.0", i+1)
		dev := "sys/devices/pci0000:00/" + addr
		for _, a := range attrs {
			write(dev+"/"+a, fmt.Sprintf("0x%04x %s\n", i, a))
		}
		for _, p := range []string{"control", "runtime_status", "runtime_usage", "runtime_enabled", "wakeup", "async"} {
			write(dev+"/power/"+p, "auto\n")
		}
		for irq := range 8 {
			write(fmt.Sprintf("%s/msi_irqs/%d", dev, 100+8*i+irq), "msix\n")
		}
		link(dev+"/driver", "../../../bus/pci/drivers/nvidia")
		link(dev+"/subsystem", "../../../bus/pci")
		link(dev+"/iommu_group", fmt.Sprintf("../../../kernel/iommu_groups/%d", i))
		link("sys/bus/pci/devices/"+addr, "../../../devices/pci0000:00/"+addr)
		link("sys/bus/pci/drivers/nvidia/"+addr, "../../../../devices/pci0000:00/"+addr)
	}
	write("sys/bus/pci/drivers/nvidia/bind", "")
	write("sys/bus/pci/drivers/nvidia/unbind", "")
	return entries
}

// walkAll is a full enumeration: every entry stat'ed, every link read,
// every file read.
func walkAll(tb testing.TB, root string) int {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		switch d.Type() {
		case fs.ModeSymlink:
			_, err = os.Readlink(p)
		case 0:
			_, err = os.ReadFile(p)
		}
		n++
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// BenchmarkWalk compares a full enumeration of a ~2000-file tree through
// the mount with the same enumeration of the backing directory.
//
//	backing       the directory itself
//	fuse          the mount, default timeouts, caches warm (the second and
//	              later walks within the timeouts)
//	fuse-cold     the mount, each walk on a fresh mount: nothing cached
//	fuse-nocache  the mount with every cache off (negative timeouts)
func BenchmarkWalk(b *testing.B) {
	backing := b.TempDir()
	entries := sysfsTree(b, backing)
	b.Logf("%d entries", entries)
	b.Run("backing", func(b *testing.B) {
		for range b.N {
			walkAll(b, backing)
		}
	})
	b.Run("fuse", func(b *testing.B) {
		overlaytest.RequireFUSE(b)
		mp := b.TempDir()
		mount(b, Options{Backing: backing, MountPoint: mp})
		walkAll(b, mp)
		b.ResetTimer()
		for range b.N {
			walkAll(b, mp)
		}
	})
	b.Run("fuse-cold", func(b *testing.B) {
		overlaytest.RequireFUSE(b)
		mp := b.TempDir()
		for range b.N {
			b.StopTimer()
			srv, err := Mount(Options{Backing: backing, MountPoint: mp})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			walkAll(b, mp)
			b.StopTimer()
			if err := srv.Unmount(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("fuse-nocache", func(b *testing.B) {
		overlaytest.RequireFUSE(b)
		mp := b.TempDir()
		mount(b, Options{Backing: backing, MountPoint: mp, EntryTimeout: -1, AttrTimeout: -1, NegativeTimeout: -1})
		for range b.N {
			walkAll(b, mp)
		}
	})
}
