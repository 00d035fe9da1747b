package sriovdra_test

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The SR-IOV facts of the profile's HCAs the profile does not state,
// written here from their sources, so that the suite's expectations are
// its own and not the planner's (overlay/plan), which renders the same
// values: the suite requires the view to show them (findPFs), then puts
// each VF where the kernel would.
const (
	// mellanox is the HCAs' vendor (pci.ids: "15b3  Mellanox
	// Technologies").
	mellanox = 0x15b3
	// connectXVF is the device id of a ConnectX-6 Dx and later's virtual
	// function (pci.ids: "101e  ConnectX Family mlx5Gen Virtual
	// Function"), the profile's ConnectX-7 (MT4129) among them.
	connectXVF = 0x101e
	// vfOffset and vfStride are the First VF Offset and VF Stride of the
	// SR-IOV capability of a ConnectX physical function that is its
	// adapter's only function, as each HCA of the profile is (one port):
	// its first VF is the routing ID after its own, the others follow one
	// by one. A two-port adapter's first PF, whose next routing ID is its
	// second PF, has offset 2; none is rendered.
	vfOffset, vfStride = 1, 1
)

// bdf is a PCI function's address: domain, bus, and devfn, the device
// and function packed as the kernel keeps them (device<<3 | function).
type bdf struct {
	domain     uint16
	bus, devfn uint8
}

// parseBDF reads DDDD:BB:DD.F, as sysfs names a function.
func parseBDF(s string) (bdf, error) {
	var domain, bus, dev, fn uint
	if n, err := fmt.Sscanf(s, "%04x:%02x:%02x.%1x", &domain, &bus, &dev, &fn); err != nil || n != 4 || domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7 || len(s) != len("0000:00:00.0") {
		return bdf{}, fmt.Errorf("value %q: not a PCI address DDDD:BB:DD.F", s)
	}
	return bdf{domain: uint16(domain), bus: uint8(bus), devfn: uint8(dev<<3 | fn)}, nil
}

func (a bdf) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.devfn>>3, a.devfn&7)
}

// vfAddress is the address of virtual function n (0-based, the kernel's
// vf_id, the N of the PF's virtfnN link) of the physical function pf
// whose SR-IOV capability gives offset and stride, by the kernel's rule
// (drivers/pci/iov.c, pci_iov_virtfn_bus and pci_iov_virtfn_devfn): its
// routing ID is the PF's, bus<<8 | devfn, plus the First VF Offset plus n
// VF Strides; its bus is the routing ID's high byte, its devfn the low,
// its domain the PF's.
func vfAddress(pf bdf, offset, stride, n int) bdf {
	rid := int(pf.bus)<<8 | int(pf.devfn)
	rid += offset + stride*n
	return bdf{domain: pf.domain, bus: uint8(rid >> 8), devfn: uint8(rid)}
}

// TestVFAddress holds vfAddress to the rule on cases worked by hand: the
// profile's first HCA's eight VFs, the two-port adapter's offset 2, a
// stride of 2, and a routing ID that passes its bus's last devfn.
func TestVFAddress(t *testing.T) {
	pf := func(s string) bdf {
		a, err := parseBDF(s)
		require.NoError(t, err)
		return a
	}
	for _, c := range []struct {
		pf             string
		offset, stride int
		want           []string
	}{
		{"0000:19:00.0", 1, 1, []string{"0000:19:00.1", "0000:19:00.2", "0000:19:00.3", "0000:19:00.4", "0000:19:00.5", "0000:19:00.6", "0000:19:00.7", "0000:19:01.0"}},
		{"0000:3b:00.0", 2, 1, []string{"0000:3b:00.2", "0000:3b:00.3"}},
		{"0002:3b:00.1", 8, 2, []string{"0002:3b:01.1", "0002:3b:01.3", "0002:3b:01.5"}},
		{"0000:3b:1f.6", 1, 1, []string{"0000:3b:1f.7", "0000:3c:00.0"}},
	} {
		var got []string
		for n := range c.want {
			got = append(got, vfAddress(pf(c.pf), c.offset, c.stride, n).String())
		}
		require.Equal(t, c.want, got, "PF %s, offset %d, stride %d", c.pf, c.offset, c.stride)
	}
	for _, bad := range []string{"0000:19:00", "0000:19:20.0", "0000:19:00.8", "19:00.0", "00000:19:00.0"} {
		_, err := parseBDF(bad)
		require.Error(t, err, bad)
	}
}

// physFn is an HCA's physical function as the view shows it, judged
// against the profile by findPFs.
type physFn struct {
	addr bdf
	// root is the root complex its device path starts with (pci0000:15),
	// one the profile gives a GPU that carries HCAs; numa is that root's
	// NUMA node by the profile, gpus the bus ids of its GPUs that carry
	// HCAs.
	root string
	numa int
	gpus []string
}

// rootInPath is the root complex a device's resolved path passes through
// (…/sys/devices/pci0000:15/0000:15:01.0/…).
var rootInPath = regexp.MustCompile(`/devices/(pci[0-9a-f]{4}:[0-9a-f]{2})/`)

// findPFs reads the HCAs' physical functions through the view, as a
// container with the writable spec's mounts sees them (every function of
// Mellanox's with sriov_totalvfs), and requires them to be the profile's
// (profilefacts): as many on each root complex as the infiniband block
// puts beside the GPUs the pcie_topology places there, each the device
// its hca_type names, with the profile's sriov_totalvfs, the NUMA node of
// its root, and the SR-IOV capability written above (offset, stride, VF
// device). s.pfs are then those functions, by address.
func (s *suite) findPFs(t *testing.T) {
	t.Helper()
	pfDevice, err := s.facts.HCADevice()
	require.NoError(t, err)
	want := map[string]physFn{} // by root
	for _, g := range s.facts.GPUs {
		if g.HCAs == 0 {
			continue
		}
		require.True(t, g.RootGiven() && g.NUMAGiven, "%s: GPU %s carries HCAs; the suite's profile places it on a root complex with a NUMA node", sriovProfile, g.BusID)
		require.Equal(t, 1, g.HCAs, "%s: one HCA per GPU (the suite names each PF's stand-in netdev after it)", sriovProfile)
		pf := want[g.Root]
		pf.root, pf.numa, pf.gpus = g.Root, g.NUMANode, append(pf.gpus, g.BusID)
		want[g.Root] = pf
	}
	out, err := s.shell(s.mounts, `for d in /sys/bus/pci/devices/*; do
  if [ "$(cat "$d/vendor")" = 0x15b3 ] && [ -e "$d/sriov_totalvfs" ]; then
    echo "${d##*/} $(readlink -f "$d") $(cat "$d/device" "$d/numa_node" "$d/sriov_totalvfs" "$d/sriov_offset" "$d/sriov_stride" "$d/sriov_vf_device" | tr '\n' ' ')"
  fi
done`)
	require.NoError(t, err, "the view's HCAs:\n%s", out)
	s.pfs = nil
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 8, "the view's HCA: %q (address, path, device, numa_node, sriov_totalvfs, sriov_offset, sriov_stride, sriov_vf_device)", line)
		addr, err := parseBDF(f[0])
		require.NoError(t, err)
		root := ""
		if m := rootInPath.FindStringSubmatch(f[1]); m != nil {
			root = m[1]
		}
		pf, ok := want[root]
		require.True(t, ok, "HCA %s is under %s (%s); %s puts HCAs on %v", addr, root, f[1], sriovProfile, slices.Sorted(maps.Keys(want)))
		delete(want, root)
		pf.addr = addr
		wantFiles := []string{fmt.Sprintf("0x%04x", pfDevice), strconv.Itoa(pf.numa), strconv.Itoa(s.facts.TotalVFs),
			strconv.Itoa(vfOffset), strconv.Itoa(vfStride), fmt.Sprintf("%04x", connectXVF)}
		require.Equal(t, wantFiles, f[2:], "HCA %s: device, numa_node, sriov_totalvfs, sriov_offset, sriov_stride, sriov_vf_device (hca_type %s, the profile's NUMA node and sriov_totalvfs, a one-function ConnectX's capability)", addr, s.facts.HCAType)
		s.pfs = append(s.pfs, pf)
	}
	require.Empty(t, want, "root complexes where %s puts an HCA and the view shows none", sriovProfile)
	slices.SortFunc(s.pfs, func(a, b physFn) int { return strings.Compare(a.addr.String(), b.addr.String()) })
	var said []string
	for _, pf := range s.pfs {
		said = append(said, fmt.Sprintf("%s on %s (GPU %s, NUMA node %d)", pf.addr, pf.root, strings.Join(pf.gpus, ", "), pf.numa))
	}
	t.Logf("the view's HCAs, as the profile places them: %s", strings.Join(said, "; "))
}
