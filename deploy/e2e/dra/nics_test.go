package dra_test

// The network side of TestDRA: dranet (kubernetes-sigs/dranet), the DRA
// driver of network devices, runs beside the NVIDIA driver on the same
// node, served the same tree, and the scheduler is asked for a GPU and a
// NIC on one PCIe root (and one NUMA node) across the two drivers: what
// resource.kubernetes.io/pcieRoot exists for. docs/user/gpus-and-nics.md
// is the user's page of it.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

const (
	// nicDriver is dranet's driver name, and its attributes' domain.
	nicDriver = "dra.net"
	// hcaClass selects dranet's Mellanox functions: the profile's HCAs.
	// The node's own NICs are dranet devices too, on root ids a profile
	// may use as well (pci0000:00), so a class of every NIC could align
	// a mock GPU with the node's virtio NIC (checkNodeNIC). dranet
	// publishes the vendor's name, not its id, and not on every device
	// (a bridge has no PCI attributes): CEL must ask whether it is there
	// first, or the scheduler fails the pod with "no such key".
	hcaClass = "hca.dra.net"
	// anyNICClass selects every device dranet publishes: the class
	// checkNodeNIC shows aligning with the node's own NIC.
	anyNICClass = "nic.dra.net"
	// mellanox is the vendor dranet names from pci.ids for 15b3.
	mellanox = "Mellanox Technologies"
	// numaNodeAttribute is the standard attribute both drivers publish a
	// device's NUMA node in (deviceattribute's, for dranet).
	numaNodeAttribute = programs.NUMANodeAttribute
	// nicPCIAddress is dranet's attribute of a device's PCI address.
	nicPCIAddress = nicDriver + "/pciAddress"
)

// The checks of the GPUs' NUMA node (every profile) and of the HCAs
// (profiles with an infiniband block), each a row.
const (
	checkGPUNUMA          = "claim numaNode"
	checkGPUNUMATooMany   = "claim numaNode too-many"
	checkNICsNoTree       = "dranet without the tree"
	checkNICSlices        = "dranet slices"
	checkAlignRoot        = "GPU+HCA on each root"
	checkAlignRootMost    = "GPUs+HCA on one root"
	checkAlignRootTooMany = "GPUs+HCA too-many"
	checkAlignNUMA        = "GPU+HCA on each NUMA node"
	checkAlignNUMATooMany = "GPUs+HCA numaNode too-many"
	checkNodeNIC          = "the node's own NIC"
	checkNICPrepare       = "prepare GPU+HCA"
)

// nicChecks are the rows of a profile with HCAs that need dranet.
func nicChecks() []string {
	return []string{checkNICsNoTree, checkNICSlices, checkAlignRoot, checkAlignRootMost, checkAlignRootTooMany, checkAlignNUMA, checkAlignNUMATooMany, checkNodeNIC, checkNICPrepare}
}

// createNICClasses creates the DeviceClasses of dranet's devices.
func (s *suite) createNICClasses(t *testing.T) {
	t.Helper()
	s.c.CreateDeviceClass(t, hcaClass, `device.driver == "`+nicDriver+`" && "pciVendor" in device.attributes["`+nicDriver+`"] && device.attributes["`+nicDriver+`"].pciVendor == "`+mellanox+`"`)
	s.c.CreateDeviceClass(t, anyNICClass, `device.driver == "`+nicDriver+`"`)
}

// nicRow is what a profile's block of the matrix says of the HCAs.
type nicRow struct {
	hcas, published int
	noTree          string   // what dranet published without the tree
	perHCA          []string // "0000:1c:00.0 pci0000:00 numa 0"
	nodeNICs        string   // the node's own NICs dranet published
	claims          []string // "(what was asked) -> what it got"
	prepare         string
}

// hcaSubject is the profile's HCAs as the wing's reader states them
// (profilefacts: each GPU's HCAs, on its root complex), around the node's
// own devices, read from the node's /sys: not the render's plan, whose
// placement of the HCAs is what the rows judge.
type hcaSubject struct {
	// total is how many HCAs the profile gives its GPUs.
	total int
	// perRoot is how many sit on each root complex the profile places
	// GPUs carrying them on; numa is that root's NUMA node (-1: none).
	perRoot map[string]int
	numa    map[string]int
	// placed is whether the profile (or the suite's literal for its own
	// profile) places every GPU that carries HCAs; where neither does,
	// their root is the renderer's inference and only the count is judged.
	placed bool
	// host are the node's own devices' addresses.
	host map[string]bool
}

func newHCASubject(t *testing.T, facts *profilefacts.Profile) *hcaSubject {
	t.Helper()
	h := &hcaSubject{perRoot: map[string]int{}, numa: map[string]int{}, placed: true, host: map[string]bool{}}
	for _, g := range facts.GPUs {
		if g.HCAs == 0 {
			continue
		}
		h.total += g.HCAs
		if g.Root == "" {
			h.placed = false
			continue
		}
		h.perRoot[g.Root] += g.HCAs
		h.numa[g.Root] = numaOf(g)
	}
	entries, err := os.ReadDir("/sys/bus/pci/devices")
	require.NoError(t, err, "the node's own PCI devices")
	for _, e := range entries {
		h.host[strings.ToLower(e.Name())] = true
	}
	return h
}

// ours reports whether a dranet device is one of the tree's: a PCI
// function the node itself does not have.
func (h *hcaSubject) ours(d resourcev1.Device) bool { return !h.nodeOwn(d) }

// roots are the root complexes the profile puts HCAs on.
func (h *hcaSubject) roots() map[string]bool {
	out := map[string]bool{}
	for root := range h.perRoot {
		out[root] = true
	}
	return out
}

// startDranet runs dranet's kubelet plugin served root (empty: the node's
// own /sys) until stop. It is what dranet's DaemonSet runs, with the
// node's NRI socket where its stub dials (/var/run/nri/nri.sock), no
// cloud provider and no database (state in memory).
func (s *suite) startDranet(t *testing.T, root string) *kubetest.Process {
	t.Helper()
	return s.c.Start(t, kubetest.Program{
		Name: "dranet",
		Args: append([]string{s.dranet,
			"--hostname-override", kubetest.NodeName, "--kubeconfig", s.c.Kubeconfig,
			"--kubelet-root-dir", s.c.KubeletRootDir, "--db-path", "",
			"--cloud-provider-hint", "NONE", "--profile-provider", "none",
			"--bind-address", "127.0.0.1:0", "-v", "2"}, s.opts.driverGates()...),
		Served: &hosttest.Served{Root: root, Binds: []hosttest.Bind{{Source: filepath.Dir(s.c.Runtime.NRISocket), Target: "/run/nri"}}},
	})
}

// nodeOwn reports whether a dranet device is the node's own, not the
// tree's: a link with no PCI function (a bridge such as cni0), or one of
// the node's own PCI devices.
func (h *hcaSubject) nodeOwn(d resourcev1.Device) bool {
	a := nicAddress(d)
	return a == "" || h.host[a]
}

// nicAddress is a dranet device's PCI address, lower-case, or "".
func nicAddress(d resourcev1.Device) string {
	a, _ := kubetest.StringAttribute(d, nicPCIAddress)
	return strings.ToLower(a)
}

// publishNICs runs dranet without the tree (the negative control: none of
// the HCAs) and then served the tree, judges its devices, and leaves it
// running for the claims; it returns its devices by name.
func (s *suite) publishNICs(t *testing.T, x *subject, h *hcaSubject, r *nicRow, check func(string, string, func(*testing.T))) map[string]resourcev1.Device {
	r.hcas = h.total
	check(checkNICsNoTree, "none of the profile's HCAs, once the node's own NIC is published", func(t *testing.T) {
		proc := s.startDranet(t, "")
		var devices []resourcev1.Device
		s.c.Wait(t, "dranet, served the node's own /sys, publishes the node's own NIC", slicesTimeout, func() error {
			var err error
			if devices, err = s.published(t, proc, nicDriver); err != nil {
				return err
			}
			for _, d := range devices {
				if h.host[nicAddress(d)] {
					return nil
				}
			}
			return fmt.Errorf("%d devices, none the node's own PCI device", len(devices))
		})
		proc.Stop(t)
		s.c.Unpublish(t, nicDriver, slicesTimeout)
		var ours []string
		for _, d := range devices {
			if h.ours(d) {
				ours = append(ours, nicAddress(d))
			}
		}
		r.noTree = fmt.Sprintf("%d devices, %d not the node's own", len(devices), len(ours))
		require.Empty(t, ours, "dranet served the node's own /sys published PCI functions the node does not have")
	})

	proc := s.startDranet(t, x.served)
	t.Cleanup(func() {
		proc.Stop(t)
		s.c.Unpublish(t, nicDriver, slicesTimeout)
	})
	var devices []resourcev1.Device
	check(checkNICSlices, "a device per HCA, with its GPU's pcieRoot and NUMA node", func(t *testing.T) {
		s.c.Wait(t, fmt.Sprintf("%s: dranet's slices hold the %d HCAs", x.Name, h.total), slicesTimeout, func() error {
			var err error
			if devices, err = s.published(t, proc, nicDriver); err != nil {
				return err
			}
			n := 0
			for _, d := range devices {
				if h.ours(d) {
					n++
				}
			}
			if n != h.total {
				return fmt.Errorf("%d of %d HCAs among %d devices", n, h.total, len(devices))
			}
			return nil
		})
		judgeNICs(t, h, devices, r)
	})
	byName := map[string]resourcev1.Device{}
	for _, d := range devices {
		byName[d.Name] = d
	}
	return byName
}

// judgeNICs requires the HCAs published on each root complex to be the
// ones the profile puts there, with that root's NUMA node (none where the
// profile has -1), and notes the node's own NICs and their roots. Where
// neither the profile nor a literal places every GPU that carries HCAs,
// their root is the renderer's inference: only their count is judged, and
// the row says so.
func judgeNICs(t *testing.T, h *hcaSubject, devices []resourcev1.Device, r *nicRow) {
	t.Helper()
	var own []string
	got := map[string]int{}
	for _, d := range devices {
		a := nicAddress(d)
		root, _ := kubetest.StringAttribute(d, programs.PCIeRootAttribute)
		if !h.ours(d) {
			if h.host[a] {
				vendor, _ := kubetest.StringAttribute(d, nicDriver+"/pciVendor")
				own = append(own, fmt.Sprintf("%s on %s (%s)", a, root, vendor))
			}
			continue
		}
		r.published++
		got[root]++
		numa := "not judged"
		if h.placed {
			want, ok := h.numa[root]
			if !ok {
				t.Errorf("HCA %s (%s) on %q, a root the profile puts no HCA on", d.Name, a, root)
				want = -1
			}
			var err error
			if numa, err = judgeNUMA(d, want); err != nil {
				t.Errorf("HCA %s (%s): %v", d.Name, a, err)
			}
		}
		r.perHCA = append(r.perHCA, fmt.Sprintf("%s %s numa %s", a, root, numa))
	}
	if h.placed {
		if !maps.Equal(got, h.perRoot) {
			t.Errorf("HCAs per pcieRoot %v, want the profile's %v (each GPU's HCAs on its root)", got, h.perRoot)
		}
	} else {
		r.perHCA = append(r.perHCA, "roots not judged: the profile does not place every GPU carrying them, the renderer does")
	}
	slices.Sort(r.perHCA)
	r.nodeNICs = strings.Join(own, ", ")
}

// numaNodes are the NUMA nodes a device's standard attribute names: the
// scalar, or the list form (KEP-6072's: the device's own node first, then
// equally local ones); none where it has no such attribute.
func numaNodes(d resourcev1.Device) ([]int, error) {
	a, ok := d.Attributes[resourcev1.QualifiedName(numaNodeAttribute)]
	switch {
	case !ok:
		return nil, nil
	case a.IntValue != nil:
		return []int{int(*a.IntValue)}, nil
	case len(a.IntValues) > 0:
		var out []int
		for _, v := range a.IntValues {
			out = append(out, int(v))
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s is neither an int nor a list of ints: %+v", numaNodeAttribute, a)
}

// judgeNUMA requires the standard NUMA attribute of a device to hold the
// profile's node, or to be absent where the profile has -1; it returns
// the value as the matrix shows it.
func judgeNUMA(d resourcev1.Device, want int) (string, error) {
	nodes, err := numaNodes(d)
	switch {
	case err != nil:
		return "", err
	case want < 0 && nodes != nil:
		return "", fmt.Errorf("%s %v, but the profile gives it no NUMA node (-1)", numaNodeAttribute, nodes)
	case want >= 0 && !slices.Contains(nodes, want):
		return "", fmt.Errorf("%s %v, want the profile's NUMA node %d", numaNodeAttribute, nodes, want)
	case nodes == nil:
		return "none", nil
	case len(nodes) == 1 && d.Attributes[resourcev1.QualifiedName(numaNodeAttribute)].IntValue != nil:
		return fmt.Sprint(nodes[0]), nil
	}
	return fmt.Sprint(nodes), nil
}

// notApplicable is the cell of a check the profile or the driver gives
// nothing to judge: a row not run, saying why, which make test counts.
func notApplicable(why string) string { return programs.NotRunPrefix + why }

// noGPUNUMA is why the numaNode rows of GPUs are not run, or "" where
// they must be judged: the profile gives no GPU a NUMA node, or the
// driver's binary never names the standard attribute (the version does
// not publish it). A driver that names it and publishes none on a GPU
// the profile places on a NUMA node has lost the tree's numa_node: the
// rows are judged, and turn red.
func (s *suite) noGPUNUMA(x *subject) string {
	switch {
	case !slices.ContainsFunc(x.gpus, onNUMANode):
		return "the profile gives no GPU a NUMA node"
	case !s.driverNUMA:
		return "this gpu-kubelet-plugin never names " + numaNodeAttribute + ": its version publishes no NUMA attribute on a GPU"
	}
	return ""
}

// request is one request of a claim: count devices of a class, with a CEL
// selector of its own where set.
type request struct {
	name, class string
	count       int
	selector    string
}

// gpus is a request for n GPUs; hca one for an HCA of class, selected by
// the CEL expression sel ("": any).
func gpus(n int) request { return request{name: "gpus", class: deviceClass, count: n} }
func hca(class, sel string) request {
	return request{name: "nic", class: class, count: 1, selector: sel}
}

// createClaim creates a claim of the requests whose devices must all
// share the attribute.
func (s *suite) createClaim(t *testing.T, name, attribute string, reqs ...request) *resourcev1.ResourceClaim {
	t.Helper()
	var rs []resourcev1.DeviceRequest
	var names []string
	for _, q := range reqs {
		e := &resourcev1.ExactDeviceRequest{DeviceClassName: q.class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(q.count)}
		if q.selector != "" {
			e.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: q.selector}}}
		}
		rs = append(rs, resourcev1.DeviceRequest{Name: q.name, Exactly: e})
		names = append(names, q.name)
	}
	c, err := s.c.Client.ResourceV1().ResourceClaims(namespace).Create(context.Background(), &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests:    rs,
			Constraints: []resourcev1.DeviceConstraint{{Requests: names, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(attribute))}},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "create claim %s", name)
	return c
}

// asked is one claim of a round: its name, what it asks in words, and
// its requests.
type asked struct {
	name, what, attribute string
	reqs                  []request
}

// round is what a round of claims came to, as the API server returned it.
type round struct {
	claims map[string]*resourcev1.ResourceClaim
	pods   map[string]*corev1.Pod
}

// allocate creates the claims, each held by a pod of its own, waits until
// each is allocated or its pod unschedulable, and returns them as the API
// server returned them; judged gets the lists, for bin/k8s/<profile>/.
// The pods and claims are deleted when it returns, so the next round
// finds every device free.
func (s *suite) allocate(t *testing.T, judged map[string][]byte, claims ...asked) round {
	t.Helper()
	var names []string
	for _, a := range claims {
		s.createClaim(t, a.name, a.attribute, a.reqs...)
		s.holdPod(t, a.name, a.name)
		names = append(names, a.name)
	}
	defer s.remove(t, names, names)
	for _, name := range names {
		s.c.Wait(t, fmt.Sprintf("claim %s allocated or its pod unschedulable", name), podTimeout, func() error {
			c, err := s.c.Client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if c.Status.Allocation != nil {
				return nil
			}
			p, err := s.c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if notScheduled(p) != "" {
				return nil
			}
			return fmt.Errorf("claim %s: not allocated, pod %s %s", name, name, p.Status.Phase)
		})
	}
	// This round's lists, judged here and kept beside the rounds before.
	lists := map[string][]byte{}
	for _, file := range []string{"resourceclaims.json", "pods.json"} {
		b, err := s.list(file)
		require.NoError(t, err, "%s", file)
		lists[file] = b
		judged[file], err = appendItems(judged[file], b)
		require.NoError(t, err, "%s", file)
	}
	out := round{claims: map[string]*resourcev1.ResourceClaim{}, pods: map[string]*corev1.Pod{}}
	var cl resourcev1.ResourceClaimList
	require.NoError(t, json.Unmarshal(lists["resourceclaims.json"], &cl))
	for i := range cl.Items {
		out.claims[cl.Items[i].Name] = &cl.Items[i]
	}
	var pl corev1.PodList
	require.NoError(t, json.Unmarshal(lists["pods.json"], &pl))
	for i := range pl.Items {
		out.pods[pl.Items[i].Name] = &pl.Items[i]
	}
	return out
}

// notScheduled is why the scheduler did not place the pod, reason and
// message, or "": unschedulable, the answer to a claim no device set
// fits, or an error of its own (a CEL selector that failed on a device),
// which a claim waiting for it would never outlive.
func notScheduled(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// appendItems adds the items of the list b to those of the list a (nil:
// b itself): a profile's rounds of claims, each as the API server
// returned it when its round was judged, in one file. Every claim of a
// profile has a name of its own, so no item stands for another.
func appendItems(a, b []byte) ([]byte, error) {
	if a == nil {
		return b, nil
	}
	var la, lb map[string]json.RawMessage
	if err := json.Unmarshal(a, &la); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &lb); err != nil {
		return nil, err
	}
	var ia, ib []json.RawMessage
	if err := json.Unmarshal(la["items"], &ia); err != nil && la["items"] != nil {
		return nil, err
	}
	if err := json.Unmarshal(lb["items"], &ib); err != nil && lb["items"] != nil {
		return nil, err
	}
	items, err := json.Marshal(append(ia, ib...))
	if err != nil {
		return nil, err
	}
	la["items"] = items
	return json.Marshal(la)
}

// got is what a claim came to: the devices allocated, or why the
// scheduler did not place its pod.
type got struct {
	devices []resourcev1.DeviceRequestAllocationResult
	pending string
}

func (r round) got(t *testing.T, name string) got {
	t.Helper()
	c := r.claims[name]
	require.NotNil(t, c, "claim %s", name)
	if c.Status.Allocation != nil {
		return got{devices: c.Status.Allocation.Devices.Results}
	}
	p := r.pods[name]
	require.NotNil(t, p, "pod %s", name)
	return got{pending: notScheduled(p)}
}

// attributes looks up the attribute of allocated devices, by driver and
// device name, in the devices each driver published.
type attributes map[string]map[string]resourcev1.Device

func (a attributes) value(res resourcev1.DeviceRequestAllocationResult, name string) string {
	d, ok := a[res.Driver][res.Device]
	if !ok {
		return "?"
	}
	if v, ok := kubetest.StringAttribute(d, name); ok {
		return v
	}
	if name == numaNodeAttribute {
		if nodes, err := numaNodes(d); err == nil && nodes != nil {
			return fmt.Sprint(nodes[0])
		}
	}
	return "none"
}

// oneValue requires the claim allocated and every device of it to share
// one value of the attribute, and says what it got.
func (a attributes) oneValue(t *testing.T, g got, name, attribute string) (string, string) {
	t.Helper()
	require.NotNil(t, g.devices, "claim %s must be allocated; its pod: %s", name, g.pending)
	values := map[string]bool{}
	var said []string
	for _, res := range g.devices {
		v := a.value(res, attribute)
		values[v] = true
		said = append(said, fmt.Sprintf("%s %s", res.Device, v))
	}
	require.Len(t, values, 1, "claim %s: its devices share one %s: %v", name, attribute, said)
	return slices.Collect(maps.Keys(values))[0], strings.Join(said, ", ")
}

// pendingWithReason requires the claim left unallocated with the
// scheduler's reason, and says it.
func pendingWithReason(t *testing.T, g got, name string) string {
	t.Helper()
	require.Nil(t, g.devices, "claim %s must not be allocated", name)
	require.True(t, strings.HasPrefix(g.pending, corev1.PodReasonUnschedulable+": "), "claim %s: its pod is not unschedulable: %s", name, g.pending)
	require.Contains(t, g.pending, kubetest.DRAUnschedulable, "claim %s: the scheduler's reason", name)
	return g.pending
}

// gpuNUMA checks claims of GPUs alone matched on numaNode, where the
// driver publishes it: as many GPUs as the largest NUMA node holds, on
// one node, and one more, pending. Where it publishes none on any GPU,
// the rows say so.
func (s *suite) gpuNUMA(t *testing.T, x *subject, r *row, judged map[string][]byte, check func(string, string, func(*testing.T))) {
	perNode := map[int]int{}
	for _, g := range x.gpus {
		if onNUMANode(g) {
			perNode[g.NUMANode]++
		}
	}
	if why := s.noGPUNUMA(x); why != "" {
		for _, c := range []string{checkGPUNUMA, checkGPUNUMATooMany} {
			check(c, "", func(t *testing.T) { s.checks.NotRun(t, notApplicable(why)) })
		}
		r.numaClaims = append(r.numaClaims, "(GPUs, one numaNode) -> "+notApplicable(why))
		return
	}
	most := slices.Max(slices.Collect(maps.Values(perNode)))
	res := s.allocate(t, judged,
		asked{name: "numa-fit", attribute: numaNodeAttribute, reqs: []request{gpus(most)}},
		asked{name: "numa-too-many", attribute: numaNodeAttribute, reqs: []request{gpus(most + 1)}})
	attrs := attributes{driverName: r.gpuDevices}
	check(checkGPUNUMA, fmt.Sprintf("%s allocated on one numaNode, a largest", count(most, "GPU")), func(t *testing.T) {
		g := res.got(t, "numa-fit")
		node, said := attrs.oneValue(t, g, "numa-fit", numaNodeAttribute)
		require.Len(t, g.devices, most)
		r.numaClaims = append(r.numaClaims, fmt.Sprintf("(%s, one numaNode) -> %s: node %s", count(most, "GPU"), said, node))
	})
	check(checkGPUNUMATooMany, "pending, with the scheduler's reason", func(t *testing.T) {
		r.numaClaims = append(r.numaClaims, fmt.Sprintf("(%s, one numaNode) -> %s", count(most+1, "GPU"), pendingWithReason(t, res.got(t, "numa-too-many"), "numa-too-many")))
	})
}

// alignNICs asks the scheduler for GPUs and an HCA across the two
// drivers, aligned on pcieRoot and then on numaNode, and tries a pod
// with an aligned claim.
func (s *suite) alignNICs(t *testing.T, x *subject, h *hcaSubject, r *row, nics map[string]resourcev1.Device, judged map[string][]byte, check func(string, string, func(*testing.T))) {
	attrs := attributes{driverName: r.gpuDevices, nicDriver: nics}
	n := r.nics
	// The roots and NUMA nodes that have an HCA, and the GPUs on each.
	hcaRoots, hcaNodes := h.roots(), map[int]bool{}
	for _, node := range h.numa {
		if node >= 0 {
			hcaNodes[node] = true
		}
	}
	gpusOnNode := map[int]int{}
	for _, g := range x.gpus {
		gpusOnNode[numaOf(g)]++
	}
	mostBesideHCA := 0
	for root := range hcaRoots {
		mostBesideHCA = max(mostBesideHCA, x.perRoot[root])
	}
	// A device may lack either attribute (an HCA on NUMA node -1 has no
	// numaNode): CEL must ask first, or the scheduler errs on it ("no
	// such key") instead of passing it over.
	onRoot := func(root string) string {
		return `"pcieRoot" in device.attributes["resource.kubernetes.io"] && device.attributes["resource.kubernetes.io"].pcieRoot == "` + root + `"`
	}
	onNode := func(node int) string {
		// The list form (KEP-6072) is a list in CEL too.
		if s.opts.listAttributes() {
			return fmt.Sprintf(`"numaNode" in device.attributes["resource.kubernetes.io"] && %d in device.attributes["resource.kubernetes.io"].numaNode`, node)
		}
		return fmt.Sprintf(`"numaNode" in device.attributes["resource.kubernetes.io"] && device.attributes["resource.kubernetes.io"].numaNode == %d`, node)
	}

	// One claim per root with an HCA, its HCA picked on that root: the
	// GPU must follow it there across the drivers.
	var perRoot []asked
	for _, root := range slices.Sorted(maps.Keys(hcaRoots)) {
		perRoot = append(perRoot, asked{name: "align-" + strings.ReplaceAll(root, ":", "-"), what: "1 GPU + the HCA on " + root, attribute: programs.PCIeRootAttribute,
			reqs: []request{gpus(1), hca(hcaClass, onRoot(root))}})
	}
	res := s.allocate(t, judged, perRoot...)
	check(checkAlignRoot, "each: the GPU on the HCA's pcieRoot", func(t *testing.T) {
		for _, a := range perRoot {
			root, said := attrs.oneValue(t, res.got(t, a.name), a.name, programs.PCIeRootAttribute)
			require.Equal(t, strings.TrimPrefix(a.what, "1 GPU + the HCA on "), root)
			n.claims = append(n.claims, fmt.Sprintf("(%s, pcieRoot) -> %s", a.what, said))
		}
	})

	// As many GPUs as the fullest root with an HCA holds, and an HCA: it
	// must land on a root with an HCA, never on one without; one GPU more
	// stays pending.
	res = s.allocate(t, judged,
		asked{name: "align-most", attribute: programs.PCIeRootAttribute, reqs: []request{gpus(mostBesideHCA), hca(hcaClass, "")}},
		asked{name: "align-too-many", attribute: programs.PCIeRootAttribute, reqs: []request{gpus(mostBesideHCA + 1), hca(hcaClass, "")}})
	check(checkAlignRootMost, fmt.Sprintf("%s and an HCA on one pcieRoot that has an HCA", count(mostBesideHCA, "GPU")), func(t *testing.T) {
		root, said := attrs.oneValue(t, res.got(t, "align-most"), "align-most", programs.PCIeRootAttribute)
		require.True(t, hcaRoots[root], "claim align-most on %s, a root with no HCA", root)
		note := ""
		if len(hcaRoots) < len(x.perRoot) {
			note = fmt.Sprintf("; %d of %d roots have an HCA", len(hcaRoots), len(x.perRoot))
		}
		n.claims = append(n.claims, fmt.Sprintf("(%s + 1 HCA, pcieRoot) -> %s%s", count(mostBesideHCA, "GPU"), said, note))
	})
	check(checkAlignRootTooMany, "pending, with the scheduler's reason", func(t *testing.T) {
		n.claims = append(n.claims, fmt.Sprintf("(%s + 1 HCA, pcieRoot) -> %s", count(mostBesideHCA+1, "GPU"), pendingWithReason(t, res.got(t, "align-too-many"), "align-too-many")))
	})

	// The same on numaNode: a GPU beside the HCA of each NUMA node, and
	// more GPUs than the fullest node with an HCA holds, pending.
	var perNode []asked
	mostOnNode := 0
	for _, node := range slices.Sorted(maps.Keys(hcaNodes)) {
		perNode = append(perNode, asked{name: fmt.Sprintf("numa-align-%d", node), what: fmt.Sprintf("1 GPU + an HCA on NUMA node %d", node), attribute: numaNodeAttribute,
			reqs: []request{gpus(1), hca(hcaClass, onNode(node))}})
		mostOnNode = max(mostOnNode, gpusOnNode[node])
	}
	why := ""
	switch {
	case len(perNode) == 0:
		why = "the profile gives no HCA a NUMA node"
	default:
		why = s.noGPUNUMA(x)
	}
	if why != "" {
		for _, c := range []string{checkAlignNUMA, checkAlignNUMATooMany} {
			check(c, "", func(t *testing.T) { s.checks.NotRun(t, notApplicable(why)) })
		}
		n.claims = append(n.claims, "(GPU + HCA, numaNode) -> "+notApplicable(why))
	} else {
		res := s.allocate(t, judged, append(perNode, asked{name: "numa-align-too-many", attribute: numaNodeAttribute, reqs: []request{gpus(mostOnNode + 1), hca(hcaClass, "")}})...)
		check(checkAlignNUMA, "each: the GPU on the HCA's numaNode", func(t *testing.T) {
			for _, a := range perNode {
				node, said := attrs.oneValue(t, res.got(t, a.name), a.name, numaNodeAttribute)
				require.Equal(t, strings.TrimPrefix(a.what, "1 GPU + an HCA on NUMA node "), node)
				n.claims = append(n.claims, fmt.Sprintf("(%s, numaNode) -> %s", a.what, said))
			}
		})
		check(checkAlignNUMATooMany, "pending, with the scheduler's reason", func(t *testing.T) {
			n.claims = append(n.claims, fmt.Sprintf("(%s + 1 HCA, numaNode) -> %s", count(mostOnNode+1, "GPU"), pendingWithReason(t, res.got(t, "numa-align-too-many"), "numa-align-too-many")))
		})
	}

	s.nodeNIC(t, x, h, n, attrs, judged, check)
	s.prepareAligned(t, perRoot[0], n, check)
}

// nodeNIC shows why a claim must select the HCAs by vendor: the node's
// own NIC is a dranet device too, and where its root id is one a GPU of
// the profile has (pci0000:00), a class of every NIC aligns that GPU
// with it though they share no bus. The HCA class leaves it out.
func (s *suite) nodeNIC(t *testing.T, x *subject, h *hcaSubject, n *nicRow, attrs attributes, judged map[string][]byte, check func(string, string, func(*testing.T))) {
	check(checkNodeNIC, "the HCA class leaves it out; where its root id is a GPU's, a class of every NIC aligns them", func(t *testing.T) {
		// The first by name: a node with several NICs of its own judges the
		// same one every run, whatever the map's order.
		var own resourcev1.Device
		for _, name := range slices.Sorted(maps.Keys(attrs[nicDriver])) {
			d := attrs[nicDriver][name]
			if h.host[nicAddress(d)] {
				if _, ok := kubetest.StringAttribute(d, programs.PCIeRootAttribute); ok {
					own = d
					break
				}
			}
		}
		require.NotEmpty(t, own.Name, "dranet published none of the node's own PCI NICs with a pcieRoot")
		root, _ := kubetest.StringAttribute(own, programs.PCIeRootAttribute)
		addr := nicAddress(own)
		pin := `"pciAddress" in device.attributes["` + nicDriver + `"] && device.attributes["` + nicDriver + `"].pciAddress == "` + addr + `"`
		res := s.allocate(t, judged,
			asked{name: "node-nic-any", attribute: programs.PCIeRootAttribute, reqs: []request{gpus(1), hca(anyNICClass, pin)}},
			asked{name: "node-nic-hca", attribute: programs.PCIeRootAttribute, reqs: []request{gpus(1), hca(hcaClass, pin)}})
		pending := pendingWithReason(t, res.got(t, "node-nic-hca"), "node-nic-hca")
		line := fmt.Sprintf("the node's %s on %s: with %s pending (%s)", addr, root, hcaClass, pending)
		if x.perRoot[root] == 0 {
			pendingWithReason(t, res.got(t, "node-nic-any"), "node-nic-any")
			n.claims = append(n.claims, line+fmt.Sprintf("; no GPU of the profile on %s, so no class aligns one with it", root))
			return
		}
		// The hazard, seen: a mock GPU and the node's NIC "on one root".
		_, said := attrs.oneValue(t, res.got(t, "node-nic-any"), "node-nic-any", programs.PCIeRootAttribute)
		n.claims = append(n.claims, line+"; with "+anyNICClass+" aligned: "+said)
	})
}

// prepareAligned runs a pod with an aligned claim and says how far it
// got: the kubelet prepares each driver's devices, the NVIDIA driver's
// GPU by its CDI spec and dranet's HCA by moving its netdev into the pod,
// which a mock HCA has not. Where a driver refuses, the row holds its
// own words; the pod must then not run. verify runs in it, served the
// tree by serve --nri.
func (s *suite) prepareAligned(t *testing.T, a asked, n *nicRow, check func(string, string, func(*testing.T))) {
	check(checkNICPrepare, "the pod runs, or the kubelet reports the driver's own error", func(t *testing.T) {
		s.createClaim(t, a.name, a.attribute, a.reqs...)
		s.verifyPod(t, a.name, a.name, nil)
		defer s.remove(t, []string{a.name}, []string{a.name})
		var failed string
		pod := s.c.WaitPod(t, namespace, a.name, podTimeout, func(p *corev1.Pod) bool {
			if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed || notScheduled(p) != "" {
				return true
			}
			failed = s.prepareFailure(a.name)
			return failed != ""
		})
		require.Empty(t, notScheduled(pod), "pod %s: its claim (%s) was allocated in its own round", a.name, a.what)
		switch {
		case pod.Status.Phase == corev1.PodRunning:
			n.prepare = "pod runs: " + s.judgeVerify(t, pod, 1)
			return
		}
		require.NotEmpty(t, failed, "pod %s %s, with no prepare failure reported:\n%s", a.name, pod.Status.Phase, s.c.Events(namespace))
		n.prepare = fmt.Sprintf("(%s) -> not started; the kubelet: %s", a.what, failed)
	})
}

// prepareFailure is the kubelet's last warning about preparing the pod's
// claims, "" before there is one.
func (s *suite) prepareFailure(pod string) string {
	list, err := s.c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return ""
	}
	var last *corev1.Event
	for i := range list.Items {
		e := &list.Items[i]
		if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "prepare") && (last == nil || e.LastTimestamp.After(last.LastTimestamp.Time)) {
			last = e
		}
	}
	if last == nil {
		return ""
	}
	return last.Reason + ": " + last.Message
}

// TestJudgeNUMA holds the NUMA judgment to both forms a driver may
// publish, so that no check is tied to one driver version: the scalar
// (the August 2026 drivers' default) and the list (KEP-6072's, under
// their DRAListTypeAttributes gates).
func TestJudgeNUMA(t *testing.T) {
	scalar := func(v int64) resourcev1.Device {
		return resourcev1.Device{Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{numaNodeAttribute: {IntValue: &v}}}
	}
	list := func(v ...int64) resourcev1.Device {
		return resourcev1.Device{Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{numaNodeAttribute: {IntValues: v}}}
	}
	for _, c := range []struct {
		name    string
		d       resourcev1.Device
		want    int
		said    string
		problem string
	}{
		{"scalar", scalar(1), 1, "1", ""},
		{"scalar, another node", scalar(0), 1, "", "want the profile's NUMA node 1"},
		{"list holding it", list(1, 0), 1, "[1 0]", ""},
		{"list without it", list(0), 1, "", "want the profile's NUMA node 1"},
		{"none where the profile has -1", resourcev1.Device{}, -1, "none", ""},
		{"one where the profile has -1", scalar(0), -1, "", "gives it no NUMA node (-1)"},
		{"none where the profile has one", resourcev1.Device{}, 0, "", "want the profile's NUMA node 0"},
		{"neither form", resourcev1.Device{Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{numaNodeAttribute: {StringValue: ptr.To("0")}}}, 0, "", "neither an int nor a list"},
	} {
		t.Run(c.name, func(t *testing.T) {
			said, err := judgeNUMA(c.d, c.want)
			if c.problem != "" {
				require.ErrorContains(t, err, c.problem)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.said, said)
		})
	}
}

// TestAppendItems keeps every round's claims in one list.
func TestAppendItems(t *testing.T) {
	first := []byte(`{"kind":"ResourceClaimList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a"}}]}`)
	b, err := appendItems(nil, first)
	require.NoError(t, err)
	require.Equal(t, first, b)
	b, err = appendItems(b, []byte(`{"kind":"ResourceClaimList","items":[{"metadata":{"name":"b"}}]}`))
	require.NoError(t, err)
	var l resourcev1.ResourceClaimList
	require.NoError(t, json.Unmarshal(b, &l))
	require.Equal(t, "ResourceClaimList", l.Kind)
	require.Len(t, l.Items, 2)
	require.Equal(t, "b", l.Items[1].Name)
	b, err = appendItems(b, []byte(`{"kind":"ResourceClaimList","items":null}`))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &l))
	require.Len(t, l.Items, 2)
}
