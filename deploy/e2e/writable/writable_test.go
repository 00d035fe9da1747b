// Package writable_test runs the writers against serve --writable: go-nvlib's
// nvpassthrough binds every GPU to vfio-pci and back, and sriov_numvfs
// makes an HCA's virtual functions, in a private mount namespace that has
// the serve's CDI spec's mounts as runc applies them; go-nvlib,
// deviceattribute and ghw read each state. The same writes against the
// read-only tree are the negative control: they must fail.
//
// E2E_SABOTAGE (programs.SabotageEnv) does not reach these tests, and the
// sabotage suite does not run them: serve --writable serves the view it
// renders, never an escaped copy, and a writer served no tree writes to
// the host's own /sys. TestPassthrough, TestSRIOV and
// TestKubevirtListsABoundGPU hold their own control instead (the calls
// repeated on the read-only tree must fail; the plugin lists nothing
// before the bind); the safety tests judge serve's state and its view,
// not what a consumer reads from them.
package writable_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// The modes in which the test binary, re-executed in a served namespace,
// runs a compat writer or reader at /sys instead of the tests.
const (
	bindChild   = "bind"   // compat.Bind: effective profile, from, to
	sriovChild  = "sriov"  // compat.SRIOV: effective profile, n
	compatChild = "compat" // compat.Run: effective profile
)

// effective is the effective profile where a served container sees it.
var effective = filepath.Join(plan.DefaultContainerRoot, plan.ProfileFile)

var binaries hosttest.Binaries

func TestMain(m *testing.M) {
	if mode := hosttest.ChildMode(); mode != "" {
		os.Exit(runChild(mode, os.Args[len(os.Args)-3:]))
	}
	os.Exit(binaries.Removed(hosttest.Alone(func() int { return overlaytest.KeepHostRoot(m.Run) })))
}

// runChild runs one writer or reader with the consumers' defaults (/sys)
// and prints its report as JSON. args end with the mode's own arguments.
func runChild(mode string, args []string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	p, err := profile.LoadFile(effective)
	if err != nil {
		return fail(err)
	}
	m, err := profile.Normalize(effective, p, profile.Options{})
	if err != nil {
		return fail(err)
	}
	var report *compat.Report
	switch mode {
	case bindChild:
		from, to := args[1], args[2]
		for i := range m.Devices {
			if m.Devices[i].Kind == profile.GPU {
				m.Devices[i].Driver = from
			}
		}
		report, _ = compat.Bind(m, to)
	case sriovChild:
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return fail(err)
		}
		report = compat.SRIOV(m, n)
	case compatChild:
		report = compat.Run(m, compat.KernelSysfs)
	case nvpciChild, readChild, bindLoopChild:
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return fail(err)
		}
		return timeChild(mode, m, n)
	case raceChild:
		n, err := strconv.Atoi(args[2])
		if err != nil {
			return fail(err)
		}
		return race(m, n)
	default:
		return fail(fmt.Errorf("unknown child mode %q", mode))
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		return fail(err)
	}
	return 0
}

// The profile: two nvidia GPUs, each beside a ConnectX-7 with 8 VFs.
const sriovProfile = "testdata/profiles/sriov.yaml"

// server is a serve --writable in a mount namespace of its own, so its
// FUSE view never reaches the host.
type server struct {
	cmd        *exec.Cmd
	ns         int // the process whose mount namespace it serves in; 0 its own
	root, tree string
	spec       string
	log        *os.File
}

// start runs serve --writable with a profile until its spec is written,
// which it writes once the view is mounted.
func start(t testing.TB, prof, root, tree string) *server { return startIn(t, 0, prof, root, tree) }

// startIn is start in the mount namespace of process ns (0: one of its own).
func startIn(t testing.TB, ns int, prof, root, tree string) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{root: root, tree: tree, spec: filepath.Join(dir, "spec.json")}
	var err error
	s.log, err = os.Create(filepath.Join(dir, "serve.log"))
	require.NoError(t, err)
	argv := []string{binaries.Binary(t), "serve", "--writable", "--writable-tree", tree,
		"--profile", prof, "--root", root,
		"--output", s.spec, "--listen", "127.0.0.1:0", "--no-watch"}
	if ns == 0 {
		argv = append([]string{"unshare", "--mount", "--propagation", "private"}, argv...)
	} else {
		// In a namespace that outlives the server, as the node's does.
		argv = append([]string{"nsenter", "--target", strconv.Itoa(ns), "--mount", "--"}, argv...)
	}
	s.cmd, s.ns = exec.Command(argv[0], argv[1:]...), ns
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() { s.stop(t) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(s.spec); err == nil {
			return s
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(s.log.Name())
			t.Fatalf("serve --writable wrote no spec in 20 s; its log:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// served is a container of the server's spec: its mounts, from inside the
// server's namespace.
func (s *server) served(t testing.TB) hosttest.Served {
	t.Helper()
	spec, err := cdispec.ReadSpec(s.spec)
	require.NoError(t, err)
	require.Len(t, spec.Devices, 1)
	return hosttest.Served{Spec: spec.Devices[0].ContainerEdits.Mounts, Enter: cmp.Or(s.ns, s.cmd.Process.Pid)}
}

// stop ends the server with SIGTERM, as the kubelet does; it unmounts its
// view. Stopping twice is a no-op.
func (s *server) stop(t testing.TB) {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.cmd.Wait(); err != nil {
		out, _ := os.ReadFile(s.log.Name())
		t.Errorf("serve --writable: %v; its log:\n%s", err, out)
	}
	s.log.Close()
}

// report runs a child in served and returns its report.
func report(t testing.TB, served hosttest.Served, mode string, args ...string) *compat.Report {
	t.Helper()
	cmd := served.Reexec(t, mode, append([]string{"--", "x"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s child: %s", mode, stderr.String())
	var r compat.Report
	require.NoError(t, json.Unmarshal(out, &r), "%s child's output: %s", mode, out)
	return &r
}

// ghwDrivers lists the driver ghw reads for each function it lists.
func ghwDrivers(t *testing.T, served hosttest.Served) map[string]programs.GHWDevice {
	t.Helper()
	cmd := programs.GHWListRun{Binary: programs.NeedBinary(t, programs.GHWList())}.Invocation().In(served)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "ghw-list: %s", stderr.String())
	devices, err := programs.ParseGHWDevices(out)
	require.NoError(t, err)
	byAddress := map[string]programs.GHWDevice{}
	for _, d := range devices {
		byAddress[d.Address] = d
	}
	return byAddress
}

func requireOK(t *testing.T, r *compat.Report, what string) {
	t.Helper()
	for _, x := range r.Results {
		t.Logf("%s: %-34s %-13s ok=%v %s", what, x.Check, x.Device, x.OK, x.Detail)
	}
	require.True(t, r.OK(), "%s: failed rows %+v", what, r.Failures())
}

func machine(t *testing.T) *profile.Machine {
	t.Helper()
	p, err := profile.LoadFile(repoProfile(t))
	require.NoError(t, err)
	m, err := profile.Normalize(sriovProfile, p, profile.Options{})
	require.NoError(t, err)
	return m
}

// TestPassthrough: nvpassthrough binds every GPU to vfio-pci, unbinds it
// and binds it back to nvidia through the writable view, and go-nvlib,
// deviceattribute (compat's rows after each call) and ghw see each state;
// the bind survives a restart of serve. The same calls on the read-only
// tree fail.
func TestPassthrough(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	m := machine(t)
	root, tree := filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "tree")
	srv := start(t, repoProfile(t), root, tree)
	served := srv.served(t)

	requireDrivers := func(served hosttest.Served, driver, when string) {
		t.Helper()
		ghw := ghwDrivers(t, served)
		for _, g := range m.GPUs() {
			d, ok := ghw[g.Address.String()]
			require.True(t, ok, "%s: ghw lists no %s", when, g.Address)
			require.Equal(t, driver, d.Driver, "%s: ghw's driver of %s", when, g.Address)
		}
	}
	requireDrivers(served, profile.DriverNVIDIA, "at start")
	requireOK(t, report(t, served, bindChild, profile.DriverNVIDIA, profile.DriverVFIO), "to vfio-pci")
	requireDrivers(served, profile.DriverVFIO, "bound to vfio-pci")

	// A restart keeps the binding: the state is in the root, the tree is
	// rendered from it again.
	srv.stop(t)
	srv = start(t, repoProfile(t), root, tree)
	served = srv.served(t)
	requireDrivers(served, profile.DriverVFIO, "after a restart of serve")

	requireOK(t, report(t, served, bindChild, profile.DriverVFIO, ""), "unbound")
	requireDrivers(served, "", "unbound")
	requireOK(t, report(t, served, bindChild, "", profile.DriverNVIDIA), "back to nvidia")
	requireDrivers(served, profile.DriverNVIDIA, "back on nvidia")

	// The negative control: the read-only tree, as the default serves it.
	ro := readOnly(t, served)
	r := report(t, ro, bindChild, profile.DriverNVIDIA, profile.DriverVFIO)
	require.False(t, r.OK(), "nvpassthrough bound a GPU on the read-only tree")
	for _, x := range r.Results {
		t.Logf("read-only: %-34s %-13s ok=%v %s", x.Check, x.Device, x.OK, x.Detail)
		if x.Check == compat.BindVFIO {
			require.False(t, x.OK, "read-only tree: %s %s", x.Check, x.Device)
			// Without the view, the node's own /sys/bus/pci/drivers has
			// no vfio-pci (this machine's has none), or the tree refuses
			// the first write.
			require.Regexp(t, `is the module loaded|read-only file system`, x.Detail)
		}
	}
	requireDrivers(ro, profile.DriverNVIDIA, "the read-only tree after the writes")
}

// TestSRIOV: a write of sriov_numvfs gives each HCA its virtual functions,
// which go-nvlib lists with their physical function, deviceattribute with
// its pcieRoot and ghw under the same bridge; 0 removes them. The read-only
// tree refuses the write.
func TestSRIOV(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	m := machine(t)
	srv := start(t, repoProfile(t), filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "tree"))
	served := srv.served(t)

	vfs := func(served hosttest.Served) map[string]programs.GHWDevice {
		out := map[string]programs.GHWDevice{}
		for a, d := range ghwDrivers(t, served) {
			if d.Vendor == "15b3" && d.Product == fmt.Sprintf("%04x", m.HCAs.VFDevice) {
				out[a] = d
			}
		}
		return out
	}
	require.Empty(t, vfs(served), "no VFs before the write")
	requireOK(t, report(t, served, sriovChild, "4"), "4 VFs")
	got := vfs(served)
	require.Len(t, got, 4*len(m.GPUs()), "ghw lists 4 VFs per HCA")
	for a, d := range got {
		require.Equal(t, profile.DriverMLX5, d.Driver, "VF %s", a)
	}
	requireOK(t, report(t, served, sriovChild, "0"), "no VFs")
	require.Empty(t, vfs(served), "0 removes them")

	r := report(t, readOnly(t, served), sriovChild, "4")
	require.False(t, r.OK(), "the read-only tree took a write of sriov_numvfs")
	for _, x := range r.Results {
		t.Logf("read-only: %-20s %-13s ok=%v %s", x.Check, x.Device, x.OK, x.Detail)
		require.Equal(t, compat.SRIOVWrite, x.Check)
		require.False(t, x.OK)
	}
}

// TestReadersSeeTheSame: a container that only reads finds in the writable
// view what it finds in the read-only tree: compat's every row, the same.
func TestReadersSeeTheSame(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	srv := start(t, repoProfile(t), filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "tree"))
	w := report(t, srv.served(t), compatChild)
	r := report(t, hosttest.Served{Root: renderReadOnly(t, repoProfile(t))}, compatChild)
	requireOK(t, w, "writable view")
	require.Equal(t, r.Results, w.Results, "the same rows, read-only tree and writable view")
}

// readOnly is the negative control: the default mode's tree and its spec's
// read-only mounts, and an empty modules.alias where the writable spec
// mounts its stand-in (whose source, the view, only serve's namespace
// has), so that nvpassthrough gets as far as it can.
func readOnly(t *testing.T, writable hosttest.Served) hosttest.Served {
	t.Helper()
	ms, err := cdispec.Mounts(renderReadOnly(t, repoProfile(t)), "", nil)
	require.NoError(t, err)
	spec, err := cdispec.NewSpec(cdispec.DefaultKind, ms, nil)
	require.NoError(t, err)
	mounts := spec.Devices[0].ContainerEdits.Mounts
	alias := filepath.Join(t.TempDir(), "modules.alias")
	require.NoError(t, os.WriteFile(alias, nil, 0o644))
	for _, m := range writable.Spec {
		if filepath.Base(m.ContainerPath) == "modules.alias" {
			mounts = append(mounts, &specs.Mount{HostPath: alias, ContainerPath: m.ContainerPath, Options: []string{"ro", "bind"}})
		}
	}
	return hosttest.Served{Spec: mounts}
}

// repoProfile is the tests' profile file.
func repoProfile(t testing.TB) string { return filepath.Join(overlaytest.Repo(t), sriovProfile) }

// renderReadOnly renders a profile as the default mode does.
func renderReadOnly(t testing.TB, prof string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "ro")
	out, err := exec.Command(binaries.Binary(t), "render", "--root", root, "--profile", prof).CombinedOutput()
	require.NoError(t, err, "render: %s", out)
	return root
}
