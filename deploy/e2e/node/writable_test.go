package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writable"
)

// The chart's writable variant (writable.enabled) on a kubetest node.
const (
	// writableValues turns the writable mode on, as docs/user/writable.md
	// says to.
	writableValues = chartDir + "/ci/writable-values.yaml"
	// writableProfile is the writable docs' profile: two GPUs, each beside
	// an HCA with SR-IOV. The chart serves a profile file of its own
	// through the fleet map's default (the image holds no profile file).
	writableProfile    = "testdata/profiles/sriov.yaml"
	writableProfileKey = "sriov.yaml"
	// viewType is the view's type in the node's mountinfo: FUSE's, with
	// the name serve gives its server.
	viewType = "fuse.nvml-mock-sysfs"
	// writerImage runs the writes: a shell from the host's /usr (a
	// hostPath volume) and a /lib of its own, where the runtime creates
	// the mount target of the writable spec's modules.alias stand-in (the
	// host's /usr is read-only in the container).
	writerImage = "localhost/nvml-mock-sysfs/writer:test"
	// writerContainer is the writer pods' container.
	writerContainer = "writer"
	// The errors the controls must show, as the C library words them.
	erofsText    = "Read-only file system"
	enotconnText = "Transport endpoint is not connected"
)

// helmWritable is the node suite's node, with the chart installed by the
// Helm CLI, and what the steps share.
type helmWritable struct {
	*suite
	helm, helmHome string
	ns             string // the release's namespace
	values         string // the profile's values file
	gpus           []string
	// nsPID is a process in the node's mount namespace (its kubelet):
	// where the view propagates to, and where served namespaces are made.
	nsPID int
	// writableInstalled is set once the writable release is installed
	// (by testPrivate, unless it stopped before).
	writableInstalled bool
}

// TestHelmWritable installs the chart's writable variant (--values
// ci/writable-values.yaml) with the Helm CLI on a kubetest node and shows
// the privileged DaemonSet working: the pod Ready, its FUSE view
// propagated to the node's overlay path (Bidirectional), the spec it
// wrote the writable one, and a pod given our CDI device (and a served
// namespace of the spec's mounts) binding a GPU to vfio-pci by writes,
// which the node sees. Controls: the default install's same writes get
// "Read-only file system" and its overlay path is no FUSE mount; on a
// node whose mounts are private, containerd refuses the Bidirectional
// mount. Then helm uninstall: serve unmounts the view, the node's overlay
// path is a plain directory again with the state kept, and a container
// still holding the view gets ENOTCONN.
func TestHelmWritable(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	began := time.Now()
	repo := overlaytest.Repo(t)
	w := &helmWritable{suite: &suite{repo: repo, root: fleetRoot, spec: fleetSpec}, ns: fleetNamespace(t, repo)}
	w.helm, w.helmHome = programs.NeedBinary(t, programs.Helm()), t.TempDir()
	w.values = w.profileValues(t)
	bin := hosttest.BuildBinary(t)
	ds := podtest.DecodeManifests(t, filepath.Join(repo, "deploy/kubernetes"))
	require.Len(t, ds.DaemonSets, 1)
	image := ds.DaemonSets[0].Spec.Template.Spec.Containers[0].Image

	w.c = kubetest.Start(t, kubetest.Options{})
	w.node = w.c.Nodes[0]
	w.nsPID = w.node.Kubelet.PID
	w.node.Runtime.Import(t, containerdtest.BinaryImage(t, containerdtest.NormalizedImage(image), bin), containerdtest.CRINamespace)
	w.node.Runtime.Import(t, writerImageOf(t), containerdtest.CRINamespace)
	w.figure("node and programs ready in %s", time.Since(began).Round(time.Millisecond))

	runSteps(t, []step{
		{"the default install: read-only, no view", w.testDefault, true},
		{"writable on a node whose mounts are private: containerd refuses Bidirectional", w.testPrivate, true},
		{"writable on a node whose / is shared: the view reaches the node", w.testShared, false},
		{"containers bind GPUs to vfio-pci by writes", w.testBind, false},
		{"helm uninstall ends the view", w.testUninstall, true},
	})
	w.c.Stop(t)
	t.Run("nothing is left on the host", func(t *testing.T) {
		require.Empty(t, w.c.Leftovers())
	})
	w.figure("the whole test in %s", time.Since(began).Round(time.Millisecond))
	t.Logf("TestHelmWritable (deploy/e2e/node): the chart's writable variant on a real node\n%s", strings.Join(w.figures, "\n"))
}

// profileValues writes the chart's values that serve writableProfile on
// every node: the fleet map's default, the profile a key of its ConfigMap.
// It reads the profile's GPUs too.
func (w *helmWritable) profileValues(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(w.repo, writableProfile))
	require.NoError(t, err)
	for _, g := range facts(t, writableProfileKey, "", string(text)).GPUs {
		w.gpus = append(w.gpus, g.BusID)
	}
	require.GreaterOrEqual(t, len(w.gpus), 2, "%s: a GPU for a pod, one for a served namespace", writableProfile)
	var v struct {
		Fleet struct {
			Default  string            `yaml:"default"`
			Profiles map[string]string `yaml:"profiles"`
		} `yaml:"fleet"`
	}
	v.Fleet.Default, v.Fleet.Profiles = writableProfileKey, map[string]string{writableProfileKey: string(text)}
	data, err := yaml.Marshal(v)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "profile-values.yaml")
	require.NoError(t, os.WriteFile(file, data, 0o644))
	return file
}

// writerImageOf is writerImage: links into the host's /usr, which the
// pods mount, and a /lib of its own whose multiarch directories link
// there too (the dynamic loader's link names one).
func writerImageOf(t *testing.T) ociimage.Image {
	t.Helper()
	img := ociimage.Image{Name: writerImage}
	for _, dir := range []string{"/usr", "/lib", "/tmp"} {
		img.Files = append(img.Files, ociimage.File{Path: dir, Mode: os.ModeDir | 0o755})
	}
	for _, l := range []string{"bin", "sbin", "lib64"} {
		img.Files = append(img.Files, ociimage.File{Path: "/" + l, Mode: os.ModeSymlink, Link: "usr/" + l})
	}
	multiarch, err := filepath.Glob("/usr/lib/*-linux-gnu*")
	require.NoError(t, err)
	require.NotEmpty(t, multiarch, "the host's /usr/lib has no multiarch directory for the writer's shell")
	for _, dir := range multiarch {
		img.Files = append(img.Files, ociimage.File{Path: "/lib/" + filepath.Base(dir), Mode: os.ModeSymlink, Link: "../usr/lib/" + filepath.Base(dir)})
	}
	return img
}

// helmRun runs helm against the cluster, as a user does.
func (w *helmWritable) helmRun(t *testing.T, args ...string) {
	t.Helper()
	out, err := w.c.Run(programs.HelmEnv(w.helmHome), w.helm, args...)
	require.NoError(t, err)
	t.Logf("helm %s: %s", args[0], strings.TrimSpace(out))
}

// install installs the chart with the profile, and the writable values
// when writable is set, and reads its DaemonSet back.
func (w *helmWritable) install(t *testing.T, writable bool) {
	t.Helper()
	// As the node's NRI plugin: the writer pods ask for nothing, and get
	// the writable spec's edits through NRI (the FUSE view, no /dev/fuse).
	args := []string{"install", fleetRelease, filepath.Join(w.repo, chartDir), "--namespace", w.ns, "--create-namespace", "--values", w.values,
		"--set", "nri.enabled=true"}
	if writable {
		args = append(args, "--values", filepath.Join(w.repo, writableValues))
	}
	w.helmRun(t, args...)
	d, err := w.c.Client.AppsV1().DaemonSets(w.ns).Get(context.Background(), fleetRelease, metav1.GetOptions{})
	require.NoError(t, err, "the chart's DaemonSet")
	w.ds = *d
}

// waitReady waits until the DaemonSet's pod on the node is Ready and
// returns how long that took since began.
func (w *helmWritable) waitReady(t *testing.T, began time.Time) time.Duration {
	t.Helper()
	w.c.Wait(t, "the DaemonSet's pod Ready", 2*time.Minute, func() error {
		if err := w.daemonSetPodReady(t); err != nil {
			return fmt.Errorf("%w\nevents:\n%s", err, w.c.Events(w.ns))
		}
		return nil
	})
	return time.Since(began)
}

// uninstall uninstalls the release and waits until its pods are gone.
func (w *helmWritable) uninstall(t *testing.T) time.Duration {
	t.Helper()
	began := time.Now()
	w.helmRun(t, "uninstall", fleetRelease, "--namespace", w.ns, "--wait")
	w.c.Wait(t, "the DaemonSet's pods gone", 2*time.Minute, func() error {
		list, err := w.c.Client.CoreV1().Pods(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(w.ds.Spec.Selector)})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d pods left", len(list.Items))
		}
		return err
	})
	_, err := w.c.Client.AppsV1().DaemonSets(w.ns).Get(context.Background(), fleetRelease, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the DaemonSet: %v", err)
	return time.Since(began)
}

// nodeMounts are the node's mounts (its mount namespace's mountinfo).
func (w *helmWritable) nodeMounts(t *testing.T) []*mountinfo.Info {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", w.nsPID))
	require.NoError(t, err)
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, nil)
	require.NoError(t, err)
	return mounts
}

// mountsAt are the node's mounts on path, bottom first.
func (w *helmWritable) mountsAt(t *testing.T, path string) []*mountinfo.Info {
	t.Helper()
	var out []*mountinfo.Info
	for _, m := range w.nodeMounts(t) {
		if m.Mountpoint == path {
			out = append(out, m)
		}
	}
	return out
}

// holding is the node's mount that path lies on: the last mounted of
// those on its nearest mount point.
func (w *helmWritable) holding(t *testing.T, path string) *mountinfo.Info {
	t.Helper()
	var best *mountinfo.Info
	for _, m := range w.nodeMounts(t) {
		if m.Mountpoint == "/" || m.Mountpoint == path || strings.HasPrefix(path, m.Mountpoint+"/") {
			if best == nil || len(m.Mountpoint) >= len(best.Mountpoint) {
				best = m
			}
		}
	}
	require.NotNil(t, best, "no mount holds %s", path)
	return best
}

// describe is a mount as a row of the report says it.
func describe(m *mountinfo.Info) string {
	return fmt.Sprintf("%s on %s (source %s, propagation %q)", m.FSType, m.Mountpoint, m.Source, m.Optional)
}

// isFUSE is whether a mount is a FUSE one.
func isFUSE(m *mountinfo.Info) bool {
	return m.FSType == "fuse" || strings.HasPrefix(m.FSType, "fuse.")
}

// specMounts are the mounts of the spec on the node, our one device's.
func (w *helmWritable) specMounts(t *testing.T) []*specs.Mount {
	t.Helper()
	spec, err := cdispec.ReadSpec(w.nodePath(w.spec))
	require.NoError(t, err, "the CDI spec at the node's %s", w.spec)
	require.Len(t, spec.Devices, 1)
	return spec.Devices[0].ContainerEdits.Mounts
}

// mountTo is the spec's mount at a container path, or nil.
func mountTo(mounts []*specs.Mount, containerPath string) *specs.Mount {
	for _, m := range mounts {
		if m.ContainerPath == containerPath {
			return m
		}
	}
	return nil
}

// writerPod is a pod on the node that asks for writes by annotation, and
// for nothing else, served the spec's edits by serve --nri, running
// command in writerImage.
func (w *helmWritable) writerPod(name string, command ...string) *corev1.Pod {
	volumes, mounts := kubetest.HostPathVolumes("host", []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}})
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Annotations: map[string]string{nriplugin.WritableAnnotation: "true"}},
		Spec: corev1.PodSpec{
			NodeName: w.node.Name, RestartPolicy: corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: writerContainer, Image: writerImage, ImagePullPolicy: corev1.PullNever,
				Command: command, VolumeMounts: mounts}},
			Volumes: volumes,
		},
	}
}

// served is a container of the spec's mounts on the node, as runc
// applies them: a namespace made from the node's, where the view is.
// Mounts whose top-level directory the node lacks are left out (the
// chart's --also-at=/host-sys/bus/pci/devices, nfd-worker's): Served's
// spec mode makes a missing target in a layer over its top-level
// directory, and / itself takes none. The writes use none of them.
func (w *helmWritable) served(t *testing.T) hosttest.Served {
	t.Helper()
	var mounts []*specs.Mount
	for _, m := range w.specMounts(t) {
		top := "/" + strings.SplitN(strings.TrimPrefix(m.ContainerPath, "/"), "/", 2)[0]
		if _, err := os.Lstat(w.nodePath(top)); err != nil {
			t.Logf("served namespace: %s left out (the node has no %s)", m.ContainerPath, top)
			continue
		}
		mounts = append(mounts, m)
	}
	return hosttest.Served{Spec: mounts, Enter: w.nsPID}
}

// testDefault installs the chart without the writable values: the
// negative control. The pod is Ready, the overlay path is no FUSE mount,
// the spec mounts no drivers directory, and the writes get "Read-only
// file system" in a pod and in a served namespace. It uninstalls, and
// clears the node's overlay path and spec, so that the writable install
// starts on a node that never ran the default.
func (w *helmWritable) testDefault(t *testing.T) {
	began := time.Now()
	w.install(t, false)
	w.figure("default install -> pod Ready in %s", w.waitReady(t, began).Round(time.Millisecond))
	for _, m := range w.mountsAt(t, w.root) {
		require.False(t, isFUSE(m), "the default install's overlay path is a FUSE mount: %s", describe(m))
	}
	w.figure("default install: the node's %s lies on %s; mounts on it: %d", w.root, describe(w.holding(t, w.root)), len(w.mountsAt(t, w.root)))
	mounts := w.specMounts(t)
	require.Nil(t, mountTo(mounts, "/sys/bus/pci/drivers"), "the default spec mounts no drivers directory")
	require.Contains(t, mountTo(mounts, "/sys/bus/pci/devices").Options, "ro")

	gpu := w.gpus[0]
	done, log := w.c.RunPodToEnd(t, w.writerPod("default-bind", "/bin/sh", "-ec", hosttest.VFIOBindScript(gpu)))
	require.Equal(t, corev1.PodFailed, done.Status.Phase, "a write took on the read-only tree; log:\n%s", log)
	require.Contains(t, log, erofsText)
	w.figure("default install, a pod served by serve --nri: %q", errorLine(log))
	stdout, stderr, err := w.served(t).Shell(hosttest.VFIOBindScript(gpu))
	require.Error(t, err, "a write took on the read-only tree: %s", stdout)
	require.Contains(t, stderr, erofsText)
	w.figure("default install, a served namespace of the spec: %q", errorLine(stderr))

	w.figure("default uninstall -> pods gone in %s", w.uninstall(t).Round(time.Millisecond))
	// The node's /var/lib is kubetest's own tmpfs: removing the tree
	// there touches nothing of the host's.
	holder := w.holding(t, w.root)
	require.Equal(t, "/var/lib", holder.Mountpoint, "the overlay path lies on the node's own /var/lib")
	require.Equal(t, "tmpfs", holder.FSType)
	require.NoError(t, os.RemoveAll(w.nodePath(w.root)))
	require.NoError(t, os.Remove(w.nodePath(w.spec)))
}

// errorLine is the first line of a program's output that says
// erofsText.
func errorLine(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, erofsText) {
			return line
		}
	}
	return ""
}

// lastLine is the last line of a program's output.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// testPrivate installs the writable variant on the node as kubetest makes
// it: its mount namespace made with --propagation private, so the mount
// holding the overlay path is not shared, and containerd refuses the
// Bidirectional mount (ensureShared in its CRI plugin) before the
// container exists. The release stays for testShared.
func (w *helmWritable) testPrivate(t *testing.T) {
	holder := w.holding(t, w.root)
	// kubetest makes the node's mount namespace with --propagation
	// private: a shared mount here leaves the control nothing to refuse,
	// and it must not pass unjudged.
	require.NotContains(t, holder.Optional, "shared:", "the node's %s lies on a shared mount, though kubetest makes its mounts private: containerd has nothing to refuse (%s)", w.root, describe(holder))
	w.figure("writable install, the node as kubetest makes it: %s lies on %s", w.root, describe(holder))
	began := time.Now()
	w.install(t, true)
	w.writableInstalled = true
	var refusal string
	w.c.Wait(t, "containerd's refusal of the Bidirectional mount", time.Minute, func() error {
		list, err := w.c.Client.CoreV1().Pods(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(w.ds.Spec.Selector)})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, "not a shared mount") {
					refusal = cs.State.Waiting.Reason + ": " + cs.State.Waiting.Message
					return nil
				}
				if cs.Ready {
					return nil
				}
			}
		}
		return fmt.Errorf("no refusal yet: %d pods\nevents:\n%s", len(list.Items), w.c.Events(w.ns))
	})
	require.NotEmpty(t, refusal, "the writable pod ran on a node whose mounts are private")
	require.Contains(t, refusal, strconv.Quote(w.root))
	w.figure("writable install, private mounts -> refused in %s: %s", time.Since(began).Round(time.Millisecond), refusal)
}

// testShared makes the node's mounts shared, as systemd makes a real
// node's (mount --make-rshared / in the node's mount namespace, which
// kubetest made private, so nothing reaches the host), and recreates the
// pod: it turns Ready, the node's overlay path is the view (a FUSE mount
// of serve's, propagated from the pod), and the spec is the writable one.
func (w *helmWritable) testShared(t *testing.T) {
	w.node.ShareMounts(t)
	holder := w.holding(t, w.root)
	require.Contains(t, holder.Optional, "shared:")
	if !w.writableInstalled {
		w.install(t, true)
		w.writableInstalled = true
	}
	began := time.Now()
	list, err := w.c.Client.CoreV1().Pods(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(w.ds.Spec.Selector)})
	require.NoError(t, err)
	for _, p := range list.Items {
		if !kubetest.PodReady(&p) {
			require.NoError(t, w.c.Client.CoreV1().Pods(w.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
		}
	}
	w.figure("writable, / shared, the refused pod deleted -> a new pod Ready in %s", w.waitReady(t, began).Round(time.Millisecond))
	pod := w.daemonSetPod(t)
	sc := pod.Spec.Containers[0].SecurityContext
	require.True(t, sc != nil && ptr.Deref(sc.Privileged, false), "the writable pod is privileged")

	var view *mountinfo.Info
	for _, m := range w.mountsAt(t, w.root) {
		if m.FSType == viewType {
			view = m
		}
	}
	require.NotNil(t, view, "no %s mount on the node's %s: %v", viewType, w.root, w.mountsAt(t, w.root))
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(w.nodePath(w.root), &st), "the node's view answers")
	w.figure("the node's %s: %s", w.root, describe(view))

	mounts := w.specMounts(t)
	drivers := mountTo(mounts, "/sys/bus/pci/drivers")
	require.NotNil(t, drivers, "the writable spec mounts the tree's drivers directory")
	require.Equal(t, filepath.Join(w.root, "sys/bus/pci/drivers"), drivers.HostPath)
	require.NotContains(t, drivers.Options, "ro")
	var said []string
	for _, m := range mounts {
		said = append(said, m.HostPath+" -> "+m.ContainerPath+" "+strings.Join(m.Options, ","))
	}
	w.figure("the writable spec's mounts: %s", strings.Join(said, "; "))
}

// testBind binds the first GPU to vfio-pci by writes in a pod served by
// serve --nri that asks for writes (a pod that does not is the control:
// "Read-only file system"), and the second in a served namespace of the spec: each sees its driver link and vfio-dev
// entry (the second vfio1, for the first holds vfio0), and the node's
// view lists both under vfio-pci.
func (w *helmWritable) testBind(t *testing.T) {
	first, second := w.gpus[0], w.gpus[1]
	// The negative control: a pod that does not ask for writes gets the
	// read-only tree, though served node-wide on the writable install.
	reader := w.writerPod("read-only-bind", "/bin/sh", "-ec", hosttest.VFIOBindScript(first))
	reader.Annotations = nil
	done, refused := w.c.RunPodToEnd(t, reader)
	require.Equal(t, corev1.PodFailed, done.Status.Phase, "a pod that did not ask for writes took one; log:\n%s", refused)
	require.Contains(t, refused, erofsText)
	w.figure("writable install, a pod served by serve --nri that did not ask for writes: %q", errorLine(refused))
	began := time.Now()
	log := w.c.RunPod(t, w.writerPod("bind", "/bin/sh", "-ec", hosttest.VFIOBindScript(first)))
	require.Equal(t, "(null)\nvfio-pci\nvfio0\n", log, "the pod's writes and reads of %s", first)
	w.figure("a pod served by serve --nri binds %s: %q, in %s", first, log, time.Since(began).Round(time.Millisecond))
	stdout, stderr, err := w.served(t).Shell(hosttest.VFIOBindScript(second))
	require.NoError(t, err, "a served namespace of the spec: %s", stderr)
	require.Equal(t, "(null)\nvfio-pci\nvfio1\n", stdout, "the served namespace's writes and reads of %s", second)
	w.figure("a served namespace of the spec binds %s: %q", second, stdout)

	entries, err := os.ReadDir(w.nodePath(filepath.Join(w.root, "sys/bus/pci/drivers/vfio-pci")))
	require.NoError(t, err, "the node's view of vfio-pci")
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for _, gpu := range []string{first, second} {
		require.Contains(t, names, gpu, "the node's view lists %s under vfio-pci", gpu)
	}
	w.figure("the node's %s/sys/bus/pci/drivers/vfio-pci: %v", w.root, names)
}

// viewHolder is a container started on the view that outlives serve: a
// pod served by serve --nri. read returns what it last read of the first GPU's
// driver_override, its error included.
type viewHolder struct {
	what string
	read func(t *testing.T) string
}

// startHolder starts a viewHolder and stops it when the test ends.
func (w *helmWritable) startHolder(t *testing.T) viewHolder {
	t.Helper()
	read := "cat /sys/bus/pci/devices/" + w.gpus[0] + "/driver_override 2>&1 || true"
	// It reads in a loop, into its log: crictl exec cannot reach the
	// node's streaming server, which listens on the node's loopback.
	pod := w.writerPod("holder", "/bin/sh", "-c", "while :; do "+read+"; sleep 0.2; done")
	_, err := w.c.Client.CoreV1().Pods(w.ns).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = w.c.Client.CoreV1().Pods(w.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	w.c.WaitPod(t, w.ns, pod.Name, 2*time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	return viewHolder{what: "a running pod given the device", read: func(t *testing.T) string {
		return lastLine(w.c.PodLog(t, w.ns, pod.Name))
	}}
}

// waitRead waits until the holder reads what ok accepts, and returns it.
func (w *helmWritable) waitRead(t *testing.T, h viewHolder, what string, ok func(string) bool) string {
	t.Helper()
	var got string
	w.c.Wait(t, h.what+": "+what, 30*time.Second, func() error {
		if got = h.read(t); !ok(got) {
			return fmt.Errorf("it reads %q", got)
		}
		return nil
	})
	return got
}

// testUninstall uninstalls the writable release while a container holds
// the view: serve stops; the node's overlay path is a live view no more;
// under it the state of the writes stays, the spec stays, and the holder
// gets ENOTCONN.
func (w *helmWritable) testUninstall(t *testing.T) {
	h := w.startHolder(t)
	w.waitRead(t, h, "the bound GPU's override", func(s string) bool { return s == profile.DriverVFIO })
	took := w.uninstall(t)
	w.figure("writable uninstall -> pods gone in %s", took.Round(time.Millisecond))

	var fuse []string
	for _, m := range w.mountsAt(t, w.root) {
		if isFUSE(m) {
			fuse = append(fuse, describe(m))
		}
	}
	var st unix.Statfs_t
	statErr := unix.Statfs(w.nodePath(w.root), &st)
	switch {
	case len(fuse) == 0:
		require.NoError(t, statErr)
		w.figure("after the uninstall, the node's %s: no FUSE mount (serve's unmount propagated); mounts on it: %d", w.root, len(w.mountsAt(t, w.root)))
	default:
		require.True(t, errors.Is(statErr, syscall.ENOTCONN), "the node's %s is still a FUSE mount (%v) and answers statfs: %v", w.root, fuse, statErr)
		w.figure("after the uninstall, the node's %s: a dead FUSE mount, statfs %v: %v", w.root, statErr, fuse)
		return
	}

	entries, err := os.ReadDir(w.nodePath(w.root))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	data, err := os.ReadFile(w.nodePath(filepath.Join(w.root, writable.StateFile)))
	require.NoError(t, err, "the state of the writes stays under the view")
	var state struct {
		Functions map[string]plan.FunctionState `json:"functions"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&state))
	for _, gpu := range w.gpus[:2] {
		require.Equal(t, profile.DriverVFIO, state.Functions[gpu].Driver, "the state of %s", gpu)
	}
	_, err = os.Lstat(w.nodePath(filepath.Join(w.root, plan.LinksDir)))
	require.Error(t, err, "the tree's links directory is gone with the view")
	w.figure("the node's %s now holds %v (the tree was the pod's, in memory); %s: %s", w.root, names, writable.StateFile, strings.TrimSpace(string(data)))

	_, err = os.Stat(w.nodePath(w.spec))
	require.NoError(t, err, "the spec stays, as after SIGTERM")
	w.figure("the spec stays at the node's %s; its sources under %s are gone", w.spec, w.root)

	after := w.waitRead(t, h, "ENOTCONN", func(s string) bool { return strings.Contains(s, enotconnText) })
	w.figure("%s, after the uninstall: %q", h.what, after)
}
