package kubetest

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
)

// kubeletSysctl is a global sysctl a kubelet rewrites, and the value it
// writes: it reads each first and writes only one that differs
// (setupKernelTunables in the kubelet's container manager).
type kubeletSysctl struct{ name, value string }

// kubeletSysctls are the sysctls a kubelet rewrites, every one of
// setupKernelTunables': inside the namespace each /proc/sys entry is a file
// of ours (sysctlCopy), so the kubelet's writes land there, not on the host.
func kubeletSysctls() []kubeletSysctl {
	return []kubeletSysctl{
		{"vm/overcommit_memory", "1"},
		{"vm/panic_on_oom", "0"},
		{"kernel/panic", "10"},
		{"kernel/panic_on_oops", "1"},
		{"kernel/keys/root_maxkeys", "1000000"},
		{"kernel/keys/root_maxbytes", "25000000"},
	}
}

// sysctlCopy is the file bound over the sysctl's /proc/sys entry in the
// namespace; it starts with the host's value.
func (c *Cluster) sysctlCopy(name string) string {
	return filepath.Join(c.Dir, "sysctl", strings.ReplaceAll(name, "/", "."))
}

// kubeletHostPaths are the directories a kubelet creates whatever its
// --root-dir, and the CNI plugins' state: inside the namespace they lie
// in private tmpfs mounts.
func kubeletHostPaths() []string {
	return []string{"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni"}
}

// podCgroup is where containerd puts a kubelet's containers (in every
// cgroup v1 hierarchy) when the kubelet makes no QoS cgroups: its default
// cgroup parent, its CRI namespace. The kubelet ignores cgroupRoot
// without cgroupsPerQOS (../shared/KUBERNETES.md), so a cluster cannot
// have a parent of its own as containerdtest's own containers do, and
// every cluster on the host shares this one.
const podCgroup = "k8s.io"

// namespaceTimeout bounds the namespace's setup.
const namespaceTimeout = 30 * time.Second

// credentials makes the API server's token file (one administrator token
// in system:masters) and the service accounts' RSA key pair.
func (c *Cluster) credentials(t testing.TB) {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	c.token = hex.EncodeToString(b)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string][]byte{
		"tokens.csv": []byte(c.token + ",admin,admin,system:masters\n"),
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
	} {
		if err := os.WriteFile(filepath.Join(c.Dir, file), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// servingCert is the API server's self-signed serving certificate, which
// it writes into its --cert-dir at start (with its CA): the clients trust
// it alone.
func (c *Cluster) servingCert() string {
	return filepath.Join(c.Dir, "apiserver-certs", "apiserver.crt")
}

// selfSigned is the TLS configuration of the readiness probes of the
// scheduler's own port, whose certificate it makes up at start: the probe
// asks only whether it answers, inside the cluster's private network.
func selfSigned() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true}
}

// writeKubeconfig writes Kubeconfig: the administrator's token and the
// API server's certificate.
func (c *Cluster) writeKubeconfig(t testing.TB) {
	t.Helper()
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["node"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthority: c.servingCert()}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.token}
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "node", AuthInfo: "admin"}
	cfg.CurrentContext = "node"
	if err := clientcmd.WriteToFile(*cfg, c.Kubeconfig); err != nil {
		t.Fatalf("cluster: %v", err)
	}
}

// enterNamespace starts the control plane's namespace's init and waits
// until its mounts are set up.
func (c *Cluster) enterNamespace(t testing.TB) {
	t.Helper()
	began := time.Now()
	ready := filepath.Join(c.Dir, "namespace-ready")
	if err := os.MkdirAll(filepath.Join(c.Dir, "sysctl"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range kubeletSysctls() {
		if err := os.WriteFile(c.sysctlCopy(s.name), []byte(c.host.sysctls[s.name]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hosts := filepath.Join(c.Dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost "+NodeName+"\n::1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.holder = exec.Command("unshare", "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
		"sh", "-c", c.namespaceScript(t, hosts, ready, true))
	out := filepath.Join(c.Dir, "namespace.log")
	log, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	c.holder.Stdout, c.holder.Stderr = log, log
	// A SIGKILL if this test binary dies first: --kill-child passes it
	// on to the init, and the kernel to everything in the namespace.
	c.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.holder.Start(); err != nil {
		t.Fatalf("cluster: start the namespace: %v", err)
	}
	if c.initPID, err = containerdtest.ChildPID(c.holder); err != nil {
		t.Fatalf("cluster: the namespace's init: %v", err)
	}
	if c.host.pidNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.initPID)); err != nil {
		t.Fatalf("cluster: the namespace's init: %v", err)
	}
	waitReady(t, "the namespace", ready, out, c.holder)
	c.logf("private mount, network and pid namespace (init pid %d) ready in %s", c.initPID, time.Since(began).Round(time.Millisecond))
}

// namespaceScript is what a namespace's init runs, as sh, in a new mount
// namespace with its own /proc: a private /run; the kubelet's sysctls
// bound to the cluster's copies (every kubelet writes the same values); a
// private /etc (the host's under an overlay whose writes stay beside
// hosts, so that a pod's hostPath below /etc, such as GFD's chart's
// /etc/kubernetes/node-feature-discovery/features.d, never reaches the
// host) with its own /etc/hosts; a private /var/log and /var/lib, the host's /var/lib entries
// bound back in but the kubelet's and the CNI plugins' own; loopback up.
// The control plane's namespace binds the host's /var/lib aside first
// (below Dir); a worker's, nested in it, finds it there. It then touches
// ready and sleeps as pid 1 until it is killed: the orphans reparented to
// it (containerd's shims) stay zombies until then, which nothing counts
// as alive.
func (c *Cluster) namespaceScript(t testing.TB, hosts, ready string, controlPlane bool) string {
	t.Helper()
	q := shellQuote
	lines := []string{"set -eu", "mount -t tmpfs -o mode=0755 tmpfs /run"}
	for _, s := range kubeletSysctls() {
		lines = append(lines, "mount --bind "+q(c.sysctlCopy(s.name))+" "+q("/proc/sys/"+s.name))
	}
	hostVarLib := filepath.Join(c.Dir, "host-var-lib")
	etc := filepath.Join(filepath.Dir(hosts), "etc")
	lines = append(lines,
		"mkdir -p "+q(etc+"/upper")+" "+q(etc+"/work"),
		"mount -t overlay overlay -o "+q("lowerdir=/etc,upperdir="+etc+"/upper,workdir="+etc+"/work")+" /etc",
		"mount --bind "+q(hosts)+" /etc/hosts",
		"mount -t tmpfs -o mode=0755 tmpfs /var/log")
	if controlPlane {
		lines = append(lines, "mkdir -p "+q(hostVarLib), "mount --rbind /var/lib "+q(hostVarLib))
	}
	return strings.Join(append(lines,
		"mount -t tmpfs -o mode=0755 tmpfs /var/lib",
		`for e in `+q(hostVarLib)+`/* `+q(hostVarLib)+`/.[!.]*; do`,
		`  [ -e "$e" ] || [ -L "$e" ] || continue`,
		`  n=${e##*/}`,
		`  case $n in kubelet|cni) continue;; esac`,
		`  if [ -L "$e" ]; then cp -P "$e" /var/lib/`,
		`  elif [ -d "$e" ]; then mkdir "/var/lib/$n"; mount --rbind "$e" "/var/lib/$n"`,
		`  else touch "/var/lib/$n"; mount --bind "$e" "/var/lib/$n"; fi`,
		`done`,
		"ip link set lo up",
		"touch "+q(ready),
		`exec sleep infinity`,
	), "\n")
}

// waitReady waits for a namespace's init to touch ready, failing with its
// log if holder exits first or namespaceTimeout passes.
func waitReady(t testing.TB, what, ready, logFile string, holder *exec.Cmd) {
	t.Helper()
	began := time.Now()
	for {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", holder.Process.Pid)); err != nil || time.Since(began) > namespaceTimeout {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("cluster: %s's setup did not finish within %s:\n%s", what, namespaceTimeout, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Dial connects inside the cluster's network namespace, from the test:
// the socket is made on a thread that joined the namespace for the call,
// and a socket stays in the namespace it was made in. client-go's Config
// uses it; so may any client of the cluster's loopback services.
func (c *Cluster) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		conn, err := c.dialLocked(ctx, network, address)
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialLocked dials on a locked thread; it unlocks the thread only if the
// thread is back in its own namespace, else the thread ends with its
// goroutine.
func (c *Cluster) dialLocked(ctx context.Context, network, address string) (net.Conn, error) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer own.Close()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", c.initPID))
	if err != nil {
		return nil, fmt.Errorf("the cluster's network namespace: %w", err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("join the cluster's network namespace: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
		goruntime.UnlockOSThread()
	}
	return conn, err
}

// hostPaths is where the host keeps what the cluster must leave as it
// found it. The zero value is the real host; the harness's own test
// gives stand-ins in a temporary directory, so that Leftovers is seen to
// report each kind of leftover without the test touching the host.
type hostPaths struct {
	sysctlRoot string   // /proc/sys
	cgroupRoot string   // containerdtest.CgroupRoot
	dirs       []string // kubeletHostPaths
	mountinfo  string   // /proc/self/mountinfo
}

func (p hostPaths) sysctl(s string) string {
	return filepath.Join(cmp.Or(p.sysctlRoot, "/proc/sys"), s)
}

func (p hostPaths) kubeletDirs() []string {
	if p.dirs == nil {
		return kubeletHostPaths()
	}
	return p.dirs
}

// podCgroupDirs is podCgroup's directory in every hierarchy.
func (p hostPaths) podCgroupDirs() []string {
	return containerdtest.CgroupDirs(cmp.Or(p.cgroupRoot, containerdtest.CgroupRoot), podCgroup)
}

// hostState is what the cluster must leave on the host as it found it.
type hostState struct {
	sysctls map[string]string // kubeletSysctls' values
	paths   map[string]bool   // which kubeletHostPaths existed
	// cgroups are the podCgroup directories and their children (a
	// container's cgroup each) that existed, in every hierarchy.
	cgroups map[string]bool
	pidNS   string // the namespace's, once it runs
}

// read reads the host's state.
func (p hostPaths) read() hostState {
	h := hostState{sysctls: map[string]string{}, paths: map[string]bool{}, cgroups: map[string]bool{}}
	for _, s := range kubeletSysctls() {
		b, _ := os.ReadFile(p.sysctl(s.name))
		h.sysctls[s.name] = strings.TrimSpace(string(b))
	}
	for _, d := range p.kubeletDirs() {
		_, err := os.Lstat(d)
		h.paths[d] = err == nil
	}
	for _, d := range p.podCgroupDirs() {
		if _, err := os.Stat(d); err == nil {
			h.cgroups[d] = true
		}
		for _, child := range childDirs(d) {
			h.cgroups[child] = true
		}
	}
	return h
}

// childDirs lists the directories in dir.
func childDirs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// containerIDs lists what in s looks like a pod sandbox's or container's
// ID, which names its cgroup below podCgroup.
func containerIDs(s string) []string {
	return regexp.MustCompile(`\b[0-9a-f]{64}\b`).FindAllString(s, -1)
}

// recordContainers remembers every pod sandbox and container a node's
// containerd ever made: those it still has (crictl), and those
// its log names, which include the pods a suite deleted while the
// cluster ran (containerd logs each ID it returns at info level: "returns
// sandbox id", "returns container id"). runc removes a container's cgroup
// when the container is deleted, but the cgroup is the harness's to
// account for either way, and only these are: the clusters of other
// tests on the host put theirs below the same podCgroup.
func (c *Cluster) recordContainers(t testing.TB, runtime *containerdtest.Harness) {
	if c.containers == nil {
		c.containers = map[string]bool{}
	}
	for _, args := range [][]string{{"pods", "--quiet", "--no-trunc"}, {"ps", "--all", "--quiet", "--no-trunc"}} {
		for _, id := range strings.Fields(runtime.Crictl(t, args...)) {
			c.containers[id] = true
		}
	}
	if b, err := os.ReadFile(runtime.LogFile); err == nil {
		for _, id := range containerIDs(string(b)) {
			c.containers[id] = true
		}
	}
}

// newCgroups sorts the children of podCgroup that were not there when
// the cluster started into the cluster's own and others'. Every new child
// is judged, not only those of the containers containerd still has at
// the end: a suite deletes pods while the cluster runs.
func (c *Cluster) newCgroups(dir string) (own, others []string) {
	for _, child := range childDirs(dir) {
		switch {
		case c.host.cgroups[child]:
		case c.containers[filepath.Base(child)]:
			own = append(own, child)
		default:
			others = append(others, child)
		}
	}
	return own, others
}

// removeCgroups removes the new cgroups of the cluster's pods and
// containers in every hierarchy, and podCgroup where the cluster made it
// and nothing else uses it. rmdir removes a cgroup only once it has no
// process and no child: one that stays is a leftover Leftovers reports.
// It returns how many it removed.
func (c *Cluster) removeCgroups() (int, error) {
	var errs []error
	removed := 0
	for _, d := range c.paths.podCgroupDirs() {
		own, _ := c.newCgroups(d)
		for _, child := range own {
			if err := os.Remove(child); err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", child, err))
				continue
			}
			removed++
		}
		if !c.host.cgroups[d] {
			_ = os.Remove(d) // fails while another cluster's cgroups are in it
		}
	}
	return removed, errors.Join(errs...)
}

// Leftovers lists what the cluster left on the host that was not there
// before it started: a changed sysctl, a kubelet directory, a cgroup, a
// process in its namespace, a mount below Dir. Empty after Stop is the
// harness's promise; the cluster's own test and every user's end check it.
func (c *Cluster) Leftovers() []string {
	left := c.sysctlLeftovers()
	for _, p := range c.paths.kubeletDirs() {
		if _, err := os.Lstat(p); err == nil && !c.host.paths[p] {
			left = append(left, "directory "+p)
		}
	}
	for _, d := range c.paths.podCgroupDirs() {
		own, others := c.newCgroups(d)
		for _, child := range own {
			left = append(left, "cgroup "+child)
		}
		// podCgroup itself is the cluster's leftover when it made it,
		// unless another cluster's cgroups keep it.
		if _, err := os.Stat(d); err == nil && !c.host.cgroups[d] && len(others) == 0 {
			left = append(left, "cgroup "+d)
		}
	}
	pidNS := map[string]bool{}
	if c.host.pidNS != "" {
		pidNS[c.host.pidNS] = true
	}
	for _, n := range c.Nodes {
		if n.pidNS != "" {
			pidNS[n.pidNS] = true
		}
	}
	if len(pidNS) > 0 {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && pidNS[ns] && containerdtest.Alive(pid) {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				left = append(left, fmt.Sprintf("process %d %s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
			}
		}
	}
	for _, p := range c.procs {
		select {
		case <-p.exited:
		default:
			left = append(left, fmt.Sprintf("process %d (nsenter of %s)", p.cmd.Process.Pid, p.Name))
		}
	}
	if mounts, err := os.ReadFile(cmp.Or(c.paths.mountinfo, "/proc/self/mountinfo")); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], c.Dir+"/") {
				left = append(left, "mount "+f[4])
			}
		}
	}
	return left
}

// sysctlLeftovers reports each kubelet sysctl the host no longer holds as
// it was at start, and each the check of it cannot vouch for.
//
// The host's value can only show a write that changed it. Where the host's
// value differs from the kubelet's, a write of the kubelet's that escaped
// the namespace shows on the host, and once the kubelet has run (c.Kubelet,
// set when its Node was Ready) the namespace's copy must hold the
// kubelet's value: the proof that the kubelet wrote and the bind caught
// it. A copy still at the host's value means the write went elsewhere, or
// never came, and a host as it was proves nothing. Where the host's value
// is the kubelet's already, the kubelet writes nothing, in the namespace or
// out, so neither the host nor the copy can tell whether the bind would
// have caught a write; nor, on that host, is there one to catch.
func (c *Cluster) sysctlLeftovers() []string {
	var left []string
	for _, s := range kubeletSysctls() {
		name, was := strings.ReplaceAll(s.name, "/", "."), c.host.sysctls[s.name]
		b, _ := os.ReadFile(c.paths.sysctl(s.name))
		switch got := strings.TrimSpace(string(b)); {
		case got == was:
		case got == s.value:
			left = append(left, fmt.Sprintf("sysctl %s: %s, the kubelet's value, was %s", name, got, was))
		default:
			left = append(left, fmt.Sprintf("sysctl %s: %s, was %s", name, got, was))
		}
		if was == s.value || c.Kubelet == nil {
			continue
		}
		b, err := os.ReadFile(c.sysctlCopy(s.name))
		switch copied := strings.TrimSpace(string(b)); {
		case err != nil:
			left = append(left, fmt.Sprintf("sysctl %s: the namespace's copy: %v, so the host's %s proves nothing", name, err, was))
		case copied != s.value:
			left = append(left, fmt.Sprintf("sysctl %s: the namespace's copy holds %s, not the kubelet's %s: its write was not caught there, so the host's %s proves nothing", name, copied, s.value, was))
		}
	}
	return left
}

// shellQuote quotes for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
