package resourceslices

import (
	"fmt"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// DRANetDriver is dranet's driver name, and its attributes' domain.
const DRANetDriver = "dra.net"

// dranet's attributes (sigs.k8s.io/dranet/pkg/apis), those it publishes on
// a PCI network function of the tree.
const (
	dranetPCIAddress   = DRANetDriver + "/pciAddress"
	dranetPCIVendor    = DRANetDriver + "/pciVendor"
	dranetPCIDevice    = DRANetDriver + "/pciDevice"
	dranetPCISubsystem = DRANetDriver + "/pciSubsystem"
	dranetNUMANode     = DRANetDriver + "/numaNode"
	dranetRDMA         = DRANetDriver + "/rdma"
)

// mellanoxName is what the pci.ids dranet embeds calls vendor 15b3.
const mellanoxName = "Mellanox Technologies"

// connectXNames are the ConnectX functions' names in the pci.ids dranet
// embeds (third_party/pciids, version 2024.11.25), by device id: ghw
// looks the function's modalias up there for dra.net/pciDevice. A type
// of boards.HCAs missing here is refused, not guessed.
var connectXNames = map[uint16]string{
	0x1017: "MT27800 Family [ConnectX-5]",
	0x1019: "MT28800 Family [ConnectX-5 Ex]",
	0x101b: "MT28908 Family [ConnectX-6]",
	0x101d: "MT2892 Family [ConnectX-6 Dx]",
	0x101f: "MT2894 Family [ConnectX-6 Lx]",
	0x1021: "MT2910 Family [ConnectX-7]",
	0x1023: "CX8 Family [ConnectX-8]",
	0x1025: "CX9 Family [ConnectX-9]",
}

// DRANet is dranet (sigs.k8s.io/dranet, driver dra.net): on a node, one
// slice holding a device per PCI network function the tree renders,
// which are the profile's HCAs (the infiniband block's ConnectX
// functions, bound to mlx5_core), ordered by name as dranet orders them.
// A profile with no HCA gives none.
//
// Where the values come from, as dranet reads them:
//
//   - which functions: ghw's scan of /sys/bus/pci/devices, every class
//     0x02 function with a driver bound that makes a netdev (not
//     vfio-pci and its kin), named pci-<address with - for : and .>;
//   - dra.net/pciAddress, resource.kubernetes.io/pcieRoot and
//     resource.kubernetes.io/numaNode: the address, root complex and
//     NUMA node the plan gives the HCA, as deviceattribute reads them
//     from the tree (none where the NUMA node is -1);
//   - dra.net/pciVendor, pciDevice and pciSubsystem: the function's ids
//     as ghw names them from dranet's pci.ids (the subsystem by its id
//     alone: pci.ids lists no subsystem of these functions);
//   - dra.net/numaNode: ghw's, which it reads only on a host of more than
//     one NUMA node (/sys/devices/system/node, which the tree leaves
//     the host's): planned as on the profile's machine, where its roots
//     span more than one NUMA node;
//   - dra.net/rdma false: the tree gives a function no infiniband
//     directory and no netdev, so dranet finds no RDMA link.
//
// Left out, because they come from the node's live network state and
// not from the tree: the node's own NICs and virtual links (a node that
// runs nothing has none), and a netdev's attributes (ifName, mac, mtu,
// state, addresses, sriov, ...), which a mock HCA never has. The
// standard numaNode is the scalar form: the list form is dranet's under
// its DRAListTypeAttributes gate, off by default.
type DRANet struct{}

// Name is dranet's driver name.
func (DRANet) Name() string { return DRANetDriver }

// Slices are the ResourceSlices dranet publishes on node for p.
func (DRANet) Slices(p *Profile, node string) ([]resourcev1.ResourceSlice, error) {
	if p.Machine.HCAs == nil {
		return nil, nil
	}
	pl, err := plan.New(p.Machine, plan.Options{})
	if err != nil {
		return nil, err
	}
	numaHost := numaNodes(pl.Tree) > 1
	var devices []resourcev1.Device
	for _, hca := range pl.Tree.HCAs {
		d, err := nicDevice(p.Source, hca.Node, numaHost)
		if err != nil {
			return nil, err
		}
		devices = append(devices, d)
	}
	// dranet sorts its devices by name; a PCI address's name sorts as
	// the address.
	return nodeSlices(DRANetDriver, node, devices), nil
}

// nicDevice is the device dranet publishes for the network function n.
func nicDevice(source string, n *plan.Node, numaHost bool) (resourcev1.Device, error) {
	id := n.Identity
	product, ok := connectXNames[id.Device]
	if id.Vendor != boards.VendorMellanox || !ok {
		return resourcev1.Device{}, fmt.Errorf("profile %s: HCA %s: device %04x:%04x has no name in dranet's pci.ids that this tool knows", source, n.Address, id.Vendor, id.Device)
	}
	address := n.Address.String()
	attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		dranetPCIAddress:   {StringValue: new(address)},
		dranetPCIVendor:    {StringValue: new(mellanoxName)},
		dranetPCIDevice:    {StringValue: new(product)},
		dranetPCISubsystem: {StringValue: new(fmt.Sprintf("%04x", id.SubsystemDevice))},
		dranetRDMA:         {BoolValue: new(false)},
		pcieRootAttribute:  {StringValue: new(n.RootComplex.String())},
	}
	if n.NUMANode >= 0 {
		numa, err := deviceattribute.GetNUMANodeAttribute(n.NUMANode, deviceattribute.ScalarAttribute)
		if err != nil {
			return resourcev1.Device{}, fmt.Errorf("profile %s: HCA %s: %w", source, address, err)
		}
		attrs[numa.Name] = numa.Value
		if numaHost {
			attrs[dranetNUMANode] = resourcev1.DeviceAttribute{IntValue: new(int64(n.NUMANode))}
		}
	}
	return resourcev1.Device{
		Name:       "pci-" + strings.NewReplacer(":", "-", ".", "-").Replace(address),
		Attributes: attrs,
	}, nil
}

// numaNodes counts the NUMA nodes the tree's root complexes are on: the
// host's, on the profile's machine.
func numaNodes(t *plan.Tree) int {
	seen := map[int]bool{}
	for _, r := range t.RootComplexes {
		if r.NUMANode >= 0 {
			seen[r.NUMANode] = true
		}
	}
	return len(seen)
}
