package dra_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	specs "tags.cncf.io/container-device-interface/specs-go"

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
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

const (
	// vfioClass selects the driver's VFIO devices, as the DeviceClass of
	// that name in the driver's chart does.
	vfioClass = "vfio.gpu.nvidia.com"
	// passthroughProfile is the writable suite's profile: two H100 SXM
	// GPUs on nvidia (beside HCAs this run does not touch).
	passthroughProfile = "testdata/profiles/sriov.yaml"
	// nodeLayers is where, in the node's private /run, the in-memory
	// layers over the node's directories live (nodeLayer): the layer over
	// its /dev holds /dev/vfio, which the host has not.
	nodeLayers = "/run/nvml-mock-sysfs-layers"
	// controlTimeout bounds a plugin that must exit at its start: one that
	// is still running then has started, and the control has failed.
	controlTimeout = 30 * time.Second
	// vfioModule is where, below a tree's root, its module view has
	// vfio_pci: the driver stats it at <host root>/sys/module/vfio_pci
	// before it binds a GPU to vfio-pci, and runs modprobe without it.
	vfioModule = "sys/module/vfio_pci"
	// vfioTimeout bounds a wait on the driver's binding or on the kubelet's
	// retry of a container or an unprepare (its backoff is 10 s and more).
	vfioTimeout = 90 * time.Second
)

// The steps, each a row of the matrix.
const (
	stepPublish   = "publish"
	stepPrepare   = "prepare, as served"
	stepPod       = "the pod's /dev/vfio/<group>"
	stepUnprepare = "unprepare"
)

// passthroughSteps are the rows: step, what the plugin (or the node) is
// served, and what a pass shows.
func passthroughSteps() [][3]string {
	return [][3]string{
		{stepPublish, "the writable view; its iommu_groups at /sys/kernel/iommu_groups",
			"a gpu-vfio device per GPU, with its pciBusID and pcieRoot; control: the node's own iommu_groups, and the driver exits"},
		{stepPrepare, "the writable spec's mounts: its module view at /sys/module (vfio_pci loaded), its modules.alias naming vfio_pci",
			"the GPU bound to vfio-pci through the view, the claim's CDI spec naming /dev/vfio/<its group>; control: the read-only tree's spec, whose module view has no vfio_pci, and the driver's modprobe fails"},
		{stepPod, "/dev/vfio/<group> on the node: a stand-in char device 1:3",
			"the pod's container has /dev/vfio/<group>; control: without it on the node, containerd refuses the container"},
		{stepUnprepare, "the pod deleted",
			"the GPU back on nvidia, the claim's CDI spec removed; control: with the plugin stopped, the kubelet cannot unprepare and the GPU stays on vfio-pci"},
	}
}

// passthrough is the run: the node and its programs (suite), the profile,
// and serve --writable's view on the node.
type passthrough struct {
	*suite
	// file is the profile the renderer and NVML read; gpus its GPUs.
	file string
	gpus []profilefacts.GPU
	// view is serve --writable's FUSE view, mounted in the node's mount
	// namespace only; writable is its spec's mounts, as containers get
	// them.
	view     string
	writable []*specs.Mount
	// readOnly is the same profile rendered as the default mode does, for
	// the control of prepare: its module view has no vfio_pci.
	readOnly string
	rows     docmatrix.Rows
	// objects is where the API objects and the CDI spec judged are kept.
	objects string
	// cdiDir is where the driver writes a claim's CDI spec, as the test
	// reads it: the node's /var/run/cdi.
	cdiDir string
	// detail is what each step saw, the block under the matrix.
	detail map[string]string
	took   []string
}

// TestVFIOPassthrough runs the DRA driver's kubelet plugin with its
// PassthroughSupport feature gate on the kubetest node, served serve
// --writable's view: the driver publishes each GPU's VFIO device, a claim
// for one is prepared (the driver's own code binds the GPU to vfio-pci
// through the view), its pod starts with /dev/vfio/<group>, and the pod's
// deletion unprepares it (back to nvidia). Where the node cannot serve a
// step, the step's row is the driver's own message; every check has a
// control that must fail. What the driver reads, and how each path is
// served or why not: docs/evidence/writable-dra.md.
func TestVFIOPassthrough(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "nsenter", "chroot")
	began := time.Now()
	plugin, mockNVML, missing := suppliedDriver(t)
	if missing != "" {
		notRunPassthrough(t, missing, "")
		return
	}
	// The suite gives the driver the node's root as its host root by its
	// --host-root flag; a version without it chroots into a fixed
	// /host-root its chart mounts, which this suite does not make.
	if help, _ := exec.Command(plugin, "--help").CombinedOutput(); !bytes.Contains(help, []byte("--host-root")) {
		notRunPassthrough(t, programs.GPUKubeletPlugin, " (one with --host-root: the one supplied has no such flag)")
		return
	}
	overlaytest.RequireFUSE(t)
	// The driver waits for a GPU to be free with the node's fuser (chroot
	// into its host root): without one it retries for a minute and fails.
	overlaytest.RequireProgram(t, "fuser", "psmisc")

	p := &passthrough{suite: &suite{plugin: plugin, bin: hosttest.BuildBinary(t)}, detail: map[string]string{}}
	steps := passthroughSteps()
	// The matrix is written however the suite ends, a step a failure
	// stopped it before red (docmatrix.Rows.Unreached): a sabotaged run
	// that stops at publish still has every cell to judge.
	t.Cleanup(func() { p.writeMatrix(t, steps, began) })
	dir := t.TempDir()
	p.setup(t, dir, mockNVML)
	p.c = kubetest.Start(t, kubetest.Options{})
	p.cdiDir = p.c.Runtime.CDIDir
	// Not TestDRA's bin/k8s/vfio-passthrough/ (the same profile, read
	// only), which this one would empty.
	p.objects = kubetest.ObjectsDir(t, "vfio-passthrough-writable")
	p.c.Runtime.Import(t, ociimage.Image{
		Name:       verifyImage,
		Files:      []ociimage.File{{Path: "/pause", Source: hosttest.BuildStatic(t, "./deploy/e2e/containerdtest/testdata/pause"), Mode: 0o755}},
		Entrypoint: []string{"/pause"},
	}, containerdtest.CRINamespace)
	p.c.CreateDeviceClass(t, vfioClass, `device.driver == "`+driverName+`" && device.attributes["`+driverName+`"].type == "vfio"`)
	p.serveWritable(t, dir)
	if sabotage := programs.Sabotage(t); sabotage != "" {
		p.writable = p.sabotaged(t, sabotage)
	}
	nodeVFIODir(t, p.c.Runtime)
	nodeModules(t, p.c.Runtime)
	p.lap(began, "node, programs and serve --writable ready")

	check := func(row [3]string, f func(t *testing.T)) {
		t.Run(row[0], func(t *testing.T) {
			p.rows.Expect(t, row[0], row[1], row[2])
			f(t)
		})
	}

	// The control of publish first: the node's own iommu_groups, which
	// hold no group on a node without an IOMMU. Where the node has one,
	// an empty directory stands in for a node without.
	mark := time.Now()
	noGroups := "/sys/kernel/iommu_groups"
	if entries, err := os.ReadDir(noGroups); err != nil || len(entries) > 0 {
		noGroups = t.TempDir()
	}
	control, exitErr := p.exitsAtStart(t, append(slices.Clone(p.writable), bindRO(noGroups, "/sys/kernel/iommu_groups")))
	p.lap(mark, "control of publish (the plugin's exit)")

	// The control of prepare: the read-only tree's spec, whose module view
	// has no vfio_pci (the tree lists no vfio-pci), so the driver runs
	// modprobe, which a node of mock GPUs cannot.
	mark = time.Now()
	readOnly, err := p.readOnlyMounts()
	require.NoError(t, err, "the read-only tree's mounts")
	_, stop := p.start(t, "read-only", p.mounts(readOnly, p.readOnly))
	roPrepared, roMsg := p.claimAndPod(t, "read-only")
	p.releaseClaim(t, "read-only")
	p.unpublish(t, stop)
	p.lap(mark, "control of prepare (the read-only tree)")

	// As served: the writable spec, and the tree's iommu_groups where the
	// driver's host root has the kernel's.
	mark = time.Now()
	served := p.mounts(p.writable, p.view)
	devices, stop := p.start(t, "served", served)
	p.lap(mark, "plugin published (as served)")
	check(steps[0], func(t *testing.T) {
		require.Error(t, exitErr, "the plugin served the node's own iommu_groups must exit at its start:\n%s", control)
		require.Contains(t, control, "IOMMU is not enabled in the kernel", "the driver's reason for exiting")
		slices, err := p.list("resourceslices.json")
		require.NoError(t, err, "resourceslices.json")
		kubetest.WriteObject(t, p.objects, "resourceslices.json", slices)
		p.detail[stepPublish] = p.judgePublished(t, devices) + "; control (the node's own iommu_groups): the driver exits: " + lastLine(control, "IOMMU")
	})
	var bdf, group, spec string
	mark = time.Now()
	check(steps[1], func(t *testing.T) {
		require.DirExists(t, p.viewPath(vfioModule), "the writable view's module view (a writable tree lists vfio-pci)")
		require.NoDirExists(t, filepath.Join(p.readOnly, vfioModule), "the read-only tree's module view (it lists no vfio-pci)")
		prepared, msg := p.claimAndPod(t, "served")
		require.True(t, prepared, "the claim must be prepared; the driver: %s", msg)
		bdf, group, spec = p.judgePrepared(t, "served")
		require.False(t, roPrepared, "the read-only tree prepared a claim")
		require.Contains(t, roMsg, `failed to load module "vfio_pci"`, "the driver's message on the read-only tree")
		p.detail[stepPrepare] += "; control (the read-only tree's spec, no vfio_pci in its module view): " + roMsg
	})
	p.lap(mark, "prepare")
	mark = time.Now()
	// The pod and the unprepare read the claim the step before prepared:
	// where it was not, that step failed, and these fail with it (a row
	// that cannot be judged for a failure upstream is red, never not run).
	check(steps[2], func(t *testing.T) {
		if group == "" {
			t.Fatal("the claim was not prepared (step " + stepPrepare + " failed)")
		}
		p.detail[stepPod] = p.judgePod(t, "served", group)
	})
	p.lap(mark, "the pod's /dev/vfio")
	mark = time.Now()
	check(steps[3], func(t *testing.T) {
		if group == "" {
			t.Fatal("the claim was not prepared (step " + stepPrepare + " failed)")
		}
		stop = p.judgeUnprepare(t, "served", bdf, spec, served, stop)
	})
	p.releaseClaim(t, "served")
	p.unpublish(t, stop)
	p.lap(mark, "unprepare and clean-up")
}

// writeMatrix writes the suite's matrix, each step no subtest reached
// red, and appends it to make's.
func (p *passthrough) writeMatrix(t *testing.T, steps [][3]string, began time.Time) {
	var unreached [][]string
	for _, row := range steps {
		unreached = append(unreached, row[:])
	}
	p.rows.Unreached("the suite stopped before this step (its log says where)", unreached...)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "VFIO passthrough through serve --writable (gpu-kubelet-plugin, PassthroughSupport; profile %s, %d GPUs; Kubernetes %s):\n\n", filepath.Base(passthroughProfile), len(p.gpus), programs.KubeVersion)
	buf.WriteString(p.rows.Table("step", "served", "result"))
	buf.WriteString("\n")
	for _, row := range steps {
		fmt.Fprintf(&buf, "  %-27s %s\n", row[0]+":", cmp.Or(p.detail[row[0]], "-"))
	}
	fmt.Fprintf(&buf, "\n  timings: %s; %s in all\n", strings.Join(p.took, "; "), time.Since(began).Round(time.Second))
	kubetest.AppendMatrix(t, buf.String())
}

// notRunPassthrough reports every row as not run, its program missing.
func notRunPassthrough(t *testing.T, missing, why string) {
	var rows docmatrix.Rows
	for _, row := range passthroughSteps() {
		t.Run(row[0], func(t *testing.T) {
			rows.Expect(t, row[0], row[1], row[2])
			rows.NotRun(t, programs.NotRun(t.Name(), missing)+why)
		})
	}
	kubetest.AppendMatrix(t, "VFIO passthrough through serve --writable (gpu-kubelet-plugin, PassthroughSupport):\n\n"+rows.Table("step", "served", "result"))
}

// lap notes how long a phase took since mark.
func (p *passthrough) lap(mark time.Time, what string) {
	p.took = append(p.took, fmt.Sprintf("%s %s", what, time.Since(mark).Round(100*time.Millisecond)))
}

// setup makes the profile servable, the driver root and its libraries,
// and the read-only render.
func (p *passthrough) setup(t *testing.T, dir, mockNVML string) {
	t.Helper()
	src := filepath.Join(overlaytest.Repo(t), passthroughProfile)
	data, err := os.ReadFile(src)
	require.NoError(t, err, "profile %s", src)
	p.file, err = programs.ServableProfile(dir, "sriov", src, data)
	require.NoError(t, err)
	facts, err := profilefacts.Read(p.file)
	require.NoError(t, err, "profile %s", p.file)
	p.gpus = facts.NVIDIABound()
	// The driver binds GPUs that NVML lists; a GPU already on vfio-pci
	// would leave it nothing to bind.
	require.Len(t, p.gpus, len(facts.GPUs), "%s: every GPU on nvidia", passthroughProfile)
	nvml, err := programs.NVMLProfile(dir, "sriov", p.file)
	require.NoError(t, err)
	require.Equal(t, p.file, nvml, "NVML serves the whole profile")

	p.driverRoot = filepath.Join(dir, "driver-root")
	require.NoError(t, programs.WriteDriverRoot(p.driverRoot, mockNVML), "the driver root %s", p.driverRoot)
	require.NoError(t, programs.WriteDeviceNodes(p.driverRoot, len(p.gpus)))
	p.hook = filepath.Join(dir, "nvidia-cdi-hook")
	require.NoError(t, os.WriteFile(p.hook, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	p.driverLibraries(t, p.file)

	p.readOnly = filepath.Join(dir, "read-only")
	_, _, err = overlay.Render(overlay.Options{Profile: p.file, Root: p.readOnly})
	require.NoError(t, err, "render %s read-only", p.file)
}

// serveWritable runs serve --writable on the node, in its mount namespace,
// as the chart's writable mode runs it in its pod: the FUSE view is then
// where the plugin's mounts are made, and never on the host. It returns
// once the spec is written, which serve does once the view is mounted.
func (p *passthrough) serveWritable(t *testing.T, dir string) {
	t.Helper()
	p.view = filepath.Join(dir, "view")
	specFile := filepath.Join(dir, "writable.yaml")
	proc := p.c.Start(t, kubetest.Program{Name: "serve-writable", Args: []string{p.bin, "serve",
		"--writable", "--writable-tree", filepath.Join(dir, "tree"), "--profile", p.file, "--root", p.view,
		"--output", specFile, "--listen", "127.0.0.1:0", "--no-watch"}})
	p.c.Wait(t, "serve --writable's spec, written once its view is mounted", slicesTimeout, func() error {
		select {
		case <-proc.Exited():
			t.Fatalf("serve --writable exited:\n%s", proc.LogTail())
		default:
		}
		_, err := os.Stat(specFile)
		return err
	})
	spec, err := cdispec.ReadSpec(specFile)
	require.NoError(t, err, "%s", specFile)
	require.Len(t, spec.Devices, 1, "%s: devices", specFile)
	p.writable = spec.Devices[0].ContainerEdits.Mounts
}

// nodeLayer puts an in-memory layer over the node's dir, in its mount
// namespace (containerd's), with the node's mounts directly below dir
// bound back over the layer, then runs more there: what a real node has
// in dir and this host lacks (its /dev/vfio, its /lib/modules) is made in
// the layer, and never in the host's dir, where it would outlive the test.
func nodeLayer(t *testing.T, h *containerdtest.Harness, dir string, more ...string) {
	t.Helper()
	script := strings.Join(append([]string{
		"set -eu",
		`dir="$1"`,
		`d="` + nodeLayers + `$dir"`,
		`mkdir -p "$d"`,
		`mount -t tmpfs -o mode=0755 tmpfs "$d"`,
		`mkdir "$d/lower" "$d/upper" "$d/work"`,
		`subs=$(awk -v dir="$dir" 'index($5, dir "/") == 1 && substr($5, length(dir) + 2) !~ "/" {print $5}' /proc/self/mountinfo)`,
		`mount --rbind "$dir" "$d/lower"`,
		`mount -t overlay overlay -o "lowerdir=$dir,upperdir=$d/upper,workdir=$d/work" "$dir"`,
		`for m in $subs; do mount --rbind "$d/lower${m#"$dir"}" "$m"; done`,
	}, more...), "\n")
	out, err := h.NodeCommand("sh", "-c", script, "sh", dir).CombinedOutput()
	require.NoError(t, err, "the node's layer over %s: %s", dir, out)
}

// nodeVFIODir gives the node a /dev/vfio, as a node whose vfio is loaded
// has.
func nodeVFIODir(t *testing.T, h *containerdtest.Harness) {
	t.Helper()
	nodeLayer(t, h, "/dev", "mkdir -m 0755 /dev/vfio")
}

// nodeModules gives the node a /lib/modules/<release> of its own, as a
// node whose kernel has modules has: the driver's chart mounts the node's
// /lib/modules (a hostPath of type Directory), and its modules.alias names
// vfio_pci by the line a real kernel's has (the driver publishes no VFIO
// device without it; the writable spec's stand-in is mounted over it). It
// holds no module, whatever the host has: the controls' chroot modprobe
// then fails on any host, and never loads a module into the host's kernel.
func nodeModules(t *testing.T, h *containerdtest.Harness) {
	t.Helper()
	lib, err := filepath.EvalSymlinks("/lib")
	require.NoError(t, err)
	nodeLayer(t, h, lib, `r=$(uname -r)`, `mkdir -p /lib/modules`, `mount -t tmpfs -o mode=0755 tmpfs /lib/modules`,
		`mkdir "/lib/modules/$r"`, `printf '%s\n' '`+plan.VFIOPCIAlias+`' > "/lib/modules/$r/modules.alias"`)
}

// bindRO is a read-only bind mount, as a CDI spec gives one.
func bindRO(src, dst string) *specs.Mount {
	return &specs.Mount{HostPath: src, ContainerPath: dst, Options: []string{"ro", "nosuid", "nodev", "bind"}}
}

// mounts is what the plugin is served: a spec's mounts, and the tree's
// iommu_groups where the driver's host root (/) has the kernel's.
func (p *passthrough) mounts(spec []*specs.Mount, tree string) []*specs.Mount {
	return append(slices.Clone(spec), bindRO(filepath.Join(tree, "sys/kernel/iommu_groups"), "/sys/kernel/iommu_groups"))
}

// readOnlyMounts is the default mode's spec of the read-only render, with
// the writable spec's modules.alias stand-in, which the driver reads at
// its start.
func (p *passthrough) readOnlyMounts() ([]*specs.Mount, error) {
	return p.specMounts(p.readOnly)
}

// specMounts is the default mode's spec of the render at root, with the
// writable spec's modules.alias stand-in.
func (p *passthrough) specMounts(root string) ([]*specs.Mount, error) {
	ms, err := cdispec.Mounts(root, "", nil)
	if err != nil {
		return nil, err
	}
	spec, err := cdispec.NewSpec(cdispec.DefaultKind, ms, nil)
	if err != nil {
		return nil, err
	}
	out := spec.Devices[0].ContainerEdits.Mounts
	out = append(out, p.modulesAlias()...)
	return out, nil
}

// modulesAlias is the writable spec's modules.alias stand-in, which the
// driver reads at its start.
func (p *passthrough) modulesAlias() []*specs.Mount {
	var out []*specs.Mount
	for _, m := range p.writable {
		if filepath.Base(m.ContainerPath) == "modules.alias" {
			out = append(out, m)
		}
	}
	return out
}

// sabotaged is what a sabotaged run serves the plugin in place of the
// writable view's mounts: the read-only render's links plainly escaped
// (escaped), or empty read-only directories at the links directory and
// the overlay (no tree). Never nothing: the plugin binds GPUs by writes,
// which would then reach the node's own /sys.
func (p *passthrough) sabotaged(t *testing.T, sabotage string) []*specs.Mount {
	t.Helper()
	if sabotage == programs.SabotageEscaped {
		mounts, err := p.specMounts(hosttest.PlainLinksCopy(t, p.readOnly))
		require.NoError(t, err, "the escaped tree's mounts")
		return mounts
	}
	empty := t.TempDir()
	out := []*specs.Mount{bindRO(empty, "/sys/bus/pci/devices"), bindRO(empty, plan.DefaultContainerRoot)}
	out = append(out, p.modulesAlias()...)
	return out
}

// args is the plugin's command line: the dra suite's, with the
// PassthroughSupport gate and the node's root as the driver's host root,
// which the plugin's mount namespace shares (the driver's chart mounts the
// node's / there).
func (p *passthrough) args() []string {
	kubelet := p.c.KubeletRootDir
	return []string{p.plugin, "-v", "4",
		"--node-name", kubetest.NodeName, "--namespace", namespace,
		"--image-name", "nvml-mock-sysfs-test", "--kubeconfig", p.c.Kubeconfig,
		"--nvidia-driver-root", p.driverRoot, "--container-driver-root", p.driverRoot,
		"--nvidia-cdi-hook-path", p.hook, "--cdi-root", p.c.Runtime.CDIDir,
		"--kubelet-registrar-directory-path", filepath.Join(kubelet, "plugins_registry"),
		"--kubelet-plugins-directory-path", filepath.Join(kubelet, "plugins"),
		"--feature-gates", "PassthroughSupport=true", "--host-root", "/"}
}

// env is the plugin's environment: the mock NVML, reading the profile.
func (p *passthrough) env() []string {
	return []string{"MOCK_NVML_CONFIG=" + p.file, "LD_LIBRARY_PATH=" + filepath.Join(p.driverRoot, "usr/lib64")}
}

// exitsAtStart runs the plugin served mounts until it exits, which it must
// within controlTimeout, and returns what it printed and its exit.
func (p *passthrough) exitsAtStart(t *testing.T, mounts []*specs.Mount) (string, error) {
	t.Helper()
	served := hosttest.Served{Spec: mounts}
	cmd := served.Command(p.args()[0], p.args()[1:]...)
	out, err := p.c.Run(p.env(), "timeout", append([]string{fmt.Sprint(int(controlTimeout.Seconds()))}, cmd.Args...)...)
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 124 {
		t.Errorf("the plugin was still running after %s: the control did not fail", controlTimeout)
	}
	require.NoError(t, os.RemoveAll(filepath.Join(p.c.KubeletRootDir, "plugins", driverName)))
	return out, err
}

// start runs the plugin served mounts and waits until its slices hold a
// gpu and a vfio device per GPU and the kubelet registered it; it returns
// the devices and what stops it.
func (p *passthrough) start(t *testing.T, what string, mounts []*specs.Mount) ([]resourcev1.Device, func()) {
	t.Helper()
	proc := p.c.Start(t, kubetest.Program{Name: "gpu-kubelet-plugin-" + what, Args: p.args(), Env: p.env(), Served: &hosttest.Served{Spec: mounts}})
	devices := p.waitPublished(t, proc, fmt.Sprintf("ResourceSlices with a gpu and a vfio device per GPU (plugin served %s)", what), func(devices []resourcev1.Device) error {
		types := map[string]int{}
		for _, d := range devices {
			kind, _ := kubetest.StringAttribute(d, "type")
			types[kind]++
		}
		if types["gpu"] != len(p.gpus) || types["vfio"] != len(p.gpus) {
			return fmt.Errorf("devices by type %v, want %d gpu and %d vfio", types, len(p.gpus), len(p.gpus))
		}
		return nil
	})
	return devices, func() { proc.Stop(t) }
}

// judgePublished requires a vfio device per GPU, each at its GPU's
// address with its root complex as pcieRoot, and says what it saw.
func (p *passthrough) judgePublished(t *testing.T, devices []resourcev1.Device) string {
	t.Helper()
	byAddress := map[string]profilefacts.GPU{}
	for _, g := range p.gpus {
		byAddress[g.BusID] = g
	}
	var seen []string
	for _, d := range devices {
		if kind, _ := kubetest.StringAttribute(d, "type"); kind != "vfio" {
			continue
		}
		bdf, ok := kubetest.StringAttribute(d, pciBusIDAttribute)
		require.True(t, ok, "vfio device %s has no %s", d.Name, pciBusIDAttribute)
		g, ok := byAddress[strings.ToLower(bdf)]
		require.True(t, ok, "vfio device %s at %s is no GPU of the profile, or a second device of one", d.Name, bdf)
		delete(byAddress, g.BusID)
		root, ok := kubetest.StringAttribute(d, programs.PCIeRootAttribute)
		require.True(t, ok, "vfio device %s (%s) has no pcieRoot", d.Name, bdf)
		require.NotEmpty(t, g.Root, "%s: GPU %s: the suite's profile places every GPU (pcie_topology)", passthroughProfile, g.BusID)
		require.Equal(t, g.Root, root, "vfio device %s (%s): pcieRoot", d.Name, bdf)
		seen = append(seen, fmt.Sprintf("%s %s %s", d.Name, bdf, root))
	}
	require.Empty(t, byAddress, "GPUs with no vfio device")
	slices.Sort(seen)
	return strings.Join(seen, ", ")
}

// claimAndPod creates a claim for one VFIO device and a pod that holds
// it, both named name, and waits until the driver has prepared it (its
// CDI spec of the claim is written) or the kubelet reports its failed
// NodePrepareResources; it returns which, and the driver's message.
func (p *passthrough) claimAndPod(t *testing.T, name string) (bool, string) {
	t.Helper()
	_, err := p.c.Client.ResourceV1().ResourceClaims(namespace).Create(context.Background(), &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: vfioClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			}}},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "create claim %s", name)
	p.holdPod(t, name, name)
	var prepared bool
	var msg string
	p.c.Wait(t, "claim "+name+" prepared, or the kubelet's FailedPrepareDynamicResources", podTimeout, func() error {
		if spec, err := p.claimSpec(name); err == nil {
			if _, err := os.Stat(spec); err == nil {
				prepared = true
				return nil
			}
		}
		events, err := p.c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Reason == "FailedPrepareDynamicResources" {
				msg = e.Message
				// The kubelet's words around the driver's: the driver's own
				// message follows the claim's name.
				if _, own, ok := strings.Cut(msg, "NodePrepareResources failed for ResourceClaim "+name+": "); ok {
					msg = own
				}
				return nil
			}
		}
		pod, err := p.c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return fmt.Errorf("pod %s: phase %s, %s", name, pod.Status.Phase, cmp.Or(kubetest.Unschedulable(pod), "scheduled"))
	})
	return prepared, msg
}

// claimSpec is the path of the CDI spec the driver writes for the claim
// name once it is prepared.
func (p *passthrough) claimSpec(name string) (string, error) {
	c, err := p.c.Client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return filepath.Join(p.cdiDir, claimSpecPrefix+string(c.UID)+".yaml"), nil
}

// viewPath is a path of serve --writable's view as the node's mount
// namespace (and every plugin's, made from it) sees it.
func (p *passthrough) viewPath(path string) string {
	return p.c.Nodes[0].ProcPath(filepath.Join(p.view, path))
}

// driverOf is the driver the view binds the GPU at bdf to ("" unbound).
func (p *passthrough) driverOf(bdf string) (string, error) {
	link, err := os.Readlink(p.viewPath("sys/bus/pci/devices/" + bdf + "/driver"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return filepath.Base(link), err
}

// judgePrepared requires that the claim's one device is a GPU's VFIO
// device, that the view binds that GPU to vfio-pci with its vfio-dev
// entry, and that the claim's CDI spec names /dev/vfio/<its group>; it
// returns the GPU's address, its group and the spec's path.
func (p *passthrough) judgePrepared(t *testing.T, name string) (bdf, group, spec string) {
	t.Helper()
	c, err := p.c.Client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err, "claim %s", name)
	require.NotNil(t, c.Status.Allocation, "claim %s is allocated", name)
	require.Len(t, c.Status.Allocation.Devices.Results, 1, "claim %s: devices", name)
	device := c.Status.Allocation.Devices.Results[0].Device
	list, err := p.c.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
	require.NoError(t, err)
	// The slices as the plugin republished them: the prepared device's
	// sibling gpu is gone, the device itself may be too.
	for _, d := range devicesOf(list.Items) {
		if d.Name == device {
			bdf, _ = kubetest.StringAttribute(d, pciBusIDAttribute)
		}
	}
	if bdf == "" {
		// The driver derives a VFIO device's name from its GPU's index in
		// go-nvlib's list, the profile's order.
		var index int
		_, err := fmt.Sscanf(device, "gpu-vfio-%d", &index)
		require.NoError(t, err, "claim %s's device %q", name, device)
		require.Less(t, index, len(p.gpus), "claim %s's device %q", name, device)
		bdf = p.gpus[index].BusID
	}
	bdf = strings.ToLower(bdf)
	p.c.Wait(t, bdf+" bound to vfio-pci in the view", vfioTimeout, func() error {
		driver, err := p.driverOf(bdf)
		if err == nil && driver != profilefacts.DriverVFIO {
			err = fmt.Errorf("%s is on %q", bdf, driver)
		}
		return err
	})
	link, err := os.Readlink(p.viewPath("sys/bus/pci/devices/" + bdf + "/iommu_group"))
	require.NoError(t, err, "%s's iommu_group", bdf)
	group = filepath.Base(link)
	vfioDev, err := os.ReadDir(p.viewPath("sys/bus/pci/devices/" + bdf + "/vfio-dev"))
	require.NoError(t, err, "%s's vfio-dev, which the kernel adds at the bind", bdf)
	require.Len(t, vfioDev, 1, "%s's vfio-dev", bdf)

	spec, err = p.claimSpec(name)
	require.NoError(t, err)
	s, err := cdispec.ReadSpec(spec)
	require.NoError(t, err, "the driver's CDI spec of claim %s", name)
	var nodes []string
	for _, d := range s.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
	}
	require.Equal(t, []string{"/dev/vfio/" + group}, nodes, "the device nodes of claim %s's CDI spec", name)
	kubetest.WriteObject(t, p.objects, "claim-"+name+"-cdi-spec.json", s)
	p.detail[stepPrepare] = fmt.Sprintf("%s (%s) unbound from nvidia and bound to vfio-pci through the view (vfio-dev/%s); the claim's CDI spec names /dev/vfio/%s", device, bdf, vfioDev[0].Name(), group)
	return bdf, group, spec
}

// judgePod requires that the claim's pod cannot start its container while
// the node lacks /dev/vfio/<group> (containerd's CDI injection stats it),
// and runs with it once the node has it: the kernel makes it when the
// group's device binds to vfio-pci, and this node stands it in with the
// numbers of /dev/null, as the dra suite's driver root does /dev/nvidiaN.
func (p *passthrough) judgePod(t *testing.T, name, group string) string {
	t.Helper()
	node := "/dev/vfio/" + group
	var refused string
	pod := p.c.WaitPod(t, namespace, name, podTimeout, func(pod *corev1.Pod) bool {
		for _, c := range pod.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
				refused = w.Message
			}
		}
		return refused != "" || pod.Status.Phase == corev1.PodRunning
	})
	require.NotEqual(t, corev1.PodRunning, pod.Status.Phase, "pod %s runs although the node has no %s", name, node)
	require.Contains(t, refused, node, "containerd's refusal names the device node")

	out, err := p.c.Runtime.NodeCommand("mknod", "-m", "0666", node, "c", "1", "3").CombinedOutput()
	require.NoError(t, err, "the node's %s: %s", node, out)
	p.c.WaitPod(t, namespace, name, vfioTimeout, func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodRunning })

	id := strings.TrimSpace(p.c.Runtime.Crictl(t, "ps", "--quiet", "--label", "io.kubernetes.pod.name="+name, "--label", "io.kubernetes.container.name=hold"))
	require.NotEmpty(t, id, "pod %s's CRI container", name)
	var inspect struct {
		Info struct {
			Pid         int `json:"pid"`
			RuntimeSpec struct {
				Linux struct {
					Devices []struct {
						Path  string `json:"path"`
						Type  string `json:"type"`
						Major int64  `json:"major"`
						Minor int64  `json:"minor"`
					} `json:"devices"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(p.c.Runtime.Crictl(t, "inspect", strings.Fields(id)[0])), &inspect))
	var devices []string
	for _, d := range inspect.Info.RuntimeSpec.Linux.Devices {
		devices = append(devices, fmt.Sprintf("%s %s %d:%d", d.Path, d.Type, d.Major, d.Minor))
	}
	require.Contains(t, devices, node+" c 1:3", "pod %s's container's devices", name)
	// From inside: the container's own /dev, through its process.
	inside, err := p.c.Run(nil, "stat", "-c", "%F %t:%T", fmt.Sprintf("/proc/%d/root%s", inspect.Info.Pid, node))
	require.NoError(t, err, "%s in pod %s's container: %s", node, name, inside)
	require.Equal(t, "character special file 1:3", strings.TrimSpace(inside), "%s in pod %s's container", node, name)
	return fmt.Sprintf("the container has %s (%s); control (no %s on the node): containerd: %s", node, strings.TrimSpace(inside), node, cell(refused))
}

// judgeUnprepare deletes the claim's pod with the plugin stopped (the
// control: the kubelet cannot unprepare, the GPU stays on vfio-pci), then
// starts the plugin again on the same state and requires that the kubelet's
// retry unprepares the claim: the GPU back on nvidia, the claim's CDI spec
// removed. It returns what stops the plugin it started.
func (p *passthrough) judgeUnprepare(t *testing.T, name, bdf, spec string, mounts []*specs.Mount, stop func()) func() {
	t.Helper()
	stop()
	p.waitRegistered(t, nil, 0)
	logged := len(p.c.Kubelet.Log())
	p.deletePod(t, name)
	unregistered := "DRA driver " + driverName + " is not registered"
	p.c.Wait(t, "the kubelet's unprepare of claim "+name+" failing, the plugin stopped", vfioTimeout, func() error {
		for _, line := range strings.Split(p.c.Kubelet.Log()[logged:], "\n") {
			if strings.Contains(line, unregistered) && strings.Contains(line, `pod="`+namespace+"/"+name+`"`) {
				return nil
			}
		}
		return fmt.Errorf("the kubelet's log has no %q for pod %s since its deletion", unregistered, name)
	})
	driver, err := p.driverOf(bdf)
	require.NoError(t, err)
	require.Equal(t, profilefacts.DriverVFIO, driver, "%s with the plugin stopped", bdf)
	require.FileExists(t, spec, "claim %s's CDI spec with the plugin stopped", name)
	// The kubelet keeps the pod until it has unprepared its claim.
	_, err = p.c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err, "pod %s, terminating, with the plugin stopped", name)

	proc := p.c.Start(t, kubetest.Program{Name: "gpu-kubelet-plugin-restarted", Args: p.args(), Env: p.env(), Served: &hosttest.Served{Spec: mounts}})
	p.waitRegistered(t, proc, 1)
	p.c.Wait(t, "claim "+name+" unprepared: "+bdf+" on nvidia, its CDI spec removed, the pod gone", vfioTimeout, func() error {
		select {
		case <-proc.Exited():
			t.Fatalf("the kubelet plugin exited:\n%s", proc.LogTail())
		default:
		}
		driver, err := p.driverOf(bdf)
		switch {
		case err != nil:
			return err
		case driver != profilefacts.DriverNVIDIA:
			return fmt.Errorf("%s is on %q", bdf, driver)
		}
		if _, err := os.Stat(spec); err == nil {
			return fmt.Errorf("%s is still there", spec)
		}
		if _, err := p.c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return cmp.Or(err, fmt.Errorf("pod %s is still there", name))
		}
		return nil
	})
	_, err = os.Stat(p.viewPath("sys/bus/pci/devices/" + bdf + "/vfio-dev"))
	require.ErrorIs(t, err, os.ErrNotExist, "%s's vfio-dev once back on nvidia", bdf)
	p.detail[stepUnprepare] = fmt.Sprintf("%s back on nvidia, vfio-dev gone, the claim's CDI spec removed; control (the plugin stopped): the kubelet: %q, %s stays on vfio-pci and the pod terminating", bdf, unregistered, bdf)
	return func() { proc.Stop(t) }
}

// releaseClaim deletes the pod and the claim name, if there, and waits
// until they are gone: the pod gracefully, so that it is gone only once the
// kubelet has unprepared its claim (the kubelet unprepares before it lets
// the API server delete the pod), and the next plugin gets no call for it.
func (p *passthrough) releaseClaim(t *testing.T, name string) {
	t.Helper()
	p.deletePod(t, name)
	p.c.Wait(t, "pod "+name+" deleted, its claim unprepared", vfioTimeout, func() error {
		_, err := p.c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return cmp.Or(err, fmt.Errorf("pod %s is still there", name))
	})
	p.remove(t, nil, []string{name})
}

// deletePod deletes the pod name, if there, with a grace period: one of
// zero deletes the object at once, before the kubelet has unprepared.
func (p *passthrough) deletePod(t *testing.T, name string) {
	t.Helper()
	err := p.c.Client.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete pod %s: %v", name, err)
	}
}

// lastLine is the last line of out that holds substr, trimmed, or "".
func lastLine(out, substr string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// cell is text fit for a Markdown table cell: one line, no bar.
func cell(s string) string {
	return strings.NewReplacer("\n", " ", "|", "/").Replace(strings.TrimSpace(s))
}
