package nriplugin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// runtime is NRI's own runtime side (the library containerd embeds) on a
// private socket, with the pods and containers it reports at a plugin's
// registration.
type runtime struct {
	nri    *adaptation.Adaptation
	socket string

	mu         sync.Mutex
	pods       []*api.PodSandbox
	containers []*api.Container
}

func startRuntime(t *testing.T, socket string, pods []*api.PodSandbox, containers []*api.Container) *runtime {
	t.Helper()
	r := &runtime{socket: socket, pods: pods, containers: containers}
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, err := cb(ctx, r.pods, r.containers)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	dir := t.TempDir()
	var err error
	r.nri, err = adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	require.NoError(t, err)
	require.NoError(t, r.nri.Start())
	t.Cleanup(r.nri.Stop)
	return r
}

// create asks the plugins to adjust a container being created.
func (r *runtime) create(t *testing.T, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	t.Helper()
	ctr.PodSandboxId = pod.Id
	// As containerd does: a registration in progress ends before the
	// creation, and none starts during it. The plugin counts itself
	// registered in its Synchronize, before the runtime adds it to the
	// plugins it calls; without the block, a creation in that window
	// (seen under a load of 20 on two cores) reaches no plugin at all.
	block := r.nri.BlockPluginSync()
	defer block.Unblock()
	rpl, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	return rpl.GetAdjust(), nil
}

// tree is the edits source of a test: complete, or not with err.
type tree struct {
	mu    sync.Mutex
	err   error
	edits specs.ContainerEdits
}

func (tr *tree) Edits() (specs.ContainerEdits, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.edits, tr.err
}

func (tr *tree) set(err error) {
	tr.mu.Lock()
	tr.err = err
	tr.mu.Unlock()
}

// served is the edits of a node's serve: the default mounts and a machine.
func served(t *testing.T) *tree {
	mounts, err := cdispec.Mounts("/var/lib/nvml-mock-sysfs", "/opt/nvml-mock-sysfs", nil)
	require.NoError(t, err)
	return &tree{edits: cdispec.DeviceEdits(mounts, []string{cdispec.MachineTypeFileEnv + "=/opt/nvml-mock-sysfs/product_name"})}
}

// startPlugin runs a plugin until the test ends, and waits for it to
// register with the runtime at socket.
func startPlugin(t *testing.T, socket string, tr *tree, policy Policy) *Plugin {
	t.Helper()
	return runPlugin(t, Options{Socket: socket, Policy: policy, Edits: tr.Edits})
}

// runPlugin runs a plugin of o, quick to retry and quiet, until the test
// ends, and waits for it to register.
func runPlugin(t *testing.T, o Options) *Plugin {
	t.Helper()
	o.Retry, o.Logger = 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitRegistered(t, p, 1)
	return p
}

func waitRegistered(t *testing.T, p *Plugin, n int) {
	t.Helper()
	require.Eventually(t, func() bool { c := p.Counts(); return c.Registered && c.Registrations >= n },
		10*time.Second, 10*time.Millisecond, "the plugin registered %d times", n)
}

func socket(t *testing.T) string { return filepath.Join(t.TempDir(), "nri.sock") }

// TestServesTheDeviceEdits: a served container gets the CDI device's
// mounts and variables, literally, and nothing else.
func TestServesTheDeviceEdits(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	p := startPlugin(t, sock, served(t), Policy{})
	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "c1", Name: "gfd"})
	require.NoError(t, err)
	opts := []string{"ro", "nosuid", "nodev", "bind"}
	require.Equal(t, []*api.Mount{
		{Destination: "/opt/nvml-mock-sysfs", Source: "/var/lib/nvml-mock-sysfs", Options: opts},
		{Destination: "/sys/bus/pci/devices", Source: "/var/lib/nvml-mock-sysfs/sys/bus/pci/devices", Options: opts},
		{Destination: "/sys/module", Source: "/var/lib/nvml-mock-sysfs/sys/module", Options: opts},
		{Destination: "/opt/nvml-mock-sysfs/host-sys/module", Source: "/sys/module", Options: opts},
	}, adjust.GetMounts())
	require.Equal(t, []*api.KeyValue{
		{Key: "NVML_MOCK_SYSFS", Value: "mounted"},
		{Key: "GFD_MACHINE_TYPE_FILE", Value: "/opt/nvml-mock-sysfs/product_name"},
	}, adjust.GetEnv())
	require.Equal(t, 1, p.Counts().Served)

	adjust, err = r.create(t, pod("kube-system", nil, nil), &api.Container{Id: "c2", Name: "coredns"})
	require.NoError(t, err)
	require.Empty(t, adjust.GetMounts(), "kube-system is not served")
}

// TestWritableOnlyToWriters: with serve --writable's edits beside the
// read-only tree's, a container served node-wide gets the read-only
// tree, and only a named writer or one that asks for writes gets the
// writable view; the counts say how many got it.
func TestWritableOnlyToWriters(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	ro := served(t)
	wm, err := cdispec.WritableMounts("/var/lib/nvml-mock-sysfs", "/opt/nvml-mock-sysfs", nil, "/sys", "6.18.0")
	require.NoError(t, err)
	rw := &tree{edits: cdispec.DeviceEdits(wm, nil)}
	writer, err := ParseWriter("dra:component=kubelet-plugin")
	require.NoError(t, err)
	p := runPlugin(t, Options{Socket: sock, Policy: Policy{Writers: []Writer{writer}}, Edits: ro.Edits, WritableEdits: rw.Edits})

	destinations := func(adjust *api.ContainerAdjustment) map[string]bool {
		out := map[string]bool{}
		for _, m := range adjust.GetMounts() {
			out[m.GetDestination()] = slices.Contains(m.GetOptions(), "ro")
		}
		return out
	}
	readOnly := map[string]bool{"/opt/nvml-mock-sysfs": true, "/sys/bus/pci/devices": true, "/sys/module": true, "/opt/nvml-mock-sysfs/host-sys/module": true}
	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "node-wide", Name: "c"})
	require.NoError(t, err)
	require.Equal(t, readOnly, destinations(adjust), "served node-wide: the read-only tree")
	adjust, err = r.create(t, pod("dra", map[string]string{"component": "kubelet-plugin"}, nil), &api.Container{Id: "writer", Name: "plugin"})
	require.NoError(t, err)
	require.Len(t, adjust.GetMounts(), len(wm), "a named writer: the writable view")
	require.False(t, destinations(adjust)["/opt/nvml-mock-sysfs"], "the writer's container root is writable")
	require.False(t, destinations(adjust)["/sys/bus/pci/drivers"], "the writer's drivers directory is writable")
	adjust, err = r.create(t, pod("default", nil, map[string]string{WritableAnnotation: "true"}), &api.Container{Id: "asked", Name: "c"})
	require.NoError(t, err)
	require.Len(t, adjust.GetMounts(), len(wm), "asked for writes: the writable view")
	c := p.Counts()
	require.Equal(t, 3, c.Served)
	require.Equal(t, 2, c.ServedWritable)
}

// TestOnTopOfTheHostSys: GFD's own chart mounts the node's /sys at /sys;
// applied by NRI's generator, as containerd applies an adjustment, our
// links directory comes after it, so it is what the container sees.
func TestOnTopOfTheHostSys(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	startPlugin(t, sock, served(t), Policy{})
	hostSys := &api.Mount{Destination: "/sys", Source: "/sys", Type: "bind", Options: []string{"rbind", "rprivate", "rw"}}
	adjust, err := r.create(t, pod("gpu-operator", nil, nil), &api.Container{Id: "c1", Name: "gfd", Mounts: []*api.Mount{hostSys}})
	require.NoError(t, err)
	require.Len(t, adjust.GetMounts(), 4, "the node's sysfs is no other mock's view")

	g := &ociMounts{spec: &rspec.Spec{Mounts: []rspec.Mount{{Destination: "/sys", Source: "/sys", Type: "bind", Options: hostSys.Options}}}}
	require.NoError(t, generate.SpecGenerator(g).AdjustMounts(adjust.GetMounts()))
	var order []string
	for _, m := range g.spec.Mounts {
		order = append(order, m.Destination)
	}
	require.Equal(t, []string{"/sys", "/opt/nvml-mock-sysfs", "/sys/module", "/opt/nvml-mock-sysfs/host-sys/module", "/sys/bus/pci/devices"}, order, "sorted by depth: the container root before the node's modules mounted inside it")
}

// ociMounts is the part of an OCI spec generator NRI's AdjustMounts uses:
// the mounts. Any other call panics, as the embedded nil interface has none.
type ociMounts struct {
	generate.UnderlyingGenerator
	spec *rspec.Spec
}

func (g *ociMounts) Spec() *rspec.Spec      { return g.spec }
func (g *ociMounts) Mounts() []rspec.Mount  { return g.spec.Mounts }
func (g *ociMounts) ClearMounts()           { g.spec.Mounts = nil }
func (g *ociMounts) AddMount(m rspec.Mount) { g.spec.Mounts = append(g.spec.Mounts, m) }
func (g *ociMounts) RemoveMount(dest string) {
	g.spec.Mounts = slices.DeleteFunc(g.spec.Mounts, func(m rspec.Mount) bool { return m.Destination == dest })
}

// TestSharedOverlay: a plugin before ours that mounted our overlay where
// we would (nvml-mock's, configured to share it) keeps it; we add the rest,
// as NRI refuses two plugins' mounts at one destination.
func TestSharedOverlay(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	startPlugin(t, sock, served(t), Policy{})
	theirs := &api.Mount{Destination: "/opt/nvml-mock-sysfs", Source: "/var/lib/nvml-mock-sysfs", Type: "bind", Options: []string{"rbind", "ro"}}
	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "c1", Name: "c", Mounts: []*api.Mount{theirs}})
	require.NoError(t, err)
	require.Len(t, adjust.GetMounts(), 3, "all but the container root")
	require.Equal(t, "/sys/bus/pci/devices", adjust.GetMounts()[0].GetDestination())
}

// TestAnotherMocksView: a container that already mounts a view that is not
// the node's sysfs at /sys/devices or /sys/bus/pci/devices is left alone.
func TestAnotherMocksView(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	p := startPlugin(t, sock, served(t), Policy{})
	for i, m := range []*api.Mount{
		{Destination: "/sys/devices", Source: "/var/lib/nvml-mock/sys/devices", Type: "bind", Options: []string{"rbind", "ro"}},
		{Destination: "/sys/bus/pci/devices", Source: "/var/lib/other/links", Type: "bind", Options: []string{"rbind", "ro"}},
	} {
		adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: string(rune('a' + i)), Name: "c", Mounts: []*api.Mount{m}})
		require.NoError(t, err)
		require.Empty(t, adjust.GetMounts(), m.Destination)
	}
	require.Equal(t, 2, p.Counts().Conflicts)
}

// TestNotComplete: while the tree is not complete, a container that asked
// for it is refused with one line (the kubelet retries it), and one served
// node-wide starts without it, named and counted until it is removed.
func TestNotComplete(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	tr := served(t)
	p := startPlugin(t, sock, tr, Policy{})
	tr.set(errors.New("/var/lib/nvml-mock-sysfs holds no complete render (no completion marker)"))

	asks := pod("default", nil, map[string]string{CDIContainerAnnotation + "c": "- mock.nvidia.com/pcisysfs=all"})
	_, err := r.create(t, asks, &api.Container{Id: "asked", Name: "c"})
	require.ErrorContains(t, err, "nvml-mock-sysfs: pod default/p container c asked for the mock sysfs (asked by cdi-devices.noderesource.dev/container.c), but /var/lib/nvml-mock-sysfs holds no complete render (no completion marker); the kubelet retries")

	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "node-wide", Name: "c"})
	require.NoError(t, err)
	require.Empty(t, adjust.GetMounts())
	c := p.Counts()
	require.Equal(t, 1, c.Refused)
	require.Equal(t, 1, c.Unrendered)
	require.Equal(t, []string{"default/p/c"}, c.Unserved)
	require.NoError(t, r.nri.RemoveContainer(context.Background(), &api.RemoveContainerRequest{Pod: pod("default", nil, nil), Container: &api.Container{Id: "node-wide"}}))
	require.Empty(t, p.Counts().Unserved)

	tr.set(nil)
	adjust, err = r.create(t, asks, &api.Container{Id: "asked", Name: "c"})
	require.NoError(t, err, "the kubelet's retry, once the tree is complete")
	require.Len(t, adjust.GetMounts(), 4)
}

// runtimeChildEnv makes the test binary a runtime process (runtimeChild):
// NRI's runtime side on the socket it names, synchronizing the pods and
// containers of runtimeStateEnv (JSON) until it is killed, as containerd
// is: only the end of the process closes a plugin's connection.
const (
	runtimeChildEnv = "NRIPLUGIN_TEST_RUNTIME"
	runtimeStateEnv = "NRIPLUGIN_TEST_RUNTIME_STATE"
	runtimeDirEnv   = "NRIPLUGIN_TEST_RUNTIME_DIR"
)

type runtimeState struct {
	Pods       []*api.PodSandbox
	Containers []*api.Container
}

func TestMain(m *testing.M) {
	if sock := os.Getenv(runtimeChildEnv); sock != "" {
		os.Exit(runtimeChild(sock))
	}
	os.Exit(m.Run())
}

func runtimeChild(sock string) int {
	var st runtimeState
	if err := json.Unmarshal([]byte(os.Getenv(runtimeStateEnv)), &st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The parent's temporary directory: a killed process removes nothing.
	dir := os.Getenv(runtimeDirEnv)
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, st.Pods, st.Containers)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	r, err := adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(sock),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err == nil {
		err = r.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	select {}
}

// startRuntimeProcess runs runtimeChild and waits for its socket; kill
// ends it as a containerd restart does.
func startRuntimeProcess(t *testing.T, sock string, st runtimeState) (kill func()) {
	t.Helper()
	state, err := json.Marshal(st)
	require.NoError(t, err)
	_ = os.Remove(sock) // a killed runtime leaves its socket
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runtimeChildEnv+"="+sock, runtimeStateEnv+"="+string(state), runtimeDirEnv+"="+t.TempDir())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	kill = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	t.Cleanup(kill)
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the runtime process did not start")
	require.Equal(t, "ready\n", line)
	return kill
}

// TestRuntimeRestarts: when the runtime goes away (killed) and comes back,
// the plugin registers again by itself within a second, and names the
// containers created meanwhile without the tree.
func TestRuntimeRestarts(t *testing.T) {
	sock := socket(t)
	kill := startRuntimeProcess(t, sock, runtimeState{})
	tr := served(t)
	p := startPlugin(t, sock, tr, Policy{})
	kill()
	require.Eventually(t, func() bool { return !p.Counts().Registered }, 10*time.Second, 10*time.Millisecond, "the plugin saw the runtime go")

	mounts := tr.edits.Mounts
	servedCtr := &api.Container{Id: "served", PodSandboxId: "pod-default", Name: "before", State: api.ContainerState_CONTAINER_RUNNING,
		Mounts: []*api.Mount{{Destination: mounts[1].ContainerPath, Source: mounts[1].HostPath}}}
	missed := &api.Container{Id: "missed", PodSandboxId: "pod-default", Name: "meanwhile", State: api.ContainerState_CONTAINER_RUNNING}
	system := &api.Container{Id: "system", PodSandboxId: "pod-kube-system", Name: "proxy", State: api.ContainerState_CONTAINER_RUNNING}
	began := time.Now()
	kill = startRuntimeProcess(t, sock, runtimeState{Pods: []*api.PodSandbox{pod("default", nil, nil), pod("kube-system", nil, nil)},
		Containers: []*api.Container{servedCtr, missed, system}})
	waitRegistered(t, p, 2)
	t.Logf("registered again %s after the runtime came back", time.Since(began).Round(time.Millisecond))
	c := p.Counts()
	require.Equal(t, 1, c.Missed)
	require.Equal(t, []string{"default/p/meanwhile"}, c.Unserved)

	// Removed while the plugin was away again: it runs without the tree no
	// more.
	kill()
	require.Eventually(t, func() bool { return !p.Counts().Registered }, 10*time.Second, 10*time.Millisecond, "the plugin saw the runtime go")
	startRuntimeProcess(t, sock, runtimeState{Pods: []*api.PodSandbox{pod("default", nil, nil)}, Containers: []*api.Container{servedCtr}})
	waitRegistered(t, p, 3)
	require.Empty(t, p.Counts().Unserved)
}

func TestNewRefusesABadIndex(t *testing.T) {
	_, err := New(Options{Index: "9", Edits: (&tree{}).Edits})
	require.EqualError(t, err, `nri plugin index "9": want two digits, as NRI orders plugins`)
}

// TestReadyNamesTheSocket: unregistered, the reason names the socket the
// plugin dials, the default where none is given.
func TestReadyNamesTheSocket(t *testing.T) {
	p, err := New(Options{Edits: (&tree{}).Edits})
	require.NoError(t, err)
	require.EqualError(t, p.Ready(), "NRI plugin not registered with "+DefaultSocket+": not yet")
	sock := socket(t)
	startRuntime(t, sock, nil, nil)
	require.NoError(t, startPlugin(t, sock, served(t), Policy{}).Ready())
}

// hostPath is a pod's hostPath volume as containerd's CRI mounts it.
func hostPath(src, dst string) *api.Mount {
	return &api.Mount{Destination: dst, Source: src, Type: "bind", Options: []string{"rbind", "rprivate", "ro"}}
}

// TestBeneathTheNodesMounts: a served container that mounts the node's /
// (the DRA driver's chart, at /host-root) or /sys (nfd-worker's, at
// /host-sys) gets the module view and the tree's groups beneath it, as
// cdispec.Beneath decides, after that mount; a container not served gets
// nothing.
func TestBeneathTheNodesMounts(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	beneath := cdispec.Beneath{Root: "/var/lib/nvml-mock-sysfs", TreeGroups: true}
	runPlugin(t, Options{Socket: sock, Edits: served(t).Edits, Beneath: func() cdispec.Beneath { return beneath }})
	opts := []string{"ro", "nosuid", "nodev", "bind"}
	added := func(adjust *api.ContainerAdjustment) []*api.Mount { return adjust.GetMounts()[4:] }

	hostRoot := hostPath("/", "/host-root")
	adjust, err := r.create(t, pod("nvidia-dra-driver-gpu", nil, nil), &api.Container{Id: "dra", Name: "plugin", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Equal(t, []*api.Mount{
		{Destination: "/host-root/sys/module", Source: "/var/lib/nvml-mock-sysfs/sys/module", Options: opts},
		{Destination: "/host-root/sys/kernel", Source: "/var/lib/nvml-mock-sysfs/sys/kernel", Options: opts},
	}, added(adjust), "a node without iommu groups: the tree's sys/kernel")
	g := &ociMounts{spec: &rspec.Spec{Mounts: []rspec.Mount{{Destination: hostRoot.Destination, Source: hostRoot.Source, Type: "bind", Options: hostRoot.Options}}}}
	require.NoError(t, generate.SpecGenerator(g).AdjustMounts(adjust.GetMounts()))
	require.Equal(t, "/host-root", g.spec.Mounts[0].Destination, "the node's / first, ours beneath it after")

	beneath.NodeGroups = true
	adjust, err = r.create(t, pod("nvidia-dra-driver-gpu", nil, nil), &api.Container{Id: "dra-groups", Name: "plugin", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Equal(t, "/host-root/sys/kernel/iommu_groups", added(adjust)[1].GetDestination(), "a node with them: the groups alone")

	adjust, err = r.create(t, pod("node-feature-discovery", nil, nil), &api.Container{Id: "nfd", Name: "worker", Mounts: []*api.Mount{hostPath("/sys", "/host-sys")}})
	require.NoError(t, err)
	require.Equal(t, []*api.Mount{
		{Destination: "/host-sys/module", Source: "/var/lib/nvml-mock-sysfs/sys/module", Options: opts},
		{Destination: "/host-sys/kernel/iommu_groups", Source: "/var/lib/nvml-mock-sysfs/sys/kernel/iommu_groups", Options: opts},
	}, added(adjust))

	adjust, err = r.create(t, pod("kube-system", nil, nil), &api.Container{Id: "system", Name: "c", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Empty(t, adjust.GetMounts(), "not served: nothing beneath either")
}

// TestHooksThroughTheEdits: the edits' hooks (cdispec.ProcHook) reach the
// container as NRI's, so the NRI path and the CDI spec carry the same.
func TestHooksThroughTheEdits(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	mounts, err := cdispec.Mounts("/var/lib/nvml-mock-sysfs", "", nil)
	require.NoError(t, err)
	timeout := 5
	hook := cdispec.ProcHook("/var/lib/nvml-mock-sysfs-hook/nvml-mock-sysfs", "/var/lib/nvml-mock-sysfs")
	other := &specs.Hook{HookName: "poststop", Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=1"}, Timeout: &timeout}
	tr := &tree{edits: cdispec.DeviceEdits(mounts, nil, hook, other)}
	startPlugin(t, sock, tr, Policy{})
	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "c1", Name: "gfd"})
	require.NoError(t, err)
	require.Equal(t, []*api.Hook{{Path: hook.Path, Args: hook.Args}}, adjust.GetHooks().GetCreateContainer())
	require.Equal(t, []*api.Hook{{Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=1"}, Timeout: api.Int(5)}}, adjust.GetHooks().GetPoststop())
	require.Empty(t, adjust.GetHooks().GetPrestart())

	adjust, err = r.create(t, pod("kube-system", nil, nil), &api.Container{Id: "c2", Name: "coredns"})
	require.NoError(t, err)
	require.Empty(t, adjust.GetHooks().GetCreateContainer(), "not served: no hook")
}

// TestSharedSysfsMadeSlave: a served container with the node's /sys at
// /sys in shared propagation (the NVIDIA DRA driver's chart with
// PassthroughSupport: Bidirectional) gets it back rslave in the same
// adjustment as our mounts beneath it, so they cannot reach the node's own
// /sys; its Bidirectional /proc, beneath none of ours, and a container not
// served are left as they are.
func TestSharedSysfsMadeSlave(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	startPlugin(t, sock, served(t), Policy{})
	sys := &api.Mount{Destination: "/sys", Source: "/sys", Type: "bind", Options: []string{"rbind", "rshared", "rw"}}
	proc := &api.Mount{Destination: "/proc", Source: "/proc", Type: "bind", Options: []string{"rbind", "rshared", "rw"}}
	ctr := func(id string) *api.Container {
		return &api.Container{Id: id, Name: "gpus", Mounts: []*api.Mount{sys, proc}}
	}
	adjust, err := r.create(t, pod("nvidia-dra-driver-gpu", nil, nil), ctr("dra"))
	require.NoError(t, err)
	var got []*api.Mount
	for _, m := range adjust.GetMounts() {
		if m.GetDestination() == "/sys" || m.GetDestination() == "/proc" {
			got = append(got, m)
		}
		_, removal := m.IsMarkedForRemoval()
		require.False(t, removal, "the runtime gets the re-added mount, not its removal: %v", m)
	}
	require.Equal(t, []*api.Mount{{Destination: "/sys", Source: "/sys", Type: "bind", Options: []string{"rbind", "rslave", "rw"}}}, got)
	require.Len(t, adjust.GetMounts(), 5, "our four and the node's /sys")

	adjust, err = r.create(t, pod("kube-system", nil, nil), ctr("system"))
	require.NoError(t, err)
	require.Empty(t, adjust.GetMounts(), "not served: its mounts as they were")

	// A device plugin's request for our CDI device: the runtime mounts
	// the device's edits, and the plugin makes the shared /sys a slave
	// all the same.
	withDevice := ctr("device")
	withDevice.CDIDevices = []*api.CDIDevice{{Name: (Policy{}).device()}}
	adjust, err = r.create(t, pod("default", nil, nil), withDevice)
	require.NoError(t, err)
	require.Equal(t, []*api.Mount{{Destination: "/sys", Source: "/sys", Type: "bind", Options: []string{"rbind", "rslave", "rw"}}}, adjust.GetMounts())
}

// TestBeneathReadOnlyWhenItCounts: the node's and the tree's facts
// (Options.Beneath, a read of two directories) are read for a served
// container that binds the node's / or /sys, at each such creation, so
// that a re-profile is followed; not for the node's other creations.
func TestBeneathReadOnlyWhenItCounts(t *testing.T) {
	reads := 0
	p, err := New(Options{Edits: served(t).Edits, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Beneath: func() cdispec.Beneath { reads++; return cdispec.Beneath{Root: "/var/lib/nvml-mock-sysfs"} }})
	require.NoError(t, err)
	create := func(mounts ...*api.Mount) {
		_, _, err := p.CreateContainer(context.Background(), pod("default", nil, nil), &api.Container{Id: "c", Name: "c", Mounts: mounts})
		require.NoError(t, err)
	}
	create(hostPath("/var/lib/kubelet/pods/0123/volumes/etc-hosts", "/etc/hosts"))
	create(hostPath("/sys/fs/cgroup", "/host-cgroup"))
	require.Zero(t, reads, "no bind of the node's / or /sys")
	create(hostPath("/", "/host-root"))
	create(hostPath("/sys/", "/host-sys"))
	create(hostPath("/", "/host-root"))
	require.Equal(t, 3, reads, "read at each creation that binds them")
}
