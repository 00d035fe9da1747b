// Package kwok_test runs a GPU fleet at cluster scale on one machine: the
// kubetest control plane (real etcd, kube-apiserver, controller manager
// and kube-scheduler) with no kubelet, KWOK's controller keeping N fake
// Nodes alive and marking the pods bound to them Running, each node a
// profile by the fleet map (deploy/fleet's format, by a node label, as
// the chart's map does), and each node's ResourceSlices those the NVIDIA
// DRA driver and dranet would publish there, kept published by the
// binary's publish mode from the map in a ConfigMap (publishSlices).
// The real scheduler allocates the claims; the suite audits each
// allocation against the profile files through the wing's own reader
// (profilefacts), never our planner. TestKWOK judges; BenchmarkKWOK
// measures the same fleet at 100 to 1,000 nodes.
package kwok_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	fleetmap "github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

const (
	// gpuDriver and hcaDriver are the drivers whose slices the claims
	// ask for: the NVIDIA DRA driver's, and dranet's (HCAs).
	gpuDriver = "gpu.nvidia.com"
	hcaDriver = "dra.net"
	// pcieRootAttr is the standard attribute both drivers publish a
	// device's PCIe root complex as: what an aligned claim matches on.
	pcieRootAttr = "resource.kubernetes.io/pcieRoot"
	// The device classes the claims ask for.
	gpuClass = "kwok.gpu.nvidia.com"
	hcaClass = "kwok.dra.net"
	// profileLabel is the node label the fleet map's rules match, as the
	// chart's map does (deploy/e2e/node's TestFleet labels its workers so).
	profileLabel = "nvml-mock/profile"
	// kwokNode marks a Node as KWOK's (programs.KWOKNodeAnnotation, its
	// one home): the controller manages the Nodes with this annotation,
	// and the Nodes carry it as a NoSchedule taint too, as KWOK's
	// documentation has them, so that no pod lands there unless it
	// tolerates a node that runs nothing.
	kwokNode, kwokFake = programs.KWOKNodeAnnotation, programs.KWOKNodeValue
	// nodeLeaseSeconds is the fake Nodes' lease: KWOK renews it every
	// quarter, 40 s, inside the controller manager's node-monitor grace
	// period (50 s), where kwokctl's 40 s lease would renew every 10 s,
	// 100 writes a second at 1,000 nodes on this 2-core machine.
	nodeLeaseSeconds = 160
	// podsPerNode is each fake Node's pod capacity.
	podsPerNode = 110
	// readyTimeout bounds the Nodes' readiness and the slices' publication.
	readyTimeout = 5 * time.Minute
	// publishLabel selects the Nodes the publisher keeps published; the
	// fleet ConfigMap it reads is fleetConfigMap in publisherNamespace.
	publishLabel       = "nvml-mock-sysfs.nvidia.com/publish"
	publisherNamespace = "nvml-mock-sysfs"
	fleetConfigMap     = "nvml-mock-sysfs-fleet"
)

// fleetProfile is one profile of the fleet: a suite profile (every
// built-in, nvml-mock's own of ../shared, the suites' and the
// repository's shapes: HGX trays and PCIe boards that name no machine),
// its facts, and the label value that maps a node to it.
type fleetProfile struct {
	programs.SuiteProfile
	slug  string
	facts *profilefacts.Profile
}

// fakeNode is one KWOK Node and its profile.
type fakeNode struct {
	Name    string `json:"name"`
	Profile string `json:"profile"`
	File    string `json:"file"`
	// WithoutRoot says the node's slices were published without pcieRoot
	// on purpose: the negative control's node.
	WithoutRoot bool `json:"withoutRoot,omitempty"`
	profile     *fleetProfile
}

// fleet is the control plane, KWOK's controller and the fake Nodes.
type fleet struct {
	c *kubetest.Cluster
	// client reaches the API server without the harness's client-side
	// rate limit (50/s), which would time the client, not the cluster.
	client  kubernetes.Interface
	bin     string // nvml-mock-sysfs
	mapFile string // the fleet map, its profiles beside it
	// mapData is the fleet ConfigMap's data: the map and its profiles.
	mapData map[string]string
	// publisher is nvml-mock-sysfs publish, once publishSlices started it.
	publisher *kubetest.Process
	// sabotage, set before publishSlices starts the publisher, gives it
	// the profiles without their pcie_topology (withoutTopology).
	sabotage string
	profiles []*fleetProfile
	nodes    []*fakeNode
	byName   map[string]*fakeNode
}

// startFleet starts the control plane (opts, ControlPlaneOnly) and KWOK's
// controller, writes the fleet map of every suite profile, and creates n
// KWOK Nodes, node i the i-th profile in turn, waiting until all are
// Ready. It publishes no slice.
func startFleet(t testing.TB, n int, opts kubetest.Options) *fleet {
	t.Helper()
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	kwok := programs.Need(t, programs.KWOK())
	f := &fleet{bin: hosttest.BuildBinary(t), byName: map[string]*fakeNode{}}
	f.readProfiles(t)
	f.writeMap(t)
	opts.ControlPlaneOnly = true
	f.c = kubetest.Start(t, opts)
	cfg := *f.c.Config
	cfg.QPS, cfg.Burst = 1000, 2000
	var err error
	if f.client, err = kubernetes.NewForConfig(&cfg); err != nil {
		t.Fatal(err)
	}
	f.c.Start(t, kubetest.Program{Name: "kwok", Args: []string{filepath.Join(kwok, "kwok"),
		"--kubeconfig", f.c.Kubeconfig, "--config", filepath.Join(kwok, programs.KWOKStages),
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", kwokNode + "=" + kwokFake,
		"--node-lease-duration-seconds", fmt.Sprint(nodeLeaseSeconds),
		"--cidr", "10.240.0.0/12", "--node-ip", "10.239.0.1", "--server-address", "127.0.0.1:10247",
		// At INFO it logs every lease renewal: a line per node every
		// 40 s, CPU this machine's control plane needs.
		"--v", "WARN"}})
	for i := range n {
		p := f.profiles[i%len(f.profiles)]
		node := &fakeNode{Name: fmt.Sprintf("kwok-node-%04d", i), Profile: p.Name, File: p.File, profile: p}
		f.nodes = append(f.nodes, node)
		f.byName[node.Name] = node
	}
	began := time.Now()
	f.parallel(t, len(f.nodes), func(i int) error { return f.createNode(f.nodes[i]) })
	// Ready, and untainted but for KWOK's own taint: the controller
	// manager taints a new Node not-ready until it sees it Ready, and a
	// pod scheduled before then is Unschedulable for a reason that is
	// not its claim's.
	f.c.Wait(t, fmt.Sprintf("%d KWOK Nodes Ready and untainted", n), readyTimeout, func() error {
		list, err := f.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, node := range list.Items {
			if nodeReady(&node) && slices.Equal(node.Spec.Taints, []corev1.Taint{kwokTaint()}) {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%d of %d Nodes Ready and untainted", ready, n)
		}
		return nil
	})
	t.Logf("%d KWOK Nodes of %d profiles created and Ready in %s", n, len(f.profiles), time.Since(began).Round(time.Millisecond))
	return f
}

// readProfiles reads the suite profiles and their facts.
func (f *fleet) readProfiles(t testing.TB) {
	t.Helper()
	for _, sp := range programs.SuiteProfiles(t) {
		abs, err := filepath.Abs(sp.File)
		if err != nil {
			t.Fatal(err)
		}
		sp.File = abs
		f.profiles = append(f.profiles, &fleetProfile{SuiteProfile: sp, slug: kubetest.Slug(sp.Name), facts: sp.Facts(t)})
	}
}

// writeMap writes the fleet map: one label rule per profile, as a user
// with a heterogeneous fleet writes it (the chart's fleet.labels).
func (f *fleet) writeMap(t testing.TB) {
	t.Helper()
	type rule struct {
		Match   map[string]string `yaml:"match"`
		Profile string            `yaml:"profile"`
	}
	var doc struct {
		Labels []rule `yaml:"labels"`
	}
	// Each profile beside the map, named by its label value: where the
	// slices command reads it, and the keys of the ConfigMap the
	// publisher reads it from, as the chart's fleet ConfigMap holds them.
	dir := t.TempDir()
	f.mapData = map[string]string{}
	for _, p := range f.profiles {
		key := p.slug + ".yaml"
		text, err := os.ReadFile(p.File)
		if err != nil {
			t.Fatal(err)
		}
		f.mapData[key] = string(text)
		doc.Labels = append(doc.Labels, rule{Match: map[string]string{profileLabel: p.slug}, Profile: key})
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	f.mapData[fleetmap.ConfigMapKey] = string(data)
	for key, text := range f.mapData {
		if err := os.WriteFile(filepath.Join(dir, key), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.mapFile = filepath.Join(dir, fleetmap.ConfigMapKey)
}

// createNode creates a KWOK Node: KWOK's annotation and taint, the
// profile's label, and a capacity the claims' pods fit in.
func (f *fleet) createNode(n *fakeNode) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   *resource.NewQuantity(podsPerNode, resource.DecimalSI),
	}
	_, err := f.client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        n.Name,
			Labels:      n.labels(),
			Annotations: map[string]string{kwokNode: kwokFake},
		},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{kwokTaint()}},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", n.Name, err)
	}
	return nil
}

// labels are a KWOK Node's labels: its profile's, by which the fleet map
// maps it, and the well-known ones a kubelet sets.
func (n *fakeNode) labels() map[string]string {
	return map[string]string{profileLabel: n.profile.slug, corev1.LabelHostname: n.Name, "type": "kwok", corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}
}

// kwokTaint keeps off a KWOK Node the pods that do not tolerate a node
// that runs nothing.
func kwokTaint() corev1.Taint {
	return corev1.Taint{Key: kwokNode, Value: kwokFake, Effect: corev1.TaintEffectNoSchedule}
}

// nodeReady is whether the Node's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// kwokToleration lets a pod onto a KWOK Node.
func kwokToleration() corev1.Toleration {
	return corev1.Toleration{Key: kwokNode, Operator: corev1.TolerationOpEqual, Value: kwokFake, Effect: corev1.TaintEffectNoSchedule}
}

// parallel runs do(0..n-1) on a few workers, failing t with the first
// error: the API server, not one client goroutine, is what is loaded.
func (f *fleet) parallel(t testing.TB, n int, do func(int) error) {
	t.Helper()
	if err := parallel(n, do); err != nil {
		t.Fatal(err)
	}
}

// parallel runs do(0..n-1) on a few workers and returns the first error.
func parallel(n int, do func(int) error) error {
	const workers = 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// publishSlices has the nodes named carry their ResourceSlices, each
// node's per the fleet map, and returns once the API server holds them
// all: the binary's publish mode, as the chart's publisher Deployment runs
// it, reading the map from its ConfigMap and keeping published the slices
// of the Nodes its selector names, which this labels so. It is started
// once, on the first call; the nodes published by hand (publishEdited) are
// never labelled, so it leaves them alone. A node holds its slices once it
// carries as many GPUs of the NVIDIA DRA driver as its profile has
// nvidia-bound GPUs, and as many dranet devices as the profile's HCAs
// (profilefacts): a publisher that never gets there fails the test, with
// what is missing and its log.
func (f *fleet) publishSlices(t testing.TB, nodes []string) {
	t.Helper()
	if len(nodes) == 0 {
		return
	}
	if f.publisher == nil {
		f.createNamespace(t, publisherNamespace)
		data := f.mapData
		if f.sabotage != "" {
			var err error
			if data, err = withoutTopology(data); err != nil {
				t.Fatal(err)
			}
		}
		_, err := f.client.CoreV1().ConfigMaps(publisherNamespace).Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fleetConfigMap},
			Data:       data,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f.publisher = f.c.Start(t, kubetest.Program{Name: "publisher", Args: []string{f.bin, "publish",
			"--kubeconfig", f.c.Kubeconfig, "--node-selector", publishLabel + "=true",
			"--fleet-configmap", publisherNamespace + "/" + fleetConfigMap, "--listen", "127.0.0.1:18080"}})
	}
	f.parallel(t, len(nodes), func(i int) error {
		patch := []byte(`{"metadata":{"labels":{"` + publishLabel + `":"true"}}}`)
		_, err := f.client.CoreV1().Nodes().Patch(context.Background(), nodes[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	deadline := time.Now().Add(readyTimeout)
	for {
		missing, err := f.unpublished(nodes)
		if err == nil && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			if err != nil {
				missing = err.Error()
			}
			t.Fatalf("the publisher did not publish every node's slices within %s: %s\n%s", readyTimeout, missing, f.publisher.LogTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unpublished says which of the nodes do not yet carry the devices their
// profile gives each driver, or "" when all do.
func (f *fleet) unpublished(nodes []string) (string, error) {
	list, err := f.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	have := map[string]map[string]int{}
	for _, s := range list.Items {
		if s.Spec.NodeName == nil {
			continue
		}
		if have[*s.Spec.NodeName] == nil {
			have[*s.Spec.NodeName] = map[string]int{}
		}
		have[*s.Spec.NodeName][s.Spec.Driver] += len(s.Spec.Devices)
	}
	var missing []string
	for _, name := range nodes {
		facts := f.byName[name].profile.facts
		hcas := 0
		for _, g := range facts.GPUs {
			hcas += g.HCAs
		}
		if got := have[name]; got[gpuDriver] != len(facts.NVIDIABound()) || got[hcaDriver] != hcas {
			missing = append(missing, fmt.Sprintf("%s: %d GPUs and %d HCAs of %d and %d", name, got[gpuDriver], got[hcaDriver], len(facts.NVIDIABound()), hcas))
		}
	}
	if len(missing) > 3 {
		missing = append(missing[:3], fmt.Sprintf("and %d more", len(missing)-3))
	}
	return strings.Join(missing, "; "), nil
}

// publishEdited publishes a node's slices as publishSlices would, with
// each device edited first: the negative control's node, and every node
// in a sabotaged run. The suite publishes these itself whatever the
// publisher: they are what no publisher must ever print.
func (f *fleet) publishEdited(t testing.TB, node string, edit func(*resourcev1.Device)) {
	t.Helper()
	slices, err := f.printedSlices(f.byName[node])
	if err != nil {
		t.Fatal(err)
	}
	for i := range slices {
		for j := range slices[i].Spec.Devices {
			edit(&slices[i].Spec.Devices[j])
		}
	}
	if err := f.createSlices(slices); err != nil {
		t.Fatal(err)
	}
}

// withoutRoot drops a device's pcieRoot: what the real driver publishes
// on a tree whose root it cannot read.
func withoutRoot(d *resourcev1.Device) { delete(d.Attributes, pcieRootAttr) }

// printedSlices are the slices `nvml-mock-sysfs slices --fleet` prints
// for the node, its label as the map's rule reads it.
func (f *fleet) printedSlices(n *fakeNode) ([]resourcev1.ResourceSlice, error) {
	cmd := exec.Command(f.bin, "slices", "--fleet", f.mapFile, "--node-name", n.Name,
		"--node-labels", profileLabel+"="+n.profile.slug, "--format", "json")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, stderr)
	}
	var list resourcev1.ResourceSliceList
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("nvml-mock-sysfs slices for %s: %w", n.Name, err)
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("nvml-mock-sysfs slices for %s: no slice", n.Name)
	}
	return list.Items, nil
}

// createSlices creates the slices as printed (the API server completes
// their generateName).
func (f *fleet) createSlices(slices []resourcev1.ResourceSlice) error {
	for i := range slices {
		if _, err := f.client.ResourceV1().ResourceSlices().Create(context.Background(), &slices[i], metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
			return fmt.Errorf("create the ResourceSlice of %s: %w", ptr.Deref(slices[i].Spec.NodeName, ""), err)
		}
	}
	return nil
}

// createClasses creates the device classes the claims ask for: a GPU of
// the NVIDIA DRA driver, any device of dranet.
func (f *fleet) createClasses(t testing.TB) {
	t.Helper()
	f.c.CreateDeviceClass(t, gpuClass, `device.driver == "`+gpuDriver+`" && device.attributes["`+gpuDriver+`"].type == "gpu"`)
	f.c.CreateDeviceClass(t, hcaClass, `device.driver == "`+hcaDriver+`"`)
}

// createNamespace creates a namespace for the claims' pods.
func (f *fleet) createNamespace(t testing.TB, name string) {
	t.Helper()
	if _, err := f.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.c.Wait(t, "namespace "+name+"'s default ServiceAccount", time.Minute, func() error {
		_, err := f.client.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}

// claimPod is a pod of KWOK's that holds one claim: the template's, or
// the claim named. KWOK runs no container: the image is never pulled.
func claimPod(namespace, name string, nodeSelector map[string]string, template, claim string) *corev1.Pod {
	rc := corev1.PodResourceClaim{Name: "devices"}
	if template != "" {
		rc.ResourceClaimTemplateName = &template
	} else {
		rc.ResourceClaimName = &claim
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeSelector:   nodeSelector,
			Tolerations:    []corev1.Toleration{kwokToleration()},
			ResourceClaims: []corev1.PodResourceClaim{rc},
			Containers: []corev1.Container{{Name: "c", Image: "kwok.invalid/never-pulled",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "devices"}}}}},
		},
	}
}

// withoutTopology is the fleet ConfigMap's data with each profile's
// pcie_topology left out, the map itself as it is: a sabotaged run's,
// in which the publisher puts each PCI domain's GPUs and HCAs under one
// root complex (the renderer's rule without one), the roots a driver
// would publish where the tree lost the profile's.
func withoutTopology(data map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for key, text := range data {
		if key == fleetmap.ConfigMapKey {
			out[key] = text
			continue
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
			return nil, fmt.Errorf("profile %s: not a YAML mapping: %v", key, err)
		}
		top := doc.Content[0]
		for i := 0; i+1 < len(top.Content); i += 2 {
			if top.Content[i].Value == "pcie_topology" {
				top.Content = slices.Delete(top.Content, i, i+2)
				break
			}
		}
		edited, err := yaml.Marshal(&doc)
		if err != nil {
			return nil, fmt.Errorf("profile %s: %w", key, err)
		}
		out[key] = string(edited)
	}
	return out, nil
}
