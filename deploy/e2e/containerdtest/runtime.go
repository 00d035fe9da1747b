// Package containerdtest runs a private containerd 2 for end-to-end tests, so the
// overlay is served the way a kubelet's runtime serves it: ctr with CDI,
// CRI pods with CDI devices or annotations (crictl speaks CRI as a kubelet
// does), and NRI plugins that edit containers which ask for no device.
//
// Everything a Harness runs is its own. containerd keeps its root, state,
// sockets (gRPC, ttrpc, NRI), CDI spec directory and config under the
// test's temporary directory, and runs in a private mount namespace with a
// private /run, so its shims' sockets and runc's state never touch the
// host's (containerd and the runc shim keep those at fixed /run paths). At
// the end it stops the pods and containers, stops containerd, and kills
// only the processes it started: those in its mount namespace and their
// descendants.
//
// Images come from local files (see ociimage): no registry is reachable.
// The sandbox image is a tiny static pause program, pinned in the config.
package containerdtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

const (
	// CRINamespace is the containerd namespace CRI keeps its images,
	// pods and containers in.
	CRINamespace = "k8s.io"
	// CtrNamespace is where ctr runs its containers, apart from CRI's.
	CtrNamespace = "harness"
	// PauseImage is the sandbox image pinned in the config.
	PauseImage = "localhost/nvml-mock-sysfs/pause:test"
	// maxSocketPath is the longest path a Unix socket may have (sun_path
	// holds 108 bytes with the terminating NUL).
	maxSocketPath = 107
	// readyTimeout bounds containerd's start; stopTimeout its shutdown.
	readyTimeout = 60 * time.Second
	stopTimeout  = 15 * time.Second
	// shimExitGrace is how long the shims get to exit by themselves.
	shimExitGrace = 3 * time.Second
)

// Options tune a Harness. The zero value prints progress on standard error.
type Options struct {
	// Progress receives a line per startup step and at shutdown; nil
	// means standard error.
	Progress io.Writer
	// Namespace, when not zero, is the PID of a process whose mount,
	// network and pid namespaces containerd joins (nsenter) instead of a
	// private mount namespace of its own: a kubelet must share
	// containerd's mount namespace (kubetest). The caller owns that
	// namespace: it gives it a private /run, and that process is left
	// running. CRI then also reads CDI specs from /var/run/cdi, which lies
	// in that private /run, as a node's containerd does.
	Namespace int
	// CNIPlugins is the directory of the CNI plugin binaries and
	// CNIConfList the one network configuration CRI gives pods; empty
	// means no CNI, for pods on the host network only.
	CNIPlugins, CNIConfList string
}

// Harness is one running private containerd.
type Harness struct {
	// Dir holds everything of this containerd.
	Dir string
	// Address is containerd's gRPC socket.
	Address string
	// NRISocket is where NRI plugins connect.
	NRISocket string
	// CDIDir is the CRI plugin's only cdi_spec_dirs entry.
	CDIDir string
	// LogFile is containerd's own log.
	LogFile string
	// ConfigFile is containerd's config.
	ConfigFile string
	// CgroupParent is the cgroup (in every hierarchy) that holds the
	// pods' and ctr's containers, removed at the end.
	CgroupParent string

	bin      string // containerd, ctr and the runc shim
	crictl   string
	progress io.Writer
	opts     Options
	stopped  bool
	pid      int // containerd's own (not nsenter's)
	cmd      *exec.Cmd
	exited   chan struct{} // closed when containerd has exited
	mountNS  string        // containerd's mount namespace, as /proc/PID/ns/mnt reads
}

// Start starts a private containerd for the test (and its subtests) and
// stops it when the test ends. It skips under -short and when not root.
func Start(t testing.TB, opts Options) *Harness {
	t.Helper()
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "runc")
	h := &Harness{
		bin:      programs.Need(t, programs.Containerd()),
		crictl:   programs.NeedBinary(t, programs.Crictl()),
		progress: opts.Progress,
		opts:     opts,
		Dir:      t.TempDir(),
	}
	if h.progress == nil {
		h.progress = os.Stderr
	}
	h.Address = filepath.Join(h.Dir, "containerd.sock")
	// A directory of its own, which a node binds at /var/run/nri
	// (kubetest), where NRI plugins in pods dial it.
	h.NRISocket = filepath.Join(h.Dir, "nri", "nri.sock")
	h.CDIDir = filepath.Join(h.Dir, "cdi")
	h.LogFile = filepath.Join(h.Dir, "containerd.log")
	h.CgroupParent = fmt.Sprintf("/nvml-mock-sysfs-runtime-%d", time.Now().UnixNano())
	for _, s := range []string{h.Address + ".ttrpc", h.NRISocket} {
		if len(s) > maxSocketPath {
			t.Fatalf("runtime: socket path %s is %d bytes, over the %d a Unix socket allows: shorten the test's name", s, len(s), maxSocketPath)
		}
	}
	for _, d := range []string{h.CDIDir, filepath.Dir(h.NRISocket), filepath.Join(h.Dir, "nri-plugins"), filepath.Join(h.Dir, "nri-conf"), filepath.Join(h.Dir, "fifo"), filepath.Join(h.Dir, "cni/conf")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.ConfigFile = filepath.Join(h.Dir, "config.toml")
	files := map[string]string{h.ConfigFile: h.config(), filepath.Join(h.Dir, "crictl.yaml"): h.crictlConfig()}
	if opts.CNIConfList != "" {
		files[filepath.Join(h.Dir, "cni/conf/10-harness.conflist")] = opts.CNIConfList
	}
	for file, content := range files {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Registered first, so a start that fails half-way still stops what
	// it started.
	t.Cleanup(func() { h.stop(t) })
	h.start(t)
	h.Import(t, pauseImage(t), CRINamespace)
	return h
}

// config is containerd's configuration: every path in Dir, CDI from
// CDIDir, NRI on its own socket with no plugin directory to launch from,
// and the settings this machine needs (no CAP_SYS_RESOURCE, no CNI).
func (h *Harness) config() string {
	runc, _ := exec.LookPath("runc")
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	d := func(sub string) string { return q(filepath.Join(h.Dir, sub)) }
	cdiDirs, cniBin := q(h.CDIDir), d("cni/bin")
	if h.opts.Namespace != 0 {
		cdiDirs += ", " + q("/var/run/cdi")
	}
	if h.opts.CNIPlugins != "" {
		cniBin = q(h.opts.CNIPlugins)
	}
	return strings.Join([]string{
		`version = 3`,
		`root = ` + d("root"),
		`state = ` + d("state"),
		`temp = ` + d("tmp"),
		`[grpc]`,
		`  address = ` + q(h.Address),
		`[ttrpc]`,
		`  address = ` + q(h.Address+".ttrpc"),
		`[plugins."io.containerd.internal.v1.opt"]`,
		`  path = ` + d("opt"),
		`[plugins."io.containerd.image-verifier.v1.bindir"]`,
		`  bin_dir = ` + d("image-verifier"),
		// CDI from this harness's directory (containerd 2.4 always enables
		// CDI; enable_cdi is gone).
		`[plugins."io.containerd.cri.v1.runtime"]`,
		`  cdi_spec_dirs = [` + cdiDirs + `]`,
		// Without CAP_SYS_RESOURCE containerd may not lower a container's
		// oom_score_adj below its own.
		`  restrict_oom_score_adj = true`,
		`  [plugins."io.containerd.cri.v1.runtime".cni]`,
		`    bin_dirs = [` + cniBin + `]`,
		`    conf_dir = ` + d("cni/conf"),
		`  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]`,
		`    BinaryName = ` + q(runc),
		`[plugins."io.containerd.cri.v1.images".pinned_images]`,
		`  sandbox = ` + q(PauseImage),
		`[plugins."io.containerd.nri.v1.nri"]`,
		`  disable = false`,
		`  socket_path = ` + q(h.NRISocket),
		`  plugin_path = ` + d("nri-plugins"),
		`  plugin_config_path = ` + d("nri-conf"),
		``,
	}, "\n")
}

func (h *Harness) logf(format string, args ...any) {
	fmt.Fprintf(h.progress, "runtime: "+format+"\n", args...)
}

// start runs containerd in a private mount namespace with its own /run
// and waits until it answers.
func (h *Harness) start(t testing.TB) {
	t.Helper()
	began := time.Now()
	h.logf("starting containerd 2.4.2 in %s (private mount namespace and /run)", h.Dir)
	log, err := os.Create(h.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	served := hosttest.Served{
		Tmpfs: []string{"/run"},
		// The shim is found on PATH, runc by the config.
		Env: []string{"PATH=" + h.bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	h.cmd = served.Command(filepath.Join(h.bin, "containerd"), "--config", h.ConfigFile)
	if h.opts.Namespace != 0 {
		h.cmd = Enter(h.opts.Namespace, filepath.Join(h.bin, "containerd"), "--config", h.ConfigFile)
		h.cmd.Env = append(os.Environ(), served.Env...)
	}
	h.cmd.Stdout, h.cmd.Stderr = log, log
	// Its own process group, and a SIGKILL if this test binary dies first.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("runtime: start containerd: %v", err)
	}
	h.pid = h.cmd.Process.Pid
	if h.opts.Namespace != 0 {
		if h.pid, err = ChildPID(h.cmd); err != nil {
			t.Fatalf("runtime: containerd: %v", err)
		}
	}
	h.exited = make(chan struct{})
	go func() {
		_ = h.cmd.Wait()
		log.Close()
		close(h.exited)
	}()
	for {
		if _, err := h.ctr(CRINamespace, "version"); err == nil {
			break
		}
		select {
		case <-h.exited:
			t.Fatalf("runtime: containerd exited during startup (%v):\n%s", h.cmd.ProcessState, h.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(began) > readyTimeout {
			t.Fatalf("runtime: containerd did not answer within %s:\n%s", readyTimeout, h.logTail())
		}
	}
	nsOf := h.cmd.Process.Pid
	if h.opts.Namespace != 0 {
		nsOf = h.opts.Namespace
	}
	if h.mountNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", nsOf)); err != nil {
		t.Fatalf("runtime: containerd's mount namespace: %v", err)
	}
	h.logf("containerd (pid %d) ready in %s; gRPC %s, NRI %s, CDI specs from %s", h.pid, time.Since(began).Round(time.Millisecond), h.Address, h.NRISocket, h.CDIDir)
}

// ConfigDump is the configuration containerd runs with: ConfigFile
// merged into its defaults, as `containerd config dump` prints it.
func (h *Harness) ConfigDump(t testing.TB) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(h.bin, "containerd"), "--config", h.ConfigFile, "config", "dump").Output()
	if err != nil {
		t.Fatalf("runtime: containerd config dump: %v", err)
	}
	return string(out)
}

// logTail is the end of containerd's log, for a failure message.
func (h *Harness) logTail() string {
	b, _ := os.ReadFile(h.LogFile)
	if len(b) > 6000 {
		b = append([]byte("…"), b[len(b)-6000:]...)
	}
	return string(b)
}

// ctr runs ctr against this containerd in a namespace.
func (h *Harness) ctr(namespace string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(h.bin, "ctr"), append([]string{"--address", h.Address, "--namespace", namespace}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Ctr runs ctr in a namespace and fails the test if it fails, returning
// its standard output.
func (h *Harness) Ctr(t testing.TB, namespace string, args ...string) string {
	t.Helper()
	out, err := h.ctr(namespace, args...)
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	return out
}

// Import writes img as an OCI archive and imports it into each namespace
// (CRI's for pods, CtrNamespace for ctr run), unpacked for the default
// snapshotter.
func (h *Harness) Import(t testing.TB, img ociimage.Image, namespaces ...string) {
	t.Helper()
	began := time.Now()
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteFile(archive, img); err != nil {
		t.Fatalf("runtime: %v", err)
	}
	for _, ns := range namespaces {
		h.Ctr(t, ns, "images", "import", archive)
	}
	h.logf("imported %s into %s in %s", img.Name, strings.Join(namespaces, ", "), time.Since(began).Round(time.Millisecond))
}

// CtrRun runs `ctr run --rm` of image in CtrNamespace with the given
// run flags and command, and returns its exit code and output. cdiDir, if
// not empty, is bound at /run/cdi of a private mount namespace that ctr
// runs in: ctr resolves `--device` CDI names itself, and only from /etc/cdi
// and /var/run/cdi.
func (h *Harness) CtrRun(t testing.TB, cdiDir string, flags []string, image string, command ...string) (int, string, string) {
	t.Helper()
	id := fmt.Sprintf("ctr-run-%d", time.Now().UnixNano())
	args := append([]string{"--address", h.Address, "--namespace", CtrNamespace, "run", "--rm",
		// The FIFOs of the container's stdio: ctr makes them and the shim,
		// in containerd's namespace, opens them, so they may not be in this
		// namespace's private /run.
		"--fifo-dir", filepath.Join(h.Dir, "fifo")}, flags...)
	args = append(args, "--cgroup", path.Join(h.CgroupParent, id))
	args = append(append(args, image, id), command...)
	served := hosttest.Served{Tmpfs: []string{"/run"}}
	if cdiDir != "" {
		served.Binds = []hosttest.Bind{{Source: cdiDir, Target: "/run/cdi"}}
	}
	cmd := served.Command(filepath.Join(h.bin, "ctr"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("runtime: ctr run: %v", err)
	}
	return 0, stdout.String(), stderr.String()
}

// Stop removes every pod and container, stops containerd, and kills what
// is left of the processes it started, then waits for them to be gone.
// Start registers it to run when the test ends; a caller that must stop
// containerd earlier (kubetest, before its namespace goes) calls it
// itself, and the end of the test then does nothing.
func (h *Harness) Stop(t testing.TB) { h.stop(t) }

func (h *Harness) stop(t testing.TB) {
	began := time.Now()
	if h.cmd == nil || h.cmd.Process == nil || h.stopped {
		return
	}
	h.stopped = true
	select {
	case <-h.exited:
		t.Errorf("runtime: containerd exited before the end of the test (%v):\n%s", h.cmd.ProcessState, h.logTail())
	default:
		// Pods and ctr containers first, so the shims exit by themselves.
		if _, err := h.crictlRun("rmp", "--all", "--force"); err != nil {
			t.Errorf("runtime: remove the pods: %v", err)
		}
		h.removeCtrContainers(t)
		_ = syscall.Kill(h.pid, syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(stopTimeout):
			t.Errorf("runtime: containerd did not stop within %s of SIGTERM; killing its process group", stopTimeout)
			_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.exited
		}
	}
	left := h.reap(t)
	if err := RemoveCgroup(h.CgroupParent); err != nil {
		t.Errorf("runtime: %v", err)
	}
	h.logf("stopped containerd in %s; %d leftover processes killed %v", time.Since(began).Round(time.Millisecond), len(left), left)
}

// Restart stops containerd (SIGTERM) and starts it again with the same
// directories, sockets and configuration, as a node's containerd restarts:
// NRI plugins lose their connection and must register again. No pod may
// be left: the shims live in containerd's private /run, which a restart
// replaces. It returns how long containerd was away.
func (h *Harness) Restart(t testing.TB) time.Duration {
	t.Helper()
	began := time.Now()
	if out, err := h.crictlRun("pods", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("runtime: restart with pods left (%v): %s", err, out)
	}
	_ = syscall.Kill(h.pid, syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("runtime: containerd did not stop within %s of SIGTERM", stopTimeout)
	}
	if left := h.reap(t); len(left) > 0 {
		t.Errorf("runtime: %d processes outlived containerd's restart: %v", len(left), left)
	}
	h.start(t)
	return time.Since(began)
}

// reap waits for the processes containerd started (its shims exit by
// themselves once their last container is gone) and kills those left
// after shimExitGrace, returning them.
func (h *Harness) reap(t testing.TB) []int {
	own := func() []int { return ownProcesses(h.mountNS) }
	if h.opts.Namespace != 0 {
		// The namespace's owner keeps its init, and the nsenter and
		// unshare processes that entered it stay in the host's pid
		// namespace: containerd's are only those inside.
		pidNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", h.opts.Namespace))
		own = func() []int {
			return slices.DeleteFunc(ownProcesses(h.mountNS), func(pid int) bool {
				ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
				return pid == h.opts.Namespace || ns != pidNS
			})
		}
	}
	left := own()
	for wait := time.Now().Add(shimExitGrace); len(left) > 0 && time.Now().Before(wait); left = own() {
		time.Sleep(20 * time.Millisecond)
	}
	for _, pid := range left {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(stopTimeout)
	for _, pid := range left {
		for Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if Alive(pid) {
			t.Errorf("runtime: process %d outlived SIGKILL by %s", pid, stopTimeout)
		}
	}
	return left
}

// removeCtrContainers deletes what ctr left in its namespace (a ctr run
// cut short leaves its task and container).
func (h *Harness) removeCtrContainers(t testing.TB) {
	out, err := h.ctr(CtrNamespace, "containers", "list", "--quiet")
	if err != nil {
		t.Errorf("runtime: %v", err)
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = h.ctr(CtrNamespace, "tasks", "kill", "--signal", "SIGKILL", id)
		_, _ = h.ctr(CtrNamespace, "tasks", "delete", "--force", id)
		if _, err := h.ctr(CtrNamespace, "containers", "delete", id); err != nil {
			t.Errorf("runtime: %v", err)
		}
	}
}

// NodeCommand runs name with args in containerd's mount namespace: the
// node's, as the containers it creates see it. Without Options.Namespace
// that is the harness's private one, made with private propagation, so
// nothing done there reaches the host's mounts. It runs in containerd's
// pid namespace too, whose processes that namespace's /proc lists: a
// worker node's /proc/self is then the program's own.
func (h *Harness) NodeCommand(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--target", strconv.Itoa(h.pid), "--mount", "--pid", "--", name}, args...)...)
}

// NodeMounts are the mounts of containerd's mount namespace, the node's.
func (h *Harness) NodeMounts(t testing.TB) []*mountinfo.Info {
	t.Helper()
	return ReadMountinfo(t, fmt.Sprintf("/proc/%d/mountinfo", h.pid))
}

// ReadMountinfo reads a mountinfo file (/proc/PID/mountinfo).
func ReadMountinfo(t testing.TB, file string) []*mountinfo.Info {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("mounts: %v", err)
	}
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		t.Fatalf("mounts: %s: %v", file, err)
	}
	return mounts
}
