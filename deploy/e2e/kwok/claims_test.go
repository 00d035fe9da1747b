package kwok_test

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
)

// The claims' rows: each a kind of claim, judged over every pod of that
// kind.
const (
	rowProduct   = "one GPU by `productName` (CEL), a pod per product"
	rowHCA       = "a GPU and an HCA on one `pcieRoot` (gpu.nvidia.com and dra.net, matchAttribute), a pod per profile with HCAs"
	rowRoot      = "a whole root: every GPU of one `pcieRoot` (matchAttribute), a pod per profile"
	rowTooMany   = "a claim no node can satisfy: one GPU more than the fleet's largest root, on one `pcieRoot`"
	rowNoProduct = "a claim no node can satisfy: a product no profile has"
	rowControl   = "control: one node's slices published without `pcieRoot`, its whole root claimed on it"
)

// noProduct is a product no profile has.
const noProduct = "NVIDIA no such GPU (kwok suite)"

// claimCase is one pod of the suite, its claim's template, and what its
// allocation must be.
type claimCase struct {
	name string // the pod's and its template's
	row  string
	// profile is the profile the claim was written from, nil for none.
	profile      *fleetProfile
	spec         resourcev1.ResourceClaimSpec
	nodeSelector map[string]string
	// pend says no node can satisfy the claim: the pod must stay
	// Pending, Unschedulable. Otherwise check judges the audited
	// allocation.
	pend  bool
	check func(a *allocation) error
}

// allocation is an allocated claim as the audit found it.
type allocation struct {
	node *fakeNode
	gpus []profilefacts.GPU // the profile's GPUs allocated, in the claim's order
	// hcaRoots are the published pcieRoots of the dra.net devices
	// allocated: profilefacts reads no HCA's address.
	hcaRoots []string
}

// wholeRoot is a profile's largest root: the root complex its
// pcie_topology (or the suites' literal) gives the most nvidia-bound GPUs,
// and how many; ok is false when a GPU has no root known, or the root's
// GPUs are of several products (no one claim by product fills it).
func wholeRoot(p *profilefacts.Profile) (root, product string, k int, ok bool) {
	count := map[string]int{}
	name := map[string]string{}
	for _, g := range p.NVIDIABound() {
		if g.RootFrom == "" {
			return "", "", 0, false
		}
		count[g.Root]++
		if name[g.Root] != "" && name[g.Root] != g.Name {
			return "", "", 0, false
		}
		name[g.Root] = g.Name
	}
	for _, r := range slices.Sorted(maps.Keys(count)) {
		if count[r] > k {
			root, k = r, count[r]
		}
	}
	return root, name[root], k, k > 0
}

// rootSize is how many of a profile's nvidia-bound GPUs its facts put on
// root.
func rootSize(p *profilefacts.Profile, root string) int {
	n := 0
	for _, g := range p.NVIDIABound() {
		if g.RootFrom != "" && g.Root == root {
			n++
		}
	}
	return n
}

// gpuRequest asks for n GPUs, of product when not empty.
func gpuRequest(name string, n int, product string) resourcev1.DeviceRequest {
	req := resourcev1.ExactDeviceRequest{DeviceClassName: gpuClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(n)}
	if product != "" {
		req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["` + gpuDriver + `"].productName == "` + product + `"`}}}
	}
	return resourcev1.DeviceRequest{Name: name, Exactly: &req}
}

// onOneRoot is the constraint that the requests' devices share a
// pcieRoot (all of the claim's, when none is named).
func onOneRoot(requests ...string) []resourcev1.DeviceConstraint {
	return []resourcev1.DeviceConstraint{{Requests: requests, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(pcieRootAttr))}}
}

// cases are the suite's pods: one per product, one per profile's whole
// root, one GPU+HCA per profile whose infiniband block gives it HCAs
// (profilefacts: whatever was published, so that a publisher that
// publishes no dra.net device fails the row, not skips it), the claims no
// node satisfies, and the control's.
func (f *fleet) cases(control *fakeNode) []claimCase {
	var out []claimCase
	var products []string
	largest := 0
	for _, p := range f.profiles {
		for _, g := range p.facts.NVIDIABound() {
			if !slices.Contains(products, g.Name) {
				products = append(products, g.Name)
			}
			if g.RootFrom != "" {
				largest = max(largest, rootSize(p.facts, g.Root))
			}
		}
	}
	for i, product := range products {
		out = append(out, claimCase{name: fmt.Sprintf("product-%d", i), row: rowProduct,
			spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{gpuRequest("gpu", 1, product)}}},
			check: func(a *allocation) error {
				if len(a.gpus) != 1 || a.gpus[0].Name != product {
					return fmt.Errorf("want one %s, the profile names %v", product, names(a.gpus))
				}
				return nil
			}})
	}
	for _, p := range f.profiles {
		root, product, k, ok := wholeRoot(p.facts)
		if !ok {
			continue
		}
		onProfile := map[string]string{profileLabel: p.slug}
		out = append(out, claimCase{name: "root-" + p.slug, row: rowRoot, profile: p, nodeSelector: onProfile,
			spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{gpuRequest("gpus", k, product)}, Constraints: onOneRoot()}},
			check: func(a *allocation) error {
				if len(a.gpus) != k {
					return fmt.Errorf("%d GPUs, want %d (%s's largest root, %s)", len(a.gpus), k, p.Name, root)
				}
				roots := map[string]bool{}
				for _, g := range a.gpus {
					roots[g.Root] = true
					if g.Name != product || g.RootFrom == "" {
						return fmt.Errorf("GPU %s: %s on %s, want %s on a root the profile gives", g.BusID, g.Name, g.RootSaid(), product)
					}
				}
				if len(roots) != 1 {
					return fmt.Errorf("the GPUs are on roots %v by the profile, want one", slices.Sorted(maps.Keys(roots)))
				}
				if got := rootSize(a.node.profile.facts, a.gpus[0].Root); got != k {
					return fmt.Errorf("root %s holds %d GPUs by the profile, the claim %d: not the whole root", a.gpus[0].Root, got, k)
				}
				return nil
			}})
		if p.facts.HCAs {
			out = append(out, claimCase{name: "gpu-hca-" + p.slug, row: rowHCA, profile: p, nodeSelector: onProfile,
				spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
					Requests: []resourcev1.DeviceRequest{gpuRequest("gpu", 1, product),
						{Name: "hca", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: hcaClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}}},
					Constraints: onOneRoot("gpu", "hca")}},
				check: func(a *allocation) error {
					if len(a.gpus) != 1 || len(a.hcaRoots) != 1 {
						return fmt.Errorf("%d GPUs and %d HCAs, want one of each", len(a.gpus), len(a.hcaRoots))
					}
					if g := a.gpus[0]; g.RootFrom == "" || g.Root != a.hcaRoots[0] {
						return fmt.Errorf("the GPU %s is on %s by the profile, the HCA published on %s", g.BusID, g.RootSaid(), a.hcaRoots[0])
					}
					return nil
				}})
		}
	}
	out = append(out,
		claimCase{name: "too-many", row: rowTooMany, pend: true,
			spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{gpuRequest("gpus", largest+1, "")}, Constraints: onOneRoot()}}},
		claimCase{name: "no-product", row: rowNoProduct, pend: true,
			spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{gpuRequest("gpu", 1, noProduct)}}}},
	)
	if control != nil {
		_, product, k, _ := wholeRoot(control.profile.facts)
		out = append(out, claimCase{name: "control", row: rowControl, profile: control.profile, pend: true,
			nodeSelector: map[string]string{corev1.LabelHostname: control.Name},
			spec:         resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{gpuRequest("gpus", k, product)}, Constraints: onOneRoot()}}})
	}
	return out
}

func names(gpus []profilefacts.GPU) []string {
	var out []string
	for _, g := range gpus {
		out = append(out, g.Name)
	}
	return out
}

// createCase creates the case's claim template and its pod.
func (f *fleet) createCase(namespace string, c claimCase) error {
	ctx := context.Background()
	_, err := f.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: namespace},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: c.spec},
	}, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		return fmt.Errorf("create ResourceClaimTemplate %s: %w", c.name, err)
	}
	if _, err := f.client.CoreV1().Pods(namespace).Create(ctx, claimPod(namespace, c.name, c.nodeSelector, c.name, ""), metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return fmt.Errorf("create pod %s: %w", c.name, err)
	}
	return nil
}

// publishedDevice is a device as the API server holds it, and the node
// its slice is published for.
type publishedDevice struct {
	node   string
	device resourcev1.Device
}

// deviceKey names an allocated device as a claim's result does.
type deviceKey struct{ driver, pool, device string }

// publishedDevices indexes every published device by its key.
func publishedDevices(list []resourcev1.ResourceSlice) map[deviceKey]publishedDevice {
	out := map[deviceKey]publishedDevice{}
	for _, s := range list {
		for _, d := range s.Spec.Devices {
			out[deviceKey{s.Spec.Driver, s.Spec.Pool.Name, d.Name}] = publishedDevice{node: ptr.Deref(s.Spec.NodeName, ""), device: d}
		}
	}
	return out
}

// audit judges an allocated claim against the profile files, by the
// wing's reader: the pod is bound and Running on a KWOK Node; each
// allocated device is published for that very node; each GPU is one its
// profile has, found by the bus id it was published with, and published
// with the product and (where the profile gives one) the pcieRoot the
// profile says. It returns the allocation for the case's own check.
func (f *fleet) audit(pod *corev1.Pod, claim *resourcev1.ResourceClaim, published map[deviceKey]publishedDevice) (*allocation, error) {
	node := f.byName[pod.Spec.NodeName]
	if node == nil {
		return nil, fmt.Errorf("bound to %q, not a KWOK Node", pod.Spec.NodeName)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return nil, fmt.Errorf("on %s, phase %s: KWOK did not run it", node.Name, pod.Status.Phase)
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("on %s, its claim %s not allocated", node.Name, claim.Name)
	}
	a := &allocation{node: node}
	for _, r := range claim.Status.Allocation.Devices.Results {
		d, ok := published[deviceKey{r.Driver, r.Pool, r.Device}]
		switch {
		case !ok:
			return nil, fmt.Errorf("device %s/%s/%s allocated, published by no slice", r.Driver, r.Pool, r.Device)
		case d.node != node.Name:
			return nil, fmt.Errorf("device %s/%s/%s allocated on %s, published for %s", r.Driver, r.Pool, r.Device, node.Name, d.node)
		case r.Driver == hcaDriver:
			root, _ := kubetest.StringAttribute(d.device, pcieRootAttr)
			if err := hcaRoot(node, root); err != nil {
				return nil, fmt.Errorf("device %s/%s/%s: %w", r.Driver, r.Pool, r.Device, err)
			}
			a.hcaRoots = append(a.hcaRoots, root)
			continue
		}
		g, err := profileGPU(node, d.device)
		if err != nil {
			return nil, err
		}
		a.gpus = append(a.gpus, g)
	}
	return a, nil
}

// profileGPU is the GPU of the node's profile a published device is, by
// its bus id, checked to be published with the profile's product and
// pcieRoot (where the profile gives one, and but on the control's node,
// which publishes none on purpose).
func profileGPU(node *fakeNode, d resourcev1.Device) (profilefacts.GPU, error) {
	bus, _ := kubetest.StringAttribute(d, "resource.kubernetes.io/pciBusID")
	i := slices.IndexFunc(node.profile.facts.NVIDIABound(), func(g profilefacts.GPU) bool { return g.BusID == bus })
	if i < 0 {
		return profilefacts.GPU{}, fmt.Errorf("%s's device %s: bus id %q, no nvidia-bound GPU of %s", node.Name, d.Name, bus, node.profile.Name)
	}
	g := node.profile.facts.NVIDIABound()[i]
	if got, _ := kubetest.StringAttribute(d, "productName"); got != g.Name {
		return g, fmt.Errorf("%s's device %s (%s): productName %q, %s says %q", node.Name, d.Name, bus, got, node.profile.Name, g.Name)
	}
	if got, _ := kubetest.StringAttribute(d, pcieRootAttr); g.RootFrom != "" && got != g.Root && !node.WithoutRoot {
		return g, fmt.Errorf("%s's device %s (%s): pcieRoot %q, %s says %s", node.Name, d.Name, bus, got, node.profile.Name, g.RootSaid())
	}
	return g, nil
}

// hcaRoot checks an HCA published with pcieRoot root against the node's
// profile: the root of a GPU that carries HCAs (profilefacts). Where the
// profile places not every such GPU, the root is the renderer's inference
// and not judged; the control's node publishes none on purpose.
func hcaRoot(node *fakeNode, root string) error {
	if node.WithoutRoot {
		return nil
	}
	var roots []string
	for _, g := range node.profile.facts.GPUs {
		if g.HCAs == 0 {
			continue
		}
		if g.Root == "" {
			return nil
		}
		roots = append(roots, g.Root)
	}
	if !slices.Contains(roots, root) {
		return fmt.Errorf("an HCA published with pcieRoot %q, where %s puts its HCAs on %v", root, node.profile.Name, roots)
	}
	return nil
}

// judgedCase is what the suite writes of each pod it judged.
type judgedCase struct {
	Pod      string   `json:"pod"`
	Row      string   `json:"row"`
	Profile  string   `json:"profile,omitempty"`
	Claim    string   `json:"claim,omitempty"`
	Node     string   `json:"node,omitempty"`
	GPUs     []string `json:"gpus,omitempty"` // bus id, product, root as the profile says them
	HCARoots []string `json:"hcaRoots,omitempty"`
	Pending  string   `json:"pending,omitempty"` // the scheduler's reason
	Verdict  string   `json:"verdict"`
}

// judge judges one case's pod and its claim, returning what is wrong
// (nil when right) and the record of it.
func (f *fleet) judge(c claimCase, pod *corev1.Pod, claims map[string]*resourcev1.ResourceClaim, published map[deviceKey]publishedDevice) (judgedCase, error) {
	j := judgedCase{Pod: pod.Name, Row: c.row, Node: pod.Spec.NodeName, Pending: kubetest.Unschedulable(pod)}
	if c.profile != nil {
		j.Profile = c.profile.Name
	}
	var claim *resourcev1.ResourceClaim
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			j.Claim = *s.ResourceClaimName
			claim = claims[*s.ResourceClaimName]
		}
	}
	err := func() error {
		if c.pend {
			may := f.mayGo(c.nodeSelector)
			switch {
			case pod.Spec.NodeName != "":
				return fmt.Errorf("no node can satisfy its claim, yet it was bound to %s", pod.Spec.NodeName)
			case j.Pending == "":
				return fmt.Errorf("not bound, and no Unschedulable reason")
			case !refusedForClaims(j.Pending, may):
				return fmt.Errorf("Unschedulable %q: want each of the %d nodes it may go to refused for its claims (%q)", j.Pending, may, kubetest.DRAUnschedulable)
			}
			return nil
		}
		if claim == nil {
			return fmt.Errorf("no claim made from its template (node %q, pending %q)", pod.Spec.NodeName, j.Pending)
		}
		a, err := f.audit(pod, claim, published)
		if err != nil {
			return err
		}
		for _, g := range a.gpus {
			j.GPUs = append(j.GPUs, g.BusID+" "+g.Name+" on "+g.RootSaid())
		}
		j.HCARoots = a.hcaRoots
		return c.check(a)
	}()
	j.Verdict = "right"
	if err != nil {
		j.Verdict = err.Error()
		err = fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	return j, err
}

// pendingReasons are the distinct reasons of the judged pods of a row that
// pend, for its cell.
func pendingReasons(judged []judgedCase, row string) string {
	var out []string
	for _, j := range judged {
		if j.Row == row && j.Pending != "" && !slices.Contains(out, j.Pending) {
			out = append(out, j.Pending)
		}
	}
	return strings.Join(out, "; ")
}

// mayGo is how many of the fleet's Nodes a pod of nodeSelector may go to:
// those whose labels (fakeNode.labels) it matches.
func (f *fleet) mayGo(nodeSelector map[string]string) int {
	n := 0
	for _, node := range f.nodes {
		labels := node.labels()
		if !slices.ContainsFunc(slices.Collect(maps.Keys(nodeSelector)), func(k string) bool { return labels[k] != nodeSelector[k] }) {
			n++
		}
	}
	return n
}

// refusedForClaims is whether the scheduler's Unschedulable message says
// that exactly may nodes found no allocation of the pod's claims: "0/50
// nodes are available: 50 cannot allocate all claims." (with a node
// selector, beside the others' "didn't match Pod's node
// affinity/selector"). Any other reason (a taint, a node not ready, too
// many pods) is not the claim's.
func refusedForClaims(message string, may int) bool {
	return regexp.MustCompile(`(^|[^0-9])` + strconv.Itoa(may) + " " + regexp.QuoteMeta(kubetest.DRAUnschedulable)).MatchString(message)
}
