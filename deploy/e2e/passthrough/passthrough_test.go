// Package passthrough_test runs NVIDIA's kubevirt-gpu-device-plugin (the
// GPU Operator's sandbox device plugin) on the real single-node
// Kubernetes of kubetest, served our tree by the route
// docs/user/kubernetes.md gives (containerd/nri's device-injector and one pod
// annotation): with a profile whose GPUs are bound to vfio-pci it
// registers with the kubelet and the Node's allocatable lists the GPU
// model's resource with one device per vfio-pci GPU, each carrying its
// NUMA node (the kubelet's PodResources API says so); with an
// nvidia-bound profile it advertises nothing.
//
// Beside our two mounts the plugin needs (docs/user/passthrough.md):
// /usr/pci.ids, which names the resource after the GPU model;
// /dev/vfio/<group> for each GPU's IOMMU group, which it watches for
// health and hands out on allocation (here plain files in a directory the
// pod mounts at /dev/vfio: nothing opens them); and the kubelet's
// device-plugins directory, where it registers.
package passthrough_test

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

func TestMain(m *testing.M) { os.Exit(hosttest.MainAlone(m)) }

const (
	// pluginImage holds the plugin and the pci.ids it names resources
	// from; the host's /usr/lib and /usr/lib64 are mounted for its libc.
	pluginImage = "localhost/nvml-mock-sysfs/kubevirt-gpu-device-plugin:test"
	pluginPath  = "/kubevirt-gpu-device-plugin"
	// pciIDs is where the plugin reads pci.ids (its pciIdsFilePath), and
	// hostPCIIDs Debian's copy (pciutils, programs.HostPCIIDs).
	pciIDs     = "/usr/pci.ids"
	hostPCIIDs = programs.HostPCIIDs
	// devicePlugins is the kubelet's device plugin directory, fixed in
	// both (pluginapi.DevicePluginPath); in the cluster's namespace it is
	// private.
	devicePlugins = "/var/lib/kubelet/device-plugins"
	// resourcePrefix starts the plugin's resources (its DeviceNamespace).
	resourcePrefix = "nvidia.com/"
	// passthroughProfile binds three of its four GPUs to vfio-pci.
	passthroughProfile = "testdata/profiles/vfio-passthrough.yaml"
	// boundProfile binds every GPU to nvidia: the standalone ConfigMap's
	// h100, rendered from the built-in it names.
	boundProfile = "hgx-h100"
	waitTimeout  = 2 * time.Minute
)

// suite is the node and the one tree every run re-renders.
type suite struct {
	c    *kubetest.Cluster
	bin  string
	root string
	vfio string // the pod's /dev/vfio
	rows docmatrix.Rows
	// sabotage, when set, serves the plugin something else than the
	// render (programs.SabotagedRoot), to see the rows that need it fail.
	sabotage string
	// groups are the IOMMU groups of the render's GPUs on vfio-pci, by
	// address, as /dev/vfio holds them: each the group its iommu_group
	// link names, required to hold that GPU alone (vfioGroups).
	groups map[string]string
}

func TestPassthrough(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	if _, err := os.Stat(hostPCIIDs); err != nil {
		overlaytest.Missing(t, "%s is missing (Debian package pci.ids, which pciutils pulls in; make deps installs it): %v", hostPCIIDs, err)
	}
	s := &suite{bin: hosttest.BuildBinary(t), root: filepath.Join(t.TempDir(), "tree"), vfio: filepath.Join(t.TempDir(), "vfio"), sabotage: programs.Sabotage(t)}
	require.NoError(t, os.Mkdir(s.vfio, 0o755))
	// No registry serves the plugin or the device-injector that hands it
	// the tree: without either, each row says so.
	plugin, ok := programs.NeedSupplied(t, programs.KubevirtGPUDevicePlugin)
	missing := programs.KubevirtGPUDevicePlugin
	if ok {
		_, ok = programs.NeedSupplied(t, programs.DeviceInjector)
		missing = programs.DeviceInjector
	}
	if !ok {
		s.notRun(t, missing)
		return
	}
	// The matrix is written however the suite ends, each row a failure
	// stopped it before red (docmatrix.Rows.Unreached).
	t.Cleanup(func() {
		s.rows.Unreached("the suite stopped before this row (its log says where)", []string{boundRow, ""}, []string{vfioRow, ""}, []string{rowLeftovers, ""})
		s.writeMatrix(t)
	})

	s.c = kubetest.Start(t, kubetest.Options{})
	img := ociimage.Image{Name: pluginImage, Entrypoint: []string{pluginPath}, Files: []ociimage.File{
		{Path: pluginPath, Source: plugin, Mode: 0o755},
		{Path: pciIDs, Source: hostPCIIDs, Mode: 0o644},
		{Path: "/lib", Mode: os.ModeSymlink, Link: "usr/lib"},
		{Path: "/lib64", Mode: os.ModeSymlink, Link: "usr/lib64"},
		{Path: "/usr/lib", Mode: os.ModeDir | 0o755},
		{Path: "/usr/lib64", Mode: os.ModeDir | 0o755},
	}}
	s.c.Runtime.Import(t, img, containerdtest.CRINamespace)
	_, injector := s.c.Runtime.StartDeviceInjector(t)
	require.True(t, injector, "the device-injector was found supplied above")

	t.Run("nvidia-bound profile", func(t *testing.T) {
		s.rows.Expect(t, boundRow, boundWant)
		facts := s.render(t, boundProfile)
		require.Empty(t, facts.VFIOBound())
		log := s.runPlugin(t, "plugin-bound", func(log string) bool { return strings.Contains(log, "Device Map map[]") })
		// It saw the GPUs, through the tree, and skipped them.
		require.Equal(t, len(facts.GPUs), strings.Count(log, "driver nvidia is not a supported VFIO driver"), "log:\n%s", log)
		require.Empty(t, s.resources(t), "allocatable: the plugin registered nothing")
		require.Empty(t, s.allocatable(t), "PodResources")
	})
	t.Run("vfio-pci profile", func(t *testing.T) {
		s.rows.Expect(t, vfioRow, vfioWant)
		facts := s.render(t, passthroughProfile)
		gpus := facts.VFIOBound()
		require.NotEmpty(t, gpus)
		s.runPlugin(t, "plugin-vfio", func(string) bool { return len(s.resources(t)) > 0 })
		res := s.resources(t)
		require.Len(t, res, 1, "one GPU model, one resource: %v", res)
		var name string
		for n, q := range res {
			name = n
			require.Equal(t, int64(len(gpus)), q, "%s: one per vfio-pci GPU", n)
		}
		// The name is pci.ids's for the profile's device id, as Debian's
		// copy has it (programs.H100SXM5PCIIDs), in the plugin's form: the
		// entry is read here so a new pci.ids says so first.
		require.Equal(t, uint16(0x2330), gpus[0].Product(), "the profile's GPUs are H100 SXM5")
		programs.RequirePCIIDsLine(t, programs.H100SXM5PCIIDs)
		require.Equal(t, resourcePrefix+"GH100H100_SXM5_80GB", name, "the resource is named from pci.ids")
		want := map[string]int64{}
		for _, g := range gpus {
			require.True(t, g.NUMAGiven, "%s: GPU %s's root complex gives its NUMA node", passthroughProfile, g.BusID)
			want[g.BusID] = int64(g.NUMANode)
		}
		got := map[string]int64{}
		for _, d := range s.allocatable(t) {
			require.Equal(t, name, d.ResourceName)
			for _, id := range d.DeviceIds {
				require.NotNil(t, d.Topology, "device %s has a topology", id)
				require.Len(t, d.Topology.Nodes, 1, "device %s", id)
				got[id] = d.Topology.Nodes[0].ID
			}
		}
		require.Equal(t, want, got, "each vfio-pci GPU with the profile's NUMA node")
		t.Logf("allocatable %s=%d; PodResources devices (BDF: NUMA node) %v", name, res[name], got)

		// The plugin watches each GPU's /dev/vfio/<group>, the group its
		// iommu_group link names: removing one GPU's marks it unhealthy,
		// and the Node's allocatable drops by one. A /dev/vfio built with
		// another group would not (the plugin watches only its GPUs'), so
		// this is what holds /dev/vfio to the tree's groups.
		group := s.groups[gpus[0].BusID]
		require.NotEmpty(t, group, "%s's IOMMU group", gpus[0].BusID)
		require.NoError(t, os.Remove(filepath.Join(s.vfio, group)))
		s.c.Wait(t, "the GPU whose /dev/vfio/"+group+" went unhealthy", waitTimeout, func() error {
			if n := s.resources(t)[name]; n != int64(len(gpus)-1) {
				return fmt.Errorf("allocatable %s=%d, want %d", name, n, len(gpus)-1)
			}
			return nil
		})
	})
	s.c.Stop(t)
	t.Run("nothing is left on the host", func(t *testing.T) {
		s.rows.Expect(t, rowLeftovers, "nothing on the host")
		require.Empty(t, s.c.Leftovers())
	})
}

// The rows of the matrix.
const (
	boundRow     = "built-in " + boundProfile + " (every GPU on nvidia)"
	boundWant    = "no " + resourcePrefix + "* resource in the Node's allocatable, no device in PodResources"
	vfioRow      = passthroughProfile + " (3 of 4 GPUs on vfio-pci)"
	rowLeftovers = "after the suite"
	vfioWant     = "one resource named from pci.ids in the Node's allocatable, one device per vfio-pci GPU, each with its NUMA node; one fewer once a GPU's /dev/vfio group goes"
)

// notRun reports the profiles' rows as not run, the program missing not
// supplied: no node is started.
func (s *suite) notRun(t *testing.T, missing string) {
	for _, r := range [][2]string{{"nvidia-bound profile", boundRow}, {"vfio-pci profile", vfioRow}} {
		t.Run(r[0], func(t *testing.T) {
			s.rows.Expect(t, r[1], "")
			s.rows.NotRun(t, programs.NotRun(t.Name(), missing))
		})
	}
	s.writeMatrix(t)
}

// writeMatrix prints the suite's matrix and appends it to make's.
func (s *suite) writeMatrix(t *testing.T) {
	text := "TestPassthrough (deploy/e2e/passthrough): kubevirt-gpu-device-plugin on a real node\n\n" + s.rows.Table("profile", "on the node")
	t.Logf("\n%s", text)
	kubetest.AppendMatrix(t, text)
}

// render renders the profile into the suite's one tree (a re-render after
// the first), writes our CDI spec for it (for the sabotaged tree in a
// sabotaged run: programs.SabotagedRoot), and gives the IOMMU group of
// each GPU the profile binds to vfio-pci an entry in the pod's /dev/vfio.
// It returns the profile's facts, read by the wing's own reader (a
// built-in's from the text `profiles --show` prints).
func (s *suite) render(t *testing.T, name string) *profilefacts.Profile {
	t.Helper()
	file, factsFile := name, ""
	if strings.HasSuffix(name, ".yaml") {
		file = filepath.Join(overlaytest.Repo(t), name)
		factsFile = file
	} else {
		factsFile = programs.BuiltinProfile(t, name)
	}
	facts, err := profilefacts.Read(factsFile)
	require.NoError(t, err)
	_, _, err = overlay.Render(overlay.Options{Profile: file, Root: s.root, HostDevices: overlay.HostDevicesMerge})
	require.NoError(t, err)
	served, flags := programs.SabotagedRoot(t, s.sabotage, s.root)
	s.c.WriteCDISpec(t, s.bin, served, flags...)
	entries, err := os.ReadDir(s.vfio)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.Remove(filepath.Join(s.vfio, e.Name())))
	}
	// The kernel's /dev/vfio/vfio, and an entry for the group of each GPU
	// the profile binds to vfio-pci, as vfio-pci makes one per group it
	// holds.
	require.NoError(t, os.WriteFile(filepath.Join(s.vfio, "vfio"), nil, 0o644))
	s.groups = s.vfioGroups(t, facts)
	for _, group := range s.groups {
		require.NoError(t, os.WriteFile(filepath.Join(s.vfio, group), nil, 0o644))
	}
	return facts
}

// vfioGroups are the IOMMU groups of the GPUs the profile binds to
// vfio-pci (profilefacts), by bus id: the group each one's iommu_group
// link names in the render, required to be the GPU's alone, as the
// profile means it (docs/user/passthrough.md: an SXM GPU, a single
// function behind ACS, has a group of its own): its devices/ lists that
// GPU and nothing else. A GPU without a group, or two GPUs in one, fail.
func (s *suite) vfioGroups(t *testing.T, facts *profilefacts.Profile) map[string]string {
	t.Helper()
	vfio := map[string]bool{}
	for _, g := range facts.VFIOBound() {
		vfio[g.BusID] = true
	}
	groups := map[string]string{}
	require.NoError(t, filepath.WalkDir(filepath.Join(s.root, "sys/devices"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "iommu_group" || !vfio[filepath.Base(filepath.Dir(path))] {
			return err
		}
		target, err := os.Readlink(path)
		if err != nil {
			return err
		}
		groups[filepath.Base(filepath.Dir(path))] = filepath.Base(target)
		return nil
	}))
	for bus := range vfio {
		group, ok := groups[bus]
		require.True(t, ok, "GPU %s, on vfio-pci by the profile, has no iommu_group link in the render", bus)
		members, err := os.ReadDir(filepath.Join(s.root, "sys/kernel/iommu_groups", group, "devices"))
		require.NoError(t, err, "GPU %s's IOMMU group %s", bus, group)
		var names []string
		for _, m := range members {
			names = append(names, m.Name())
		}
		require.Equal(t, []string{bus}, names, "IOMMU group %s holds GPU %s alone", group, bus)
	}
	return groups
}

// runPlugin runs the plugin in a pod served the tree, until started says
// its log shows it started (or the Node shows what it registered), and
// deletes the pod when the test ends. It returns the log.
func (s *suite) runPlugin(t *testing.T, name string, started func(log string) bool) string {
	t.Helper()
	ctx := context.Background()
	volumes, mounts := kubetest.HostPathVolumes("plugin", []containerdtest.Mount{
		{HostPath: "/usr/lib", ContainerPath: "/usr/lib", ReadOnly: true},
		{HostPath: "/usr/lib64", ContainerPath: "/usr/lib64", ReadOnly: true},
		{HostPath: s.vfio, ContainerPath: "/dev/vfio", ReadOnly: true},
		{HostPath: devicePlugins, ContainerPath: devicePlugins},
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault,
			Annotations: map[string]string{"cdi-devices.noderesource.dev/container.plugin": "- " + cdispec.DefaultKind + "=" + cdispec.DeviceName}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "plugin", Image: pluginImage, ImagePullPolicy: corev1.PullNever, VolumeMounts: mounts}},
			Volumes:       volumes,
		},
	}
	_, err := s.c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
	require.NoError(t, err)
	t.Cleanup(func() {
		zero := int64(0)
		_ = s.c.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	s.c.WaitPod(t, pod.Namespace, pod.Name, waitTimeout, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var log string
	s.c.Wait(t, "the plugin "+name+" started", waitTimeout, func() error {
		log = s.c.PodLog(t, pod.Namespace, pod.Name)
		if !started(log) {
			return fmt.Errorf("log:\n%s", log)
		}
		return nil
	})
	t.Logf("the plugin's log:\n%s", log)
	return log
}

// resources are the Node's allocatable resources of the plugin.
func (s *suite) resources(t *testing.T) map[string]int64 {
	t.Helper()
	n, err := s.c.Client.CoreV1().Nodes().Get(context.Background(), kubetest.NodeName, metav1.GetOptions{})
	require.NoError(t, err)
	out := map[string]int64{}
	for name, q := range n.Status.Allocatable {
		if strings.HasPrefix(string(name), resourcePrefix) && !q.IsZero() {
			out[string(name)] = q.Value()
		}
	}
	return out
}

// allocatable is the kubelet's answer to PodResources'
// GetAllocatableResources: the devices its plugins registered, with their
// topology.
func (s *suite) allocatable(t *testing.T) []*podresourcesv1.ContainerDevices {
	t.Helper()
	sock := filepath.Join(s.c.KubeletRootDir, "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("passthrough:///kubelet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	require.NoError(t, err, "PodResources at %s", sock)
	return slices.DeleteFunc(resp.GetDevices(), func(d *podresourcesv1.ContainerDevices) bool {
		return !strings.HasPrefix(d.ResourceName, resourcePrefix)
	})
}
