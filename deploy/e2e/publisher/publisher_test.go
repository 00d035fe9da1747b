// Package publisher_test runs the real binary's readers of the fleet map
// through the API against the real control plane of kubetest, each as the
// chart's ServiceAccount with the chart's RBAC.
//
// TestPublisher runs nvml-mock-sysfs publish for Nodes that run nothing
// (made through the API, as KWOK makes its nodes): each carries the slices
// resourceslices plans for the profile the fleet ConfigMap gives it, a
// re-profile through the ConfigMap updates them in place, a node relabelled
// out of the selector has them withdrawn, and a node deleted while the
// publisher is down has them collected by the garbage collector, through
// their owner reference. The objects it judged go to bin/k8s/publisher/.
//
// TestServeFleetThroughAPI runs serve --fleet-configmap on the cluster's
// node: a re-profile through the ConfigMap reaches its tree without a
// kubelet's ConfigMap sync.
package publisher_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/internal/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/resourceslices"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
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

// A node's expected profile: a built-in's name, or a file of nvml-mock's
// profiles (../shared) under its ConfigMap key.
type expected struct {
	node, profile, file string
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
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-0", Labels: map[string]string{kwokLabel: "kwok"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-1", Labels: map[string]string{kwokLabel: "kwok", profileLabel: "gb200"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kwok-2", Labels: map[string]string{kwokLabel: "kwok"}}},
	} {
		_, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	want := []expected{{"kwok-0", "t4-vm", ""}, {"kwok-1", "gb200.yaml", gb200}, {"kwok-2", "dgx-a100", ""}}

	// The publisher runs as the chart's publisher ServiceAccount, with the
	// chart's RBAC: what it may do is what the Deployment may.
	asChart := chartAccount(t, c, "templates/publisher.yaml", "publisher.enabled=true")
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
		return judge(t, c.Client, expected{"kwok-0", "hgx-h100", ""})
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
	require.Empty(t, nodeSlices(t, c.Client, kubetest.NodeName), "the real node, not selected, carries none")
	waitFor(t, p, "/readyz", func() string { return readyz(c) })
	for _, w := range want {
		kubetest.WriteObject(t, objects, w.node+"-resourceslices.json", nodeSlices(t, c.Client, w.node))
	}

	// Re-profile kwok-0 through the ConfigMap: the figure is from the
	// update's return to the slices changed.
	before := nodeSlices(t, c.Client, "kwok-0")
	data[fleet.ConfigMapKey] = strings.Replace(fleetYAML, "kwok-0: t4-vm", "kwok-0: hgx-h100", 1)
	updated := updateFleet(t, c.Client, data)
	reprofiled := expected{"kwok-0", "hgx-h100", ""}
	waitFor(t, p, "kwok-0 re-profiled", func() string { return judge(t, c.Client, reprofiled) })
	took := time.Since(updated)
	after := nodeSlices(t, c.Client, "kwok-0")
	require.Equal(t, before[0].Name, after[0].Name, "updated in place")
	t.Logf("figure: re-profile through the ConfigMap to slices changed: %s (pool generation %d -> %d)",
		took.Round(time.Millisecond), before[0].Spec.Pool.Generation, after[0].Spec.Pool.Generation)
	kubetest.WriteObject(t, objects, "kwok-0-reprofiled-resourceslices.json", after)
	kubetest.WriteObject(t, objects, "fleet-configmap.json", fleetConfigMap(t, c.Client))

	// kwok-1 leaves the selector: the publisher withdraws its slices.
	n, err := c.Client.CoreV1().Nodes().Get(ctx, "kwok-1", metav1.GetOptions{})
	require.NoError(t, err)
	delete(n.Labels, kwokLabel)
	_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, p, "kwok-1 withdrawn", func() string { return none(t, c.Client, "kwok-1") })

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

// chartAccount creates the ServiceAccount and RBAC the chart's template
// renders (helm template of release nvml-mock-sysfs, whose fleet ConfigMap
// is configMap, a fleet and sets), not its workloads, whose image the
// cluster has not, and returns a kubeconfig that acts as the account.
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

// judge says how the slices published on w.node differ from those
// resourceslices plans for w's profile, owned by the Node, or "" when
// they do not.
func judge(t *testing.T, client kubernetes.Interface, w expected) string {
	t.Helper()
	source, data, err := resourceslices.ReadProfile(w.profile)
	if w.file != "" {
		source, data, err = resourceslices.ReadProfile(w.file)
	}
	require.NoError(t, err)
	planned, err := resourceslices.ForNode(source, data, w.node)
	require.NoError(t, err)
	node, err := client.CoreV1().Nodes().Get(context.Background(), w.node, metav1.GetOptions{})
	require.NoError(t, err)
	got := nodeSlices(t, client, w.node)
	if len(got) != len(planned) {
		return fmt.Sprintf("%s: %d slices, %s plans %d", w.node, len(got), w.profile, len(planned))
	}
	for i, g := range got {
		p := planned[i]
		switch {
		case g.GenerateName != p.GenerateName:
			return fmt.Sprintf("%s: generateName %q, planned %q", w.node, g.GenerateName, p.GenerateName)
		case !apiequality.Semantic.DeepEqual(g.Spec.Devices, p.Spec.Devices):
			return fmt.Sprintf("%s: slice %s's devices are not %s's", w.node, g.Name, w.profile)
		case g.Spec.Driver != p.Spec.Driver || g.Spec.Pool.Name != p.Spec.Pool.Name || g.Spec.Pool.ResourceSliceCount != p.Spec.Pool.ResourceSliceCount:
			return fmt.Sprintf("%s: slice %s: driver %s pool %+v, planned %s %+v", w.node, g.Name, g.Spec.Driver, g.Spec.Pool, p.Spec.Driver, p.Spec.Pool)
		case len(g.OwnerReferences) != 1 || g.OwnerReferences[0].Kind != "Node" || g.OwnerReferences[0].UID != node.UID:
			return fmt.Sprintf("%s: slice %s's owners %+v, want the Node %s", w.node, g.Name, g.OwnerReferences, node.UID)
		}
	}
	return ""
}

// none says what is left published on node, or "" when nothing is.
func none(t *testing.T, client kubernetes.Interface, node string) string {
	if left := nodeSlices(t, client, node); len(left) > 0 {
		return fmt.Sprintf("%d slices left on %s", len(left), node)
	}
	return ""
}

// nodeSlices are the slices published on node, driver by driver in
// resourceslices.ForNode's order (the NVIDIA driver's first).
func nodeSlices(t *testing.T, client kubernetes.Interface, node string) []resourcev1.ResourceSlice {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: fields.Set{
		resourcev1.ResourceSliceSelectorNodeName: node,
	}.String()})
	require.NoError(t, err)
	slices.SortStableFunc(list.Items, func(a, b resourcev1.ResourceSlice) int {
		return cmp.Compare(resourceslices.DriverOrder(a.Spec.Driver), resourceslices.DriverOrder(b.Spec.Driver))
	})
	return list.Items
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
