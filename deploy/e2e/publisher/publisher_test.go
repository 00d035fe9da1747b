// Package publisher_test runs the real binary's readers of the fleet map
// through the API against the real control plane of kubetest, each as the
// chart's ServiceAccount with the chart's RBAC (and, for the publisher, the
// chart's admission policy).
//
// TestPublisher runs nvml-mock-sysfs publish for Nodes that run nothing
// (made through the API as KWOK makes its nodes, with KWOK's annotation):
// each carries the slices the real drivers published for the profile the
// fleet ConfigMap gives it, as their recorded runs in the product's
// testdata hold them, read here, not planned by the product; a re-profile
// through the ConfigMap updates them in place, a node relabelled out of the
// selector has them withdrawn, and a node deleted while the publisher is
// down has them collected by the garbage collector, through their owner
// reference. It touches only KWOK's nodes and its own slices: the cluster's
// real node (a kubelet), matching the selector, and its slice of the
// NVIDIA driver's name that someone else published stay untouched, and so
// do another's slices on the fake nodes; the chart's admission policy
// refuses the publisher's account a slice on a node not KWOK's, or one
// without the publisher's mark. The objects it judged go to
// bin/k8s/publisher/.
//
// TestServeFleetThroughAPI runs serve --fleet-configmap on the cluster's
// node: a re-profile through the ConfigMap reaches its tree without a
// kubelet's ConfigMap sync.
package publisher_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/publisher"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

const (
	namespace    = "default"
	configMap    = "nvml-mock-sysfs-fleet"
	kwokLabel    = "type"
	profileLabel = "nvml-mock/profile"
	// wait bounds each wait on the publisher or the garbage collector.
	wait = 2 * time.Minute
	// listen is the publisher's health endpoints' address, in the
	// control plane's network.
	listen = "127.0.0.1:18080"
	// chartDir is the chart, below the repository.
	chartDir = "deploy/helm/nvml-mock-sysfs"
)

// A node's expected profile: its name in the fleet map (a built-in, or a
// ConfigMap key), and the row of the recorded real runs that ran the
// drivers on it (the DRA suite's slug: built-in-NAME, shared-NAME).
type expected struct {
	node, profile, row string
}

func TestPublisher(t *testing.T) {
	gb200 := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "gb200.yaml")
	c := kubetest.Start(t, kubetest.Options{})
	bin := hosttest.BuildBinary(t)
	ctx := context.Background()
	objects := kubetest.ObjectsDir(t, "publisher")

	gb200Text, err := os.ReadFile(gb200)
	require.NoError(t, err)
	fleetYAML := "nodes: {kwok-0: t4-vm}\nlabels:\n  - match: {" + profileLabel + ": gb200}\n    profile: gb200.yaml\ndefault: dgx-a100\n"
	data := map[string]string{fleet.ConfigMapKey: fleetYAML, "gb200.yaml": string(gb200Text)}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: configMap}, Data: data}
	_, err = c.Client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	kwok := map[string]string{programs.KWOKNodeAnnotation: programs.KWOKNodeValue}
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-0", Labels: map[string]string{kwokLabel: "kwok"}, Annotations: kwok}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-1", Labels: map[string]string{kwokLabel: "kwok", profileLabel: "gb200"}, Annotations: kwok}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-2", Labels: map[string]string{kwokLabel: "kwok"}, Annotations: kwok}},
	} {
		_, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	want := []expected{{"kwok-0", "t4-vm", "built-in-t4-vm"}, {"kwok-1", "gb200.yaml", "shared-gb200"}, {"kwok-2", "dgx-a100", "built-in-dgx-a100"}}

	// The negative control of what the publisher must not touch: the real
	// node, its kubelet's, labelled as the selector wants, carries a slice
	// of the NVIDIA driver's name that someone else published (its driver
	// would); the fake nodes carry someone else's dra.net slices, kwok-1's
	// in the pool the publisher publishes dra.net in (the ResourceSlice
	// controller took it for an obsolete slice of its own), kwok-0's of a
	// driver its profile gives nothing (the publisher took it for an
	// earlier publisher's).
	realNode, err := c.Client.CoreV1().Nodes().Get(ctx, kubetest.NodeName, metav1.GetOptions{})
	require.NoError(t, err)
	realNode.Labels[kwokLabel] = "kwok"
	_, err = c.Client.CoreV1().Nodes().Update(ctx, realNode, metav1.UpdateOptions{})
	require.NoError(t, err)
	theirs := []*resourcev1.ResourceSlice{
		anothersSlice(t, c.Client, resourceslices.NVIDIAGPUDriver, kubetest.NodeName),
		anothersSlice(t, c.Client, resourceslices.DRANetDriver, "kwok-0"),
		anothersSlice(t, c.Client, resourceslices.DRANetDriver, "kwok-1"),
	}

	// The publisher runs as the chart's publisher ServiceAccount, with the
	// chart's RBAC and admission policy: what it may do is what the
	// Deployment may.
	asChart := chartAccount(t, c, "templates/publisher.yaml", "publisher.enabled=true")
	policyRefuses(t, c, asChart, theirs)
	publish := func(name, kubeconfig string) *kubetest.Process {
		return c.Start(t, kubetest.Program{Name: name, Args: []string{bin, "publish", "--kubeconfig", kubeconfig,
			"--node-selector", kwokLabel + "=kwok", "--fleet-configmap", namespace + "/" + configMap, "--listen", listen}})
	}

	// Negative control: with no publisher, and then with one given a
	// wrong map (every node the default, an H100 board), the judge sees
	// the nodes without their profiles' slices.
	for _, w := range want {
		require.NotEmpty(t, judge(t, c.Client, w), "no publisher: %s", w.node)
	}
	wrong := map[string]string{fleet.ConfigMapKey: "default: hgx-h100\n"}
	updateFleet(t, c.Client, wrong)
	control := publish("publisher-wrong-map", c.Kubeconfig)
	waitFor(t, control, "the wrong map's slices on kwok-0", func() string {
		return judge(t, c.Client, expected{"kwok-0", "hgx-h100", "built-in-hgx-h100"})
	})
	for _, w := range want {
		require.NotEmpty(t, judge(t, c.Client, w), "a wrong map: %s", w.node)
	}
	control.Stop(t)

	// The publisher, given the fleet map, makes each node's slices its
	// profile's: the wrong map's are replaced in place.
	updateFleet(t, c.Client, data)
	p := publish("publisher", asChart)
	for _, w := range want {
		waitFor(t, p, w.node+" published", func() string { return judge(t, c.Client, w) })
	}
	waitFor(t, p, "/readyz", func() string { return readyz(c) })
	// The event the real node's window waits out: the publisher's plan of
	// it, its refusal or, were it not refused, its own slices there (the
	// ResourceSlice controller creates them after deleting what it takes
	// for obsolete in the pool). Seen red with the KWOK check, the mark's
	// selector and the policy taken out: another's slice deleted.
	waitFor(t, p, "the real node planned", func() string {
		if refused(p, kubetest.NodeName) == "" || len(ownSlices(t, c.Client, kubetest.NodeName)) > 0 {
			return ""
		}
		return "neither refused nor published on"
	})
	for _, s := range theirs {
		requireUntouched(t, c.Client, s)
	}
	require.Empty(t, refused(p, kubetest.NodeName))
	require.Empty(t, ownSlices(t, c.Client, kubetest.NodeName), "the real node, selected, carries none of the publisher's")
	for _, w := range want {
		kubetest.WriteObject(t, objects, w.node+"-resourceslices.json", ownSlices(t, c.Client, w.node))
	}

	// Re-profile kwok-0 through the ConfigMap: the figure is from the
	// update's return to the slices changed.
	before := ownSlices(t, c.Client, "kwok-0")
	data[fleet.ConfigMapKey] = strings.Replace(fleetYAML, "kwok-0: t4-vm", "kwok-0: hgx-h100", 1)
	updated := updateFleet(t, c.Client, data)
	reprofiled := expected{"kwok-0", "hgx-h100", "built-in-hgx-h100"}
	gpuBefore := driverSlice(t, before, resourceslices.NVIDIAGPUDriver)
	var gpuUpdated time.Duration
	waitFor(t, p, "kwok-0 re-profiled", func() string {
		if gpuUpdated == 0 {
			for _, s := range ownSlices(t, c.Client, "kwok-0") {
				if s.Name == gpuBefore.Name && s.ResourceVersion != gpuBefore.ResourceVersion {
					gpuUpdated = time.Since(updated)
				}
			}
		}
		return judge(t, c.Client, reprofiled)
	})
	took := time.Since(updated)
	after := ownSlices(t, c.Client, "kwok-0")
	gpuAfter := driverSlice(t, after, resourceslices.NVIDIAGPUDriver)
	require.Equal(t, gpuBefore.Name, gpuAfter.Name, "updated in place")
	// The GPU slice is updated by its running controller; the HCAs' slice
	// (t4-vm has none) is the first of a new dra.net controller, whose
	// start waits for its informer's sync, which it polls each second.
	t.Logf("figure: re-profile through the ConfigMap to the GPU slice updated: %s; to every slice the profile's (a dra.net slice added): %s (pool generation %d -> %d)",
		gpuUpdated.Round(time.Millisecond), took.Round(time.Millisecond), gpuBefore.Spec.Pool.Generation, gpuAfter.Spec.Pool.Generation)
	kubetest.WriteObject(t, objects, "kwok-0-reprofiled-resourceslices.json", after)
	kubetest.WriteObject(t, objects, "fleet-configmap.json", fleetConfigMap(t, c.Client))

	// kwok-1 leaves the selector: the publisher withdraws its slices.
	n, err := c.Client.CoreV1().Nodes().Get(ctx, "kwok-1", metav1.GetOptions{})
	require.NoError(t, err)
	delete(n.Labels, kwokLabel)
	_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, p, "kwok-1 withdrawn", func() string { return none(t, c.Client, "kwok-1") })
	for _, s := range theirs {
		requireUntouched(t, c.Client, s)
	}
	require.Equal(t, 1, strings.Count(p.Log(), "node="+kubetest.NodeName), "one line of the real node, however often planned:\n%s", p.LogTail())

	// The publisher stops: the slices stay. kwok-2 is deleted then: the
	// garbage collector withdraws its slices, by their owner reference.
	p.Stop(t)
	require.Empty(t, judge(t, c.Client, want[2]), "kwok-2's slices stay with the publisher stopped")
	require.NoError(t, c.Client.CoreV1().Nodes().Delete(ctx, "kwok-2", metav1.DeleteOptions{}))
	deleted := time.Now()
	waitFor(t, nil, "kwok-2's slices collected", func() string { return none(t, c.Client, "kwok-2") })
	t.Logf("figure: node deleted to its slices collected by the garbage collector: %s", time.Since(deleted).Round(time.Millisecond))
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, objects, "nodes.json", nodes)
}

// chartAccount creates the ServiceAccount, RBAC and admission policy the
// chart's template renders (helm template of release nvml-mock-sysfs,
// whose fleet ConfigMap is configMap, a fleet and sets), not its
// workloads, whose image the cluster has not, and returns a kubeconfig
// that acts as the account.
func chartAccount(t *testing.T, c *kubetest.Cluster, template string, sets ...string) string {
	t.Helper()
	args := []string{"template", "nvml-mock-sysfs", filepath.Join(overlaytest.Repo(t), chartDir),
		"--namespace", namespace, "--set", "fleet.default=dgx-a100", "--show-only", template}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	helm := exec.Command(programs.NeedBinary(t, programs.Helm()), args...)
	helm.Env = append(os.Environ(), programs.HelmEnv(t.TempDir())...)
	out, err := helm.Output()
	require.NoError(t, err)
	m := &podtest.Manifests{}
	require.NoError(t, m.DecodeAll(bytes.NewReader(out)))
	require.Len(t, m.ServiceAccounts, 1)
	ctx := context.Background()
	sa := m.ServiceAccounts[0]
	_, err = c.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{})
	require.NoError(t, err)
	rbac := c.Client.RbacV1()
	for _, r := range m.ClusterRoles {
		_, err := rbac.ClusterRoles().Create(ctx, &r, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, b := range m.ClusterRoleBindings {
		_, err := rbac.ClusterRoleBindings().Create(ctx, &b, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, r := range m.Roles {
		_, err := rbac.Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, b := range m.RoleBindings {
		_, err := rbac.RoleBindings(b.Namespace).Create(ctx, &b, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	admission := c.Client.AdmissionregistrationV1()
	for _, p := range m.ValidatingAdmissionPolicies {
		_, err := admission.ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, b := range m.ValidatingAdmissionPolicyBindings {
		_, err := admission.ValidatingAdmissionPolicyBindings().Create(ctx, &b, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	require.NoError(t, err)
	for _, user := range cfg.AuthInfos {
		// The API server's name of a ServiceAccount.
		user.Impersonate = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	}
	file := filepath.Join(t.TempDir(), "publisher.kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, file))
	return file
}

// readyz is what the publisher's /readyz says when not 200, or "".
func readyz(c *kubetest.Cluster) string {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: c.Dial}}
	resp, err := client.Get("http://" + listen + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%s: %s", resp.Status, body)
	}
	return ""
}

// judge says how the publisher's slices on w.node differ from those the
// real drivers published for w's profile in their recorded runs (read
// from the product's testdata by recordedRun, not planned by the product),
// or "" when they do not: each driver's slices, spec for spec, but for
// what names the node (the recorded run's was kubetest's node), owned by
// the Node and marked as the publisher's.
func judge(t *testing.T, client kubernetes.Interface, w expected) string {
	t.Helper()
	recorded := recordedRun(t, w.row)
	node, err := client.CoreV1().Nodes().Get(context.Background(), w.node, metav1.GetOptions{})
	require.NoError(t, err)
	got := ownSlices(t, client, w.node)
	if len(got) != len(recorded) {
		return fmt.Sprintf("%s: %d slices of the publisher's, the drivers published %d for %s", w.node, len(got), len(recorded), w.row)
	}
	for i, g := range got {
		r := recorded[i]
		wantName := strings.Replace(r.GenerateName, "-"+kubetest.NodeName+"-", "-"+w.node+"-", 1)
		switch {
		case g.GenerateName != wantName:
			return fmt.Sprintf("%s: generateName %q, the driver's would be %q", w.node, g.GenerateName, wantName)
		case len(g.OwnerReferences) != 1 || g.OwnerReferences[0].Kind != "Node" || g.OwnerReferences[0].UID != node.UID:
			return fmt.Sprintf("%s: slice %s's owners %+v, want the Node %s", w.node, g.Name, g.OwnerReferences, node.UID)
		case g.Labels[publisher.OwnLabel] != publisher.OwnValue:
			return fmt.Sprintf("%s: slice %s's labels %v lack the publisher's mark", w.node, g.Name, g.Labels)
		}
		if diff := sameAsRecorded(r, g, w.node); diff != "" {
			return fmt.Sprintf("%s: slice %s (%s): %s", w.node, g.Name, w.row, diff)
		}
	}
	return ""
}

// sameAsRecorded says how got's spec differs from the recorded slice's,
// once what names the node is the node's: "" when it does not. Devices
// are matched by name (a driver's order is a Go map's). The pool's
// generation is the controller's count of writes, no fact of the profile.
//
// One recorded attribute is the recording host's, not the profile's:
// dranet reads a function's NUMA node for dra.net/numaNode through ghw,
// which sees none on a host of one NUMA node, as the recording host was,
// so the recorded HCAs lack it. It is the device's NUMA node all the
// same, which dranet publishes as resource.kubernetes.io/numaNode too:
// where the recording lacks it, the published one must equal that.
func sameAsRecorded(recorded, got resourcev1.ResourceSlice, node string) string {
	r, g := recorded.Spec.DeepCopy(), got.Spec.DeepCopy()
	if r.NodeName == nil || *r.NodeName != kubetest.NodeName || r.Pool.Name != kubetest.NodeName {
		return fmt.Sprintf("the recorded slice is not of node %s, its pool named for it", kubetest.NodeName)
	}
	r.NodeName, r.Pool.Name, r.Pool.Generation = &node, node, g.Pool.Generation
	byName := func(a, b resourcev1.Device) int { return cmp.Compare(a.Name, b.Name) }
	slices.SortFunc(r.Devices, byName)
	slices.SortFunc(g.Devices, byName)
	if len(r.Devices) == len(g.Devices) {
		for i := range g.Devices {
			const dranetNUMA, standardNUMA = resourcev1.QualifiedName(resourceslices.DRANetDriver + "/numaNode"), resourcev1.QualifiedName("resource.kubernetes.io/numaNode")
			published, ok := g.Devices[i].Attributes[dranetNUMA]
			if _, recordedToo := r.Devices[i].Attributes[dranetNUMA]; !ok || recordedToo || g.Driver != resourceslices.DRANetDriver {
				continue
			}
			if standard := r.Devices[i].Attributes[standardNUMA]; !apiequality.Semantic.DeepEqual(published, standard) {
				pj, _ := json.Marshal(published)
				sj, _ := json.Marshal(standard)
				return fmt.Sprintf("device %s: %s %s, the recorded %s %s", g.Devices[i].Name, dranetNUMA, pj, standardNUMA, sj)
			}
			delete(g.Devices[i].Attributes, dranetNUMA)
		}
	}
	if !apiequality.Semantic.DeepEqual(r, g) {
		return fmt.Sprintf("spec differs from the driver's recorded one (%d devices, recorded %d):\n%s", len(g.Devices), len(r.Devices), specDiff(r, g))
	}
	return ""
}

// specDiff is the first lines where two specs' JSON differ, to read.
func specDiff(r, g *resourcev1.ResourceSliceSpec) string {
	rj, _ := json.MarshalIndent(r, "", " ")
	gj, _ := json.MarshalIndent(g, "", " ")
	rl, gl := strings.Split(string(rj), "\n"), strings.Split(string(gj), "\n")
	var out []string
	for i := 0; i < max(len(rl), len(gl)) && len(out) < 10; i++ {
		var a, b string
		if i < len(rl) {
			a = rl[i]
		}
		if i < len(gl) {
			b = gl[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d: recorded %s, published %s", i+1, strings.TrimSpace(a), strings.TrimSpace(b)))
		}
	}
	return strings.Join(out, "\n")
}

// recordedRun is what the real drivers published for a row of the DRA
// suite, every driver's recorded run that has the row (the NVIDIA
// driver's, and dranet's on a profile with HCAs), driver by driver in
// the order the publisher's slices are listed in. It reads the files the
// product's testdata keeps (resourceslices.RecordedRuns says where each
// driver's current run is), with a reader of its own.
func recordedRun(t *testing.T, row string) []resourcev1.ResourceSlice {
	t.Helper()
	var out []resourcev1.ResourceSlice
	for _, dir := range resourceslices.RecordedRuns() {
		file := filepath.Join(overlaytest.Repo(t), "overlay/resourceslices", dir, row, "resourceslices.json")
		data, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		var list resourcev1.ResourceSliceList
		require.NoError(t, json.Unmarshal(data, &list), file)
		require.NotEmpty(t, list.Items, file)
		out = append(out, list.Items...)
	}
	require.NotEmpty(t, out, "no recorded run of row %s", row)
	sortByDriver(out)
	return out
}

// anothersSlice creates, as the cluster's admin, a slice of driver on
// node that someone other than the publisher published: no mark, a device
// of its own, in the pool the drivers name for the node.
func anothersSlice(t *testing.T, client kubernetes.Interface, driver, node string) *resourcev1.ResourceSlice {
	t.Helper()
	s, err := client.ResourceV1().ResourceSlices().Create(context.Background(), &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "someone-elses-" + driver + "-" + node},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node,
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "someone-elses-0"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return s
}

// requireUntouched fails unless s is in the API as it was made: neither
// updated (its resource version) nor deleted.
func requireUntouched(t *testing.T, client kubernetes.Interface, s *resourcev1.ResourceSlice) {
	t.Helper()
	got, err := client.ResourceV1().ResourceSlices().Get(context.Background(), s.Name, metav1.GetOptions{})
	require.NoError(t, err, "%s, another's slice on %s, was deleted", s.Name, *s.Spec.NodeName)
	require.Equal(t, s.UID, got.UID, "%s was made again", s.Name)
	require.Equal(t, s.ResourceVersion, got.ResourceVersion, "%s, another's slice on %s, was updated", s.Name, *s.Spec.NodeName)
}

// refused says what the publisher's log lacks of its refusal of node, a
// Node not KWOK's, or "" when it has it.
func refused(p *kubetest.Process, node string) string {
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "not a KWOK node") && strings.Contains(line, "node="+node+" ") {
			return ""
		}
	}
	return "no refusal of " + node + " in its log"
}

// policyRefuses: the chart's admission policy refuses the publisher's
// account, as the API server admits its requests (dry runs: nothing is
// written), a slice of its mark on the real node, a slice without its
// mark on a KWOK node, and an update or a delete of another's slice,
// though its RBAC allows each. The policy takes effect a moment after it
// is made: the first refusal is waited for. Seen red with the policy not
// made (the first dry run was admitted).
func policyRefuses(t *testing.T, c *kubetest.Cluster, kubeconfig string, theirs []*resourcev1.ResourceSlice) {
	t.Helper()
	// The kubeconfig is the processes' in the cluster's network; the test
	// reaches the API server through the cluster's dialer, as the account.
	file, err := clientcmd.LoadFromFile(kubeconfig)
	require.NoError(t, err)
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate.UserName = file.AuthInfos[file.Contexts[file.CurrentContext].AuthInfo].Impersonate
	require.NotEmpty(t, cfg.Impersonate.UserName, "%s acts as no account", kubeconfig)
	account, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	api := account.ResourceV1().ResourceSlices()
	ctx, dry := context.Background(), []string{metav1.DryRunAll}
	slice := func(node string, marked bool) *resourcev1.ResourceSlice {
		s := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "00000-" + resourceslices.NVIDIAGPUDriver + "-" + node + "-"},
			Spec: resourcev1.ResourceSliceSpec{Driver: resourceslices.NVIDIAGPUDriver, NodeName: &node,
				Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
				Devices: []resourcev1.Device{{Name: "gpu-0"}}},
		}
		if marked {
			s.Labels = map[string]string{publisher.OwnLabel: publisher.OwnValue}
		}
		return s
	}
	refusal := func(err error, want string) string {
		switch {
		case err == nil:
			return "admitted"
		case !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err), !strings.Contains(err.Error(), want):
			return fmt.Sprintf("refused, but not by the policy's %q: %v", want, err)
		}
		return ""
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := api.Create(ctx, slice(kubetest.NodeName, true), metav1.CreateOptions{DryRun: dry})
		last := refusal(err, "Node "+kubetest.NodeName+" is not KWOK's")
		if last == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the publisher's account, a slice of its mark on the real node %s: %s", kubetest.NodeName, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, err = api.Create(ctx, slice("kwok-2", true), metav1.CreateOptions{DryRun: dry})
	require.NoError(t, err, "a slice of its mark on a KWOK node")
	_, err = api.Create(ctx, slice("kwok-2", false), metav1.CreateOptions{DryRun: dry})
	require.Empty(t, refusal(err, "carry the label "+publisher.OwnLabel), "a slice without its mark on a KWOK node: %v", err)
	for _, s := range theirs {
		err := api.Delete(ctx, s.Name, metav1.DeleteOptions{DryRun: dry})
		require.Empty(t, refusal(err, "updates and deletes only the slices labelled"), "delete %s: %v", s.Name, err)
		marked := s.DeepCopy()
		marked.Labels = map[string]string{publisher.OwnLabel: publisher.OwnValue}
		_, err = api.Update(ctx, marked, metav1.UpdateOptions{DryRun: dry})
		require.Empty(t, refusal(err, "updates and deletes only the slices labelled"), "update %s: %v", s.Name, err)
	}
}

// none says what is left published on node, or "" when nothing is.
func none(t *testing.T, client kubernetes.Interface, node string) string {
	if left := ownSlices(t, client, node); len(left) > 0 {
		return fmt.Sprintf("%d slices left on %s", len(left), node)
	}
	return ""
}

// ownSlices are the slices the publisher published on node (they carry
// its mark), driver by driver.
func ownSlices(t *testing.T, client kubernetes.Interface, node string) []resourcev1.ResourceSlice {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{publisher.OwnLabel: publisher.OwnValue}).String(),
	})
	require.NoError(t, err)
	sortByDriver(list.Items)
	return list.Items
}

// driverSlice is the one slice of driver in list.
func driverSlice(t *testing.T, list []resourcev1.ResourceSlice, driver string) resourcev1.ResourceSlice {
	t.Helper()
	var out []resourcev1.ResourceSlice
	for _, s := range list {
		if s.Spec.Driver == driver {
			out = append(out, s)
		}
	}
	require.Len(t, out, 1, "slices of %s", driver)
	return out[0]
}

// sortByDriver orders slices by driver, then by name (a slice's index is
// its name's prefix).
func sortByDriver(items []resourcev1.ResourceSlice) {
	slices.SortStableFunc(items, func(a, b resourcev1.ResourceSlice) int {
		return cmp.Or(cmp.Compare(a.Spec.Driver, b.Spec.Driver), cmp.Compare(a.GenerateName, b.GenerateName))
	})
}

func fleetConfigMap(t *testing.T, client kubernetes.Interface) *corev1.ConfigMap {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(context.Background(), configMap, metav1.GetOptions{})
	require.NoError(t, err)
	return cm
}

// updateFleet replaces the fleet ConfigMap's data and returns when the
// API server took it.
func updateFleet(t *testing.T, client kubernetes.Interface, data map[string]string) time.Time {
	t.Helper()
	cm := fleetConfigMap(t, client)
	cm.Data = data
	_, err := client.CoreV1().ConfigMaps(namespace).Update(context.Background(), cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	return time.Now()
}

// waitFor polls check until it says nothing; the failure names what it
// last said and the end of the publisher's log.
func waitFor(t *testing.T, p *kubetest.Process, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		last := check()
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			log := ""
			if p != nil {
				log = "\n" + p.LogTail()
			}
			t.Fatalf("%s: after %s: %s%s", what, wait, last, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
