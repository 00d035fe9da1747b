// Package plan turns a normalised profile into the complete overlay tree:
// every directory, file content and link text, before anything touches disk.
//
// The tree has two parts. Device directories sit where the kernel would put
// them, under <root>/sys/devices/pciDDDD:BB/<bridges>/<bdf>. The links
// directory <root>/sys/bus/pci/devices, which containers see at
// /sys/bus/pci/devices, holds one symlink per device:
//
//   - a bridge's link escapes to the container root:
//     ../../../../opt/nvml-mock/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0
//   - an endpoint's link starts from such a bridge whose directory sits four
//     levels below sys/ (its anchor), then climbs four levels and walks down:
//     0000:16:00.0/../../../../devices/pci0000:15/0000:15:01.0/.../0000:18:00.0
//
// Lexically the endpoint's text cleans to devices/pci0000:15/.../0000:18:00.0,
// which is what deviceattribute's pcieRoot parses; physically the kernel
// follows the anchor into the overlay, climbs to the overlay's sys/ and finds
// the GPU. The loop link <root>/opt/nvml-mock -> .. makes the same text
// resolve on the host at <root>, in a container at /opt/nvml-mock, and at
// /sys/bus/pci/devices.
package plan

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Paths inside the overlay root.
const (
	// LinksDir is the directory bind-mounted at sysfs.KernelLinksDir: the
	// overlay's sys/ is a sysfs root, so the links sit where the kernel's do.
	LinksDir = "sys/" + sysfs.LinksDir
	// ProfileFile is the effective profile, which verify checks against.
	// It is JSON, which profile loaders read as the YAML it also is.
	ProfileFile = "effective-profile.json"
	// ProductNameFile is the machine type, for GPU Feature Discovery's
	// --machine-type-file=/opt/nvml-mock/dmi/product_name. It is never
	// mounted over /sys/class/dmi.
	ProductNameFile = "dmi/product_name"
	// BinaryFile is where render installs its own binary for verify.
	BinaryFile = "bin/nvml-mock-sysfs"
	// DefaultContainerRoot is where containers see the overlay.
	DefaultContainerRoot = "/opt/nvml-mock"
	// DefaultHostSysfs is where the host's own devices are read from.
	DefaultHostSysfs = "/sys"
)

// EntryKind is what an entry is on disk.
type EntryKind uint8

const (
	Dir EntryKind = iota
	File
	Symlink
)

func (k EntryKind) String() string { return [...]string{"directory", "file", "symlink"}[k] }

// Entry is one path of the overlay.
type Entry struct {
	Path   string      // slash-separated, relative to the overlay root
	Kind   EntryKind   //
	Mode   fs.FileMode // permission bits of a directory or file
	Data   []byte      // a file's content
	Target string      // a symlink's text
	// Source, for a file, holds its content in a host file instead of Data:
	// the installed binary, too large to read and hash on every render.
	Source *FileSource
}

// FileSource is a host file a planned file copies. The writer reads it only
// to write the file or to compare it byte for byte; otherwise Size and
// Fingerprint stand for its content.
type FileSource struct {
	Path        string
	Size        int64
	Fingerprint string // changes whenever the content does
}

// Equal reports whether two entries are the same path with the same kind,
// mode, content and link text.
func (e Entry) Equal(o Entry) bool {
	if e.Path != o.Path || e.Kind != o.Kind || e.Mode != o.Mode || e.Target != o.Target || !bytes.Equal(e.Data, o.Data) {
		return false
	}
	if e.Source == nil || o.Source == nil {
		return e.Source == o.Source
	}
	return e.Source.Fingerprint == o.Source.Fingerprint
}

// Len is the size of a file entry's content.
func (e Entry) Len() int64 {
	if e.Source != nil {
		return e.Source.Size
	}
	return int64(len(e.Data))
}

// Plan is the whole overlay, in the order it is safe to write: directories
// and files first, then the links inside the device tree, then bridges'
// entries in the links directory, then endpoints' entries, whose text
// passes through the bridges'.
type Plan struct {
	Machine       *profile.Machine
	Tree          *Tree
	ContainerRoot string
	HostDevices   []HostDevice // listed beside the mock devices, in kernel form
	Entries       []Entry
	// Functions is what each function shows, by address: a writable tree
	// judges writes by it.
	Functions map[pciaddr.Address]*Function
	// Modules are the modules the module view renders, in KernelModules'
	// order; HostModules, the node's own, are linked beside them.
	Modules, HostModules []string
	// Drivers are the drivers DriversDir lists, sorted: those whose
	// modules the view renders, and the bridges' DriverPCIePort.
	Drivers []string
}

// Options shape a plan.
type Options struct {
	// ContainerRoot is where containers mount the overlay; default /opt/nvml-mock.
	ContainerRoot string
	// Host gives local_cpus its CPUs; the zero value means one CPU.
	Host HostCPUs
	// HostDevices are the node's own PCI devices to list beside the mock ones.
	HostDevices []HostDevice
	// HostSysfs is where HostDevices live on the host; default /sys.
	HostSysfs string
	// Writable plans the tree a writable mode serves: every mock driver's
	// directory with its bind and unbind files, the bus's drivers_probe,
	// links to HostDrivers, and driver links that also resolve at
	// /sys/bus/pci/drivers. The zero value plans the rendered tree.
	Writable bool
	// HostDrivers are the node's own PCI drivers, which a writable tree
	// lists beside the mock ones.
	HostDrivers []string
	// Written is the state writes gave the functions; nil is the profile's.
	Written WrittenState
	// HostModules are the node's own modules (ReadHostModules), which the
	// module view links beside the tree's; none without them.
	HostModules []string
	// HostProcModules are the lines of the node's own /proc/modules
	// (ReadHostProcModules), which the rendered proc/modules lists before
	// ours; none on a kernel without loadable modules.
	HostProcModules []string
	// HostProcDevices is the node's own /proc/devices
	// (ReadHostProcDevices), whose majors the rendered proc/devices lists
	// beside the NVIDIA modules'; the zero value has none.
	HostProcDevices ProcDevices
}

// New plans the overlay for a machine.
func New(m *profile.Machine, opts Options) (*Plan, error) {
	opts.ContainerRoot = cmp.Or(opts.ContainerRoot, DefaultContainerRoot)
	if err := ValidateContainerRoot(opts.ContainerRoot); err != nil {
		return nil, err
	}
	opts.HostSysfs = cmp.Or(opts.HostSysfs, DefaultHostSysfs)
	if opts.Host.Possible == 0 {
		opts.Host = SingleCPU()
	}
	reserved := HostAddresses(opts.HostDevices)
	for _, h := range opts.HostDevices {
		for _, d := range m.Devices {
			if d.Address == h.Address {
				return nil, &HostDevicesError{Reason: fmt.Sprintf("mock %s %s collides with host device %s (%s)", d.Kind, d.Address, h.Address, h.Target)}
			}
		}
	}
	t, err := BuildTree(m, BuildOptions{Reserved: reserved, ReservedBuses: hostBusRanges(opts.HostDevices)})
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", m.Source, err)
	}
	fillBridgeLinks(t)
	assignBARs(t)
	// Virtual functions come after the BARs: the kernel sizes a physical
	// function's VF BARs at boot, so enabling them moves no one else's.
	if err := addVFs(t, m, opts.Written); err != nil {
		return nil, fmt.Errorf("plan %s: %w", m.Source, err)
	}
	b := newBuilder(opts, t)
	b.machine = m
	if err := b.build(m); err != nil {
		return nil, fmt.Errorf("plan %s: %w", m.Source, err)
	}
	return &Plan{Machine: m, Tree: t, ContainerRoot: opts.ContainerRoot, HostDevices: opts.HostDevices, Entries: b.entries(), Functions: b.functions, Modules: moduleNames(b.loaded), HostModules: opts.HostModules, Drivers: b.drivers}, nil
}

// ValidateContainerRoot refuses a container root the loop link cannot serve.
func ValidateContainerRoot(p string) error {
	bad := func(why string) error { return fmt.Errorf("container root %q: %s", p, why) }
	if err := CheckAbsolutePath(p); err != nil {
		return bad(err.Error())
	}
	first := strings.Split(strings.TrimPrefix(p, "/"), "/")[0]
	switch first {
	case "sys", "proc", "dev", "bin", "." + "staging", ProfileFile, path.Dir(ProductNameFile), HostSysDir:
		return bad("must not start at /" + first + ", which the overlay or the kernel uses")
	}
	return nil
}

// fillBridgeLinks gives each bridge the fastest link below it, as firmware
// trains a port to its device; a bridge with nothing below trains to Gen2 x1.
func fillBridgeLinks(t *Tree) {
	var fill func(n *Node) profile.Link
	fill = func(n *Node) profile.Link {
		if n.Role == Endpoint {
			return n.Link
		}
		l := profile.Link{}
		for _, c := range n.Children {
			cl := fill(c)
			l.MaxGen, l.MaxWidth = max(l.MaxGen, cl.MaxGen), max(l.MaxWidth, cl.MaxWidth)
		}
		if l.MaxGen == 0 {
			l = profile.Link{MaxGen: 2, MaxWidth: 1}
		}
		l.CurrentGen, l.CurrentWidth = l.MaxGen, l.MaxWidth
		n.Link = l
		return l
	}
	for _, rc := range t.RootComplexes {
		for _, n := range rc.Children {
			fill(n)
		}
	}
}

// builder collects entries in phases, each in a deterministic order.
type builder struct {
	opts    Options
	machine *profile.Machine
	tree    *Tree
	dirs    map[string]bool
	shadows map[string]bool // host-device shadow links already planned
	content []byte          // the current chunk of small files' contents
	files   []Entry         // directories and files, parents first
	inTree  []Entry         // symlinks inside the device tree
	bridges []Entry         // links-directory entries of bridges and host devices
	ends    []Entry         // links-directory entries of endpoints
	vfio    int             // the profile's vfio-pci devices so far: the next vfio-dev/vfioN
	// functions is what each function shows, for Plan.Functions.
	functions map[pciaddr.Address]*Function
	loaded    []KernelModule // the module view's modules: Plan.Modules, proc/modules
	drivers   []string       // the drivers listed, for Plan.Drivers
}

// Entries a node brings, at most: its directory and ~25 attribute files,
// an IOMMU group directory with its type file and devices directory, links.
const (
	filesPerNode  = 32
	inTreePerNode = 4
)

// newBuilder sizes the phases up front: growing slices of large entries
// was most of the planning time for big machines.
func newBuilder(opts Options, t *Tree) *builder {
	n := len(t.Nodes())
	return &builder{
		opts:      opts,
		tree:      t,
		dirs:      make(map[string]bool, 4*n),
		shadows:   map[string]bool{},
		functions: make(map[pciaddr.Address]*Function, n),
		// files is the front of the final entry list: room for every
		// phase, so that entries() appends the small ones in place.
		files:   make([]Entry, 0, (filesPerNode+inTreePerNode+2)*n+2*len(opts.HostDevices)+16),
		inTree:  make([]Entry, 0, inTreePerNode*n+len(opts.HostDevices)+1),
		bridges: make([]Entry, 0, n+len(opts.HostDevices)),
		ends:    make([]Entry, 0, n),
	}
}

// entries puts the phases in order. Copying all of them into a new slice
// cost a quarter of planning a large machine, in the garbage collector's
// write barriers; the bulk stays where it is.
func (b *builder) entries() []Entry {
	out := append(b.files, b.inTree...)
	out = append(out, b.bridges...)
	return append(out, b.ends...)
}

func (b *builder) dir(p string) {
	if p == "." || b.dirs[p] {
		return
	}
	if parent := path.Dir(p); parent != "." {
		b.dir(parent)
	}
	b.dirs[p] = true
	b.files = append(b.files, Entry{Path: p, Kind: Dir, Mode: 0o755})
}

func (b *builder) file(p string, data []byte) { b.fileMode(p, data, 0o644) }

func (b *builder) fileMode(p string, data []byte, mode fs.FileMode) {
	b.dir(path.Dir(p))
	b.files = append(b.files, Entry{Path: p, Kind: File, Mode: mode, Data: data})
}

// contentChunk is how much file content builder.store packs into one
// allocation: most attribute files are a few bytes, and two allocations per
// file were most of what planning a large machine allocated.
const contentChunk = 64 << 10

// store appends a file's content to the current chunk and returns it, capped
// so that later appends never write into it.
func (b *builder) store(fill func([]byte) []byte) []byte {
	if cap(b.content)-len(b.content) < 2048 {
		b.content = make([]byte, 0, contentChunk)
	}
	start := len(b.content)
	b.content = fill(b.content)
	return b.content[start:len(b.content):len(b.content)]
}

func (b *builder) text(dir, name, s string) {
	b.file(dir+"/"+name, b.store(func(buf []byte) []byte { return append(buf, s...) }))
}

// hex adds a file holding 0x and v in digits hex digits, as the kernel
// prints ids and classes.
func (b *builder) hex(dir, name string, v uint64, digits int) {
	b.file(dir+"/"+name, b.store(func(buf []byte) []byte { return appendHex(buf, v, digits) }))
}

// decimal adds a file holding v in decimal.
func (b *builder) decimal(dir, name string, v int) {
	b.file(dir+"/"+name, b.store(func(buf []byte) []byte { return append(strconv.AppendInt(buf, int64(v), 10), '\n') }))
}

func link(p, target string) Entry { return Entry{Path: p, Kind: Symlink, Target: target} }

func (b *builder) build(m *profile.Machine) error {
	b.dir(LinksDir)
	effective, err := profile.MarshalJSON(m.Effective())
	if err != nil {
		return err
	}
	b.file(ProfileFile, effective)
	if m.ProductName != "" {
		b.text(path.Dir(ProductNameFile), path.Base(ProductNameFile), m.ProductName+"\n")
	}

	// The loop link: <root>/<container root> -> <root>.
	rel := strings.TrimPrefix(b.opts.ContainerRoot, "/")
	levels := strings.Count(rel, "/")
	loop := "."
	if levels > 0 {
		loop = strings.TrimSuffix(strings.Repeat("../", levels), "/")
	}
	if parent := path.Dir(rel); parent != "." {
		b.dir(parent)
	}
	b.inTree = append(b.inTree, link(rel, loop))

	multi := multiFunctionDevices(b.tree)
	for _, rc := range b.tree.RootComplexes {
		b.dir("sys/devices/" + rc.ID.String())
	}
	bridges := false
	for _, n := range b.tree.Nodes() {
		b.node(n, multi[devKey(n.Address)])
		bridges = bridges || n.Role.IsBridge()
	}
	if b.opts.Writable {
		b.writableFiles(bridges)
	}
	// After every driver directory is planned: the view follows them.
	if err := b.modules(); err != nil {
		return err
	}
	if err := b.procFiles(); err != nil {
		return err
	}
	return b.hostDevices()
}

func devKey(a pciaddr.Address) [3]uint16 { return [3]uint16{a.Domain, uint16(a.Bus), uint16(a.Device)} }

// multiFunctionDevices are the devices with more than one function. A
// virtual function does not count: the physical function's header is what
// the hardware made it, whatever VFs are enabled.
func multiFunctionDevices(t *Tree) map[[3]uint16]bool {
	count := map[[3]uint16]int{}
	for _, n := range t.Nodes() {
		if n.PhysFn != nil {
			continue
		}
		count[devKey(n.Address)]++
	}
	multi := map[[3]uint16]bool{}
	for k, c := range count {
		multi[k] = c > 1
	}
	return multi
}

// upToSys climbs from dir, a directory of the overlay's sys/ tree
// ("sys/..."), back to sys/.
func upToSys(dir string) string { return sysfs.Up(strings.Count(dir, "/")) }

// irq is the function's legacy interrupt line: its irq file, its config
// space's interrupt line, and the IRQ the NVIDIA driver's information file
// prints (pci_dev->irq, as the irq file).
func (n *Node) irq() int { return 24 + n.ordinal%200 }

func (b *builder) node(n *Node, multiFunction bool) {
	dir := "sys/" + n.SysPath()
	bdf := n.Address.String()
	b.dir(dir)
	id := n.Identity
	irq := n.irq()
	st := b.state(n)
	driver := st.Driver
	cpus := b.opts.Host.cpusOf(n.NUMANode)
	b.hex(dir, "vendor", uint64(id.Vendor), 4)
	b.hex(dir, "device", uint64(id.Device), 4)
	b.hex(dir, "subsystem_vendor", uint64(id.SubsystemVendor), 4)
	b.hex(dir, "subsystem_device", uint64(id.SubsystemDevice), 4)
	b.hex(dir, "class", uint64(id.Class), 6)
	b.hex(dir, "revision", uint64(id.Revision), 2)
	b.decimal(dir, "irq", irq)
	b.decimal(dir, "numa_node", n.NUMANode)
	b.text(dir, "modalias", modalias(id)+"\n")
	b.text(dir, "resource", resourceFile(n))
	b.file(dir+"/config", configSpace(n, irq, multiFunction))
	b.text(dir, "enable", "1\n")
	b.text(dir, "d3cold_allowed", "1\n")
	b.text(dir, "power_state", "D0\n")
	b.text(dir, "uevent", uevent(n, driver))
	b.text(dir, "local_cpus", cpuMask(cpus, b.opts.Host.Possible)+"\n")
	b.text(dir, "local_cpulist", cpus.String()+"\n")
	b.text(dir, "current_link_speed", sysfs.LinkSpeed(n.Link.CurrentGen)+"\n")
	b.text(dir, "max_link_speed", sysfs.LinkSpeed(n.Link.MaxGen)+"\n")
	b.decimal(dir, "current_link_width", n.Link.CurrentWidth)
	b.decimal(dir, "max_link_width", n.Link.MaxWidth)
	if n.Role.IsBridge() {
		b.decimal(dir, "secondary_bus_number", int(n.Secondary))
		b.decimal(dir, "subordinate_bus_number", int(n.Subordinate))
	}
	// What the kernel writes alike for every function it has not been told
	// otherwise about; fidelity lists the rest as gaps.
	b.text(dir, "broken_parity_status", "0\n")
	b.text(dir, "msi_bus", "1\n")
	b.text(dir, "ari_enabled", "0\n")
	// A function bound to vfio-pci has the vfio-dev/vfioN entry the
	// kernel adds for its iommufd character device.
	if driver == profile.DriverVFIO {
		b.vfioDev(dir, st.VFIODev)
	}
	b.text(dir, "driver_override", cmp.Or(st.Override, "(null)")+"\n")
	b.sriovFiles(n, dir, st.NumVFs)
	b.inTree = append(b.inTree, link(dir+"/subsystem", upToSys(dir)+"bus/pci"))
	if driver != "" {
		ddir := DriversDir + "/" + driver
		b.dir(ddir)
		b.inTree = append(b.inTree,
			link(dir+"/driver", upToSys(dir)+"bus/pci/drivers/"+driver),
			link(ddir+"/"+bdf, b.driverLinkTarget(ddir, n)))
	}
	b.functions[n.Address] = &Function{
		Address: n.Address, Dir: dir, Native: nativeDriver(n),
		ID:    fmt.Sprintf("%04x:%04x", n.Identity.Vendor, n.Identity.Device),
		State: st, TotalVFs: n.TotalVFs, VFs: n.vfAddresses,
	}
	group := strconv.Itoa(n.ordinal)
	gdir := IOMMUGroupsDir + "/" + group
	b.text(gdir, "type", "DMA\n")
	b.dir(gdir + "/devices")
	b.inTree = append(b.inTree,
		link(dir+"/iommu_group", upToSys(dir)+"kernel/iommu_groups/"+group),
		link(gdir+"/devices/"+bdf, upToSys(gdir+"/devices")+n.SysPath()))

	entry := LinksDir + "/" + bdf
	if n.Role.IsBridge() {
		b.bridges = append(b.bridges, link(entry, EscapedTarget(b.opts.ContainerRoot, n.SysPath())))
		return
	}
	b.ends = append(b.ends, link(entry, AnchoredTarget(n.Anchor.Address, n.SysPath())))
}

// state is the writable state n shows: the written state's where it names n,
// else the profile's. The profile's vfio-pci devices are numbered in plan
// order, each keeping its number whatever writes do to the others.
func (b *builder) state(n *Node) FunctionState {
	profileDriver := driverOf(n)
	st := FunctionState{Driver: profileDriver}
	if profileDriver == profile.DriverVFIO {
		// As the GPU Operator's vfio-manager leaves it: bound through
		// driver_override.
		st.Override, st.VFIODev = profileDriver, b.vfio
		b.vfio++
	}
	if ws, ok := b.opts.Written[n.Address]; ok {
		return ws
	}
	return st
}

// vfioDev adds the sysfs.VFIODevDir entry of a vfio-pci device at dir,
// the n-th; dev and uevent carry its number, as in /sys/class/vfio-dev.
func (b *builder) vfioDev(dir string, n int) {
	name := sysfs.VFIODevName(n)
	vdir := dir + "/" + sysfs.VFIODevDir + "/" + name
	b.dir(vdir)
	b.text(vdir, "dev", fmt.Sprintf("%d:%d\n", sysfs.VFIODevMajor, n))
	b.text(vdir, "uevent", fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=vfio/devices/%s\n", sysfs.VFIODevMajor, n, name))
}

// EscapedTarget is the plain form: out of sysfs and into the overlay at the
// container root. deviceattribute's pcieRoot rejects it, so only bridges,
// whose pcieRoot nobody asks, use it.
func EscapedTarget(containerRoot, sysPath string) string {
	return sysfs.Up(sysfs.LinksDepth) + strings.TrimPrefix(containerRoot, "/") + "/sys/" + sysPath
}

// AnchoredTarget is the two-step link text: through the anchor's entry, up to
// sys/, down to the device.
func AnchoredTarget(anchor pciaddr.Address, sysPath string) string {
	return anchor.String() + "/" + sysfs.Up(sysfs.LinksDepth) + sysPath
}

// hostDevices lists the node's own devices with the kernel's link text, which
// resolves into the real /sys/devices in a container. On the host, the same
// text lands in the overlay's sys/devices, so a link there leads on to the
// host's real directory.
func (b *builder) hostDevices() error {
	for _, h := range b.opts.HostDevices {
		p, err := h.SysPath()
		if err != nil {
			return err
		}
		b.bridges = append(b.bridges, link(LinksDir+"/"+h.Address.String(), h.Target))
		// Shadow at the first path element the overlay does not have.
		parts := strings.Split(p, "/")
		for i := 2; i <= len(parts); i++ {
			at := "sys/" + strings.Join(parts[:i], "/")
			if b.dirs[at] {
				continue
			}
			if !b.shadows[at] {
				b.shadows[at] = true
				b.inTree = append(b.inTree, link(at, path.Join(b.opts.HostSysfs, strings.Join(parts[:i], "/"))))
			}
			break
		}
	}
	return nil
}

// Digest identifies the plan's content: equal plans have equal digests.
func (p *Plan) Digest() string {
	h := sha256.New()
	var n [8]byte
	for _, e := range p.Entries {
		h.Write([]byte(e.Path))
		h.Write([]byte{0, byte(e.Kind)})
		binary.LittleEndian.PutUint32(n[:4], uint32(e.Mode))
		h.Write(n[:4])
		binary.LittleEndian.PutUint64(n[:], uint64(e.Len()))
		h.Write(n[:])
		h.Write(e.Data)
		if e.Source != nil {
			h.Write([]byte(e.Source.Fingerprint))
		}
		h.Write([]byte(e.Target))
		h.Write([]byte{0})
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil))
}
