package kwok_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// The suite's other rows.
const (
	rowNodes  = "KWOK Nodes, each a profile by the fleet map's label rules"
	rowSlices = "publishSlices: each node's gpu.nvidia.com and dra.net devices"
)

const (
	// nodesEnv sizes TestKWOK's fleet (make test E2E_KWOK_NODES=...);
	// unset, minNodes.
	nodesEnv = "NVML_MOCK_SYSFS_E2E_KWOK_NODES"
	minNodes = 50
	// namespace holds the claims' pods.
	namespace = "kwok-claims"
	// settleTimeout bounds the scheduling of every pod of the suite.
	settleTimeout = 5 * time.Minute
)

// TestMain runs the suite in its turn among the end-to-end suites (one
// cluster at a time on this machine), its temporary files in memory.
func TestMain(m *testing.M) { os.Exit(hosttest.MainAlone(m)) }

// TestKWOK runs a fleet of KWOK Nodes on the real control plane, each a
// profile of the suites by the fleet map, its slices published by
// publishSlices, and pods whose claims the real scheduler allocates:
// a GPU by product, a whole root, a GPU and an HCA on one root (where
// dra.net slices are published), and claims no node satisfies, which
// must pend with the scheduler's DRA reason on every node they may go to.
// Every allocation is audited against the profile files. The negative
// control is one node whose slices lack pcieRoot: its whole root, claimed
// there, must pend. A sabotaged run (programs.SabotageEnv) gives the
// publisher the fleet's profiles without their pcie_topology, as a driver
// would see a tree that lost its roots (a root per PCI domain, the
// renderer's rule without one): the slices' row, every claim that audits
// a root, and the claim one GPU beyond the largest root (a domain's GPUs
// now share one) turn red.
func TestKWOK(t *testing.T) {
	programs.SkipShort(t)
	n := minNodes
	if s := os.Getenv(nodesEnv); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, "%s", nodesEnv)
		require.GreaterOrEqual(t, n, minNodes, "%s: the fleet has %d nodes or more", nodesEnv, minNodes)
	}
	sabotage := programs.Sabotage(t)
	began := time.Now()
	var rows docmatrix.Rows
	var figures []string
	controlName := "none chosen"
	// The matrix is written however the suite ends, each row a failure
	// stopped it before red (docmatrix.Rows.Unreached).
	t.Cleanup(func() {
		var all [][]string
		for _, row := range []string{rowNodes, rowSlices, rowProduct, rowRoot, rowHCA, rowTooMany, rowNoProduct, rowControl} {
			all = append(all, []string{row, ""})
		}
		rows.Unreached("the suite stopped before this row (its log says where)", all...)
		figures = append(figures, fmt.Sprintf("the whole suite in %s", time.Since(began).Round(time.Second)))
		text := fmt.Sprintf("TestKWOK (deploy/e2e/kwok): %d KWOK nodes, control node %s\n\n", n, controlName) +
			rows.Table("claim", "result") + "\n" + strings.Join(figures, "\n") + "\n"
		t.Logf("\n%s", text)
		kubetest.AppendMatrix(t, text)
	})
	f := startFleet(t, n, kubetest.Options{})
	objects := kubetest.ObjectsDir(t, "kwok")
	control := f.controlNode(t)
	control.WithoutRoot = true
	controlName = control.Name

	published := time.Now()
	var others []string
	for _, node := range f.nodes {
		if node == control {
			f.publishEdited(t, node.Name, withoutRoot)
			continue
		}
		others = append(others, node.Name)
	}
	f.sabotage = sabotage
	f.publishSlices(t, others)
	figures = append(figures, fmt.Sprintf("the slices of %d nodes published in %s", n, time.Since(published).Round(time.Millisecond)))
	ctx := context.Background()
	list, err := f.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)

	f.createClasses(t)
	f.createNamespace(t, namespace)
	cases := f.cases(control)
	scheduled := time.Now()
	f.parallel(t, len(cases), func(i int) error { return f.createCase(namespace, cases[i]) })
	pods := f.settle(t, len(cases))
	figures = append(figures, fmt.Sprintf("%d pods scheduled or found unschedulable in %s", len(cases), time.Since(scheduled).Round(time.Millisecond)))

	claimList, err := f.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	claims := map[string]*resourcev1.ResourceClaim{}
	for i := range claimList.Items {
		claims[claimList.Items[i].Name] = &claimList.Items[i]
	}
	devices := publishedDevices(list.Items)
	var judged []judgedCase
	verdicts := map[string][]error{}
	for _, c := range cases {
		j, err := f.judge(c, pods[c.name], claims, devices)
		judged = append(judged, j)
		if err != nil {
			verdicts[c.row] = append(verdicts[c.row], err)
		}
	}
	count := func(row string) int {
		return len(slices.DeleteFunc(slices.Clone(cases), func(c claimCase) bool { return c.row != row }))
	}

	t.Run("nodes", func(t *testing.T) {
		rows.Expect(t, rowNodes, fmt.Sprintf("%d Nodes Ready, KWOK's (no kubelet), of %d profiles", n, len(f.profiles)))
		nodes, err := f.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: profileLabel})
		require.NoError(t, err)
		require.Len(t, nodes.Items, n)
	})
	t.Run("slices", func(t *testing.T) {
		rows.Expect(t, rowSlices, "every nvidia-bound GPU of each node's profile, by bus id, with the profile's productName and pcieRoot; as many dra.net devices as its HCAs, on the roots of the GPUs that carry them")
		for _, err := range f.auditSlices(list.Items, control) {
			t.Error(err)
		}
	})
	for _, row := range []string{rowProduct, rowRoot, rowHCA} {
		t.Run(row, func(t *testing.T) {
			rows.Expect(t, row, fmt.Sprintf("%d pods, each allocated, Running, audited against its node's profile", count(row)))
			require.NotZero(t, count(row), "no pod of this kind: no profile of the fleet has one")
			for _, err := range verdicts[row] {
				t.Error(err)
			}
		})
	}
	for _, row := range []string{rowTooMany, rowNoProduct, rowControl} {
		t.Run(row, func(t *testing.T) {
			for _, err := range verdicts[row] {
				t.Error(err)
			}
			rows.Expect(t, row, "Pending, every node it may go to refused for its claims ("+kubetest.DRAUnschedulable+"): "+pendingReasons(judged, row))
		})
	}

	for name, v := range map[string]any{"nodes.json": f.nodes, "judged.json": judged, "resourceslices.json": list, "resourceclaims.json": claimList} {
		kubetest.WriteObject(t, objects, name, v)
	}
	podList, err := f.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, objects, "pods.json", podList)
	figures = append(figures, "the objects judged in "+objects)
}

// controlNode is the negative control's node: the first whose profile has
// a whole root to claim and another node to take its other claims.
func (f *fleet) controlNode(t testing.TB) *fakeNode {
	t.Helper()
	for _, node := range f.nodes {
		if _, _, _, ok := wholeRoot(node.profile.facts); ok && slices.ContainsFunc(f.nodes, func(o *fakeNode) bool { return o != node && o.profile == node.profile }) {
			return node
		}
	}
	t.Fatal("no node's profile has a whole root and a second node: no control")
	return nil
}

// settle waits until each of the namespace's want pods is Running on a
// node or found unschedulable, and returns them by name.
func (f *fleet) settle(t testing.TB, want int) map[string]*corev1.Pod {
	t.Helper()
	pods := map[string]*corev1.Pod{}
	f.c.Wait(t, fmt.Sprintf("%d pods Running or Unschedulable", want), settleTimeout, func() error {
		list, err := f.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		settled := 0
		for i := range list.Items {
			p := &list.Items[i]
			pods[p.Name] = p
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning || p.Spec.NodeName == "" && kubetest.Unschedulable(p) != "" {
				settled++
			}
		}
		if settled != want {
			return fmt.Errorf("%d of %d pods settled", settled, want)
		}
		return nil
	})
	return pods
}

// auditSlices judges the published gpu.nvidia.com and dra.net slices
// against the profiles: each node's GPU devices are its profile's
// nvidia-bound GPUs, one each, by bus id, with their product and root
// (profileGPU); its dra.net devices its HCAs (auditHCAs). The control's
// node must publish no pcieRoot: that is its premise.
func (f *fleet) auditSlices(list []resourcev1.ResourceSlice, control *fakeNode) []error {
	var errs []error
	byNode := map[string][]resourcev1.Device{}
	hcasByNode := map[string][]resourcev1.Device{}
	for _, s := range list {
		switch {
		case s.Spec.NodeName == nil:
		case s.Spec.Driver == gpuDriver:
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s.Spec.Devices...)
		case s.Spec.Driver == hcaDriver:
			hcasByNode[*s.Spec.NodeName] = append(hcasByNode[*s.Spec.NodeName], s.Spec.Devices...)
		}
	}
	for _, node := range f.nodes {
		errs = append(errs, auditHCAs(node, hcasByNode[node.Name])...)
		devices := byNode[node.Name]
		if want := len(node.profile.facts.NVIDIABound()); len(devices) != want {
			errs = append(errs, fmt.Errorf("%s (%s): %d devices published, the profile has %d nvidia-bound GPUs", node.Name, node.profile.Name, len(devices), want))
			continue
		}
		seen := map[string]bool{}
		for _, d := range devices {
			if node == control {
				if root, ok := kubetest.StringAttribute(d, pcieRootAttr); ok {
					errs = append(errs, fmt.Errorf("the control's %s: device %s published with pcieRoot %s", node.Name, d.Name, root))
				}
				continue
			}
			g, err := profileGPU(node, d)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if seen[g.BusID] {
				errs = append(errs, fmt.Errorf("%s: GPU %s published twice", node.Name, g.BusID))
			}
			seen[g.BusID] = true
		}
	}
	return errs
}

// auditHCAs judges a node's dra.net devices against its profile
// (profilefacts): as many as the HCAs its infiniband block puts beside
// its GPUs, and on each root complex as many as it puts beside the GPUs
// there. Where the profile places not every GPU that carries HCAs, the
// roots are the renderer's inference and only the count is judged; the
// control's node must publish no pcieRoot.
func auditHCAs(node *fakeNode, devices []resourcev1.Device) []error {
	want, placed := 0, true
	perRoot := map[string]int{}
	for _, g := range node.profile.facts.GPUs {
		if g.HCAs == 0 {
			continue
		}
		want += g.HCAs
		perRoot[g.Root] += g.HCAs
		placed = placed && g.RootFrom != ""
	}
	if len(devices) != want {
		return []error{fmt.Errorf("%s (%s): %d dra.net devices published, the profile puts %d HCAs beside its GPUs", node.Name, node.profile.Name, len(devices), want)}
	}
	got := map[string]int{}
	for _, d := range devices {
		root, ok := kubetest.StringAttribute(d, pcieRootAttr)
		if node.WithoutRoot && ok {
			return []error{fmt.Errorf("the control's %s: dra.net device %s published with pcieRoot %s", node.Name, d.Name, root)}
		}
		got[root]++
	}
	if node.WithoutRoot || !placed || maps.Equal(got, perRoot) {
		return nil
	}
	return []error{fmt.Errorf("%s (%s): dra.net devices by pcieRoot %v, the profile puts HCAs on %v", node.Name, node.profile.Name, got, perRoot)}
}
