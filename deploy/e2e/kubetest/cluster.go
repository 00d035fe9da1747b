// Package kubetest runs a real Kubernetes for end-to-end tests: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, and on each node
// the private containerd of containerdtest and a kubelet, built from the
// Go module proxy into the programs' cache (programs.Kube, programs.Etcd).
// The DRA driver's suite (deploy/e2e/dra), the deploy path's and the
// fleet's share it, as the mount-namespace suites share hosttest.Served.
//
// A cluster has one node beside the control plane (Options.Workers zero)
// or worker nodes of their own (nodes.go). The control plane runs in one
// private mount, network and pid namespace, with credentials generated
// for the test; the single node shares it, on loopback. The namespace is
// held by a small init (pid 1 of its pid namespace) that the harness
// starts first and kills last: the kernel then kills whatever is left in
// it. Inside it, /run is a private tmpfs; the six sysctls a kubelet
// rewrites are files bound over their /proc/sys entries; /var/log and
// /var/lib are private tmpfs (the host's /var/lib entries bound back in,
// /var/lib/kubelet and /var/lib/cni not), so the kubelet's fixed paths and
// the CNI plugins' state never reach the host; and /etc/hosts names the
// node, so the API server reaches the kubelet (pod logs). The test talks
// to the API server from outside with client-go, through sockets made in
// the namespace's network (Dial).
//
// When the test ends (or at Stop) every process is stopped, by PID, the
// containers' cgroups are removed, and Leftovers must find nothing on the
// host: the sysctls as they were, no kubelet directories the test made, no
// cgroup, no process, no mount.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

const (
	// NodeName is the single node's name.
	NodeName = "nvml-mock-node"
	// apiServerAddress is where kube-apiserver listens for the single
	// node, in the namespace's own network: every port is private to it.
	// A cluster of workers has it at controlPlaneIP (nodes.go).
	apiServerAddress = "127.0.0.1:6443"
	etcdClientURL    = "http://127.0.0.1:2379"
	// startTimeout bounds each component's readiness; stopTimeout each
	// one's exit after SIGTERM.
	startTimeout = 2 * time.Minute
	stopTimeout  = 20 * time.Second
	// pollInterval is how often a wait asks again.
	pollInterval = 100 * time.Millisecond
)

// Options tune a Cluster. The zero value prints progress on standard
// error. (Pods always get the bridge network of bridgeConfList.)
type Options struct {
	// Progress receives a line per startup step and at shutdown; nil
	// means standard error.
	Progress io.Writer
	// Workers, when not zero, is how many worker nodes the cluster has,
	// each in namespaces of its own with its own address (nodes.go), and
	// no node beside the control plane. Zero is the single node.
	Workers int
	// ControlPlaneOnly starts the control plane alone: no node, no
	// containerd, no kubelet. The Nodes are then someone else's: KWOK's
	// controller (deploy/e2e/kwok), which fakes nodes no kubelet runs.
	// Workers must be zero.
	ControlPlaneOnly bool
	// Flags are more flags of a control plane component, by its name
	// (kube-scheduler, kube-controller-manager, kube-apiserver): the
	// scale benchmark lifts the scheduler's client rate limits, as
	// scheduler_perf does. None by default.
	Flags map[string][]string
	// FeatureGates are set on every component of the cluster (the API
	// server, the controller manager, the scheduler and each kubelet), as
	// --feature-gates takes them: "DRAListTypeAttributes=true". None by
	// default: the release's own defaults.
	FeatureGates []string
}

// Cluster is one running Kubernetes.
type Cluster struct {
	// Dir holds everything of this cluster: state, certificates,
	// kubeconfig, logs (one per component, name.log).
	Dir string
	// Kubeconfig is an administrator's kubeconfig (group system:masters),
	// valid inside the cluster's namespaces: for the processes Start runs.
	Kubeconfig string
	// Config and Client reach the API server from the test, as
	// administrator.
	Config *rest.Config
	Client kubernetes.Interface
	// Nodes are the cluster's nodes, in the order Start made them: the
	// single node, or the workers.
	Nodes []*Node
	// Runtime, KubeletRootDir and Kubelet are the first node's (Node's
	// fields say what they are): the single node's, for the suites that
	// run on one.
	Runtime        *containerdtest.Harness
	KubeletRootDir string
	Kubelet        *Process

	progress io.Writer
	holder   *exec.Cmd // unshare, whose child is the namespace's init
	initPID  int       // the namespace's init, as the host sees it
	host     hostState
	procs    []*Process
	stopped  bool
	// workers is Options.Workers; apiAddress is the API server's
	// host:port, in the control plane's network.
	workers      int
	controlPlane bool                // Options.ControlPlaneOnly
	flags        map[string][]string // Options.Flags
	featureGates []string
	apiAddress   string
	// paths are the host's; the zero value the real ones.
	paths hostPaths
	// containers are the IDs of every pod sandbox and container the
	// cluster's containerd made, whose cgroups are the cluster's.
	containers map[string]bool
	bins       struct{ kube, etcd string }
	token      string
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.progress, "cluster: "+format+"\n", args...)
}

// Start starts the cluster for the test (and its subtests) and stops it
// when the test ends, failing the test if anything is left on the host.
// It skips under -short and, outside make, when not root or a program is
// missing (overlaytest.Missing); a failed build fails.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "runc", "nsenter")
	overlaytest.RequireProgram(t, "ip", "iproute2")
	cni := overlaytest.RequireProgram(t, "/usr/lib/cni/bridge", "containernetworking-plugins")
	began := time.Now()
	if opts.ControlPlaneOnly && opts.Workers > 0 {
		t.Fatalf("cluster: ControlPlaneOnly with %d Workers: a cluster without nodes has no workers", opts.Workers)
	}
	c := &Cluster{progress: opts.Progress, workers: opts.Workers, controlPlane: opts.ControlPlaneOnly, flags: opts.Flags, featureGates: opts.FeatureGates, apiAddress: apiServerAddress}
	if c.progress == nil {
		c.progress = os.Stderr
	}
	if c.workers > 0 {
		c.apiAddress = net.JoinHostPort(controlPlaneIP, strconv.Itoa(workersAPIPort))
	}
	c.bins.kube = programs.Need(t, programs.Kube())
	c.bins.etcd = programs.NeedBinary(t, programs.Etcd())
	// Not t.TempDir: the kubelet's plugin sockets lie below Dir, and a
	// Unix socket's path has 107 bytes.
	dir, err := os.MkdirTemp("", "k8s-")
	if err != nil {
		t.Fatal(err)
	}
	c.Dir = dir
	c.host = c.paths.read()
	// Registered first, so a start that fails half-way still stops what
	// it started, and the leftovers check runs after everything.
	t.Cleanup(func() {
		c.Stop(t)
		if left := c.Leftovers(); len(left) > 0 {
			t.Errorf("cluster: left on the host:\n%s", strings.Join(left, "\n"))
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})
	c.credentials(t)
	c.enterNamespace(t)
	c.Config = &rest.Config{
		Host:            "https://" + c.apiAddress,
		BearerToken:     c.token,
		Dial:            c.Dial,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.servingCert()},
		QPS:             50,
		Burst:           100,
	}
	if c.workers == 0 && !c.controlPlane {
		// The single node shares the control plane's namespaces, and its
		// containerd starts first, as it always has.
		n := &Node{Name: NodeName, Address: "127.0.0.1", Dir: c.Dir, KubeletRootDir: filepath.Join(c.Dir, "kubelet"), c: c, initPID: c.initPID, podSubnet: podSubnet(0)}
		c.Nodes = append(c.Nodes, n)
		n.startRuntime(t, filepath.Dir(cni))
	} else {
		c.controlPlaneNetwork(t)
	}
	// Runs before the runtimes' own end-of-test stop (cleanups run last
	// first), so the kubelets and the control plane stop before
	// containerd.
	t.Cleanup(func() { c.Stop(t) })
	c.startControlPlane(t)
	for i := 1; i <= c.workers; i++ {
		n := c.newWorker(t, i)
		c.Nodes = append(c.Nodes, n)
		n.startRuntime(t, filepath.Dir(cni))
	}
	if c.workers > 0 {
		// Again, for the workers' containerds, started since.
		t.Cleanup(func() { c.Stop(t) })
	}
	for _, n := range c.Nodes {
		n.startKubelet(t)
	}
	if c.controlPlane {
		c.logf("control plane Ready in %s, no node (Kubernetes %s); logs in %s", time.Since(began).Round(time.Millisecond), programs.KubeVersion, c.Dir)
		return c
	}
	first := c.Nodes[0]
	c.Runtime, c.KubeletRootDir, c.Kubelet = first.Runtime, first.KubeletRootDir, first.Kubelet
	if c.workers == 0 {
		c.logf("single node %s Ready in %s (Kubernetes %s); logs in %s", NodeName, time.Since(began).Round(time.Millisecond), programs.KubeVersion, c.Dir)
	} else {
		c.logf("control plane and %d worker nodes Ready in %s (Kubernetes %s); logs in %s", c.workers, time.Since(began).Round(time.Millisecond), programs.KubeVersion, c.Dir)
	}
	return c
}

// bridgeConfList is the pods' network on a node: a bridge in the node's
// own network namespace, on the node's own subnet, no masquerading
// (nothing outside the cluster is reachable).
func bridgeConfList(subnet string) string {
	return `{
  "cniVersion": "1.0.0",
  "name": "nvml-mock-sysfs-cluster",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "` + subnet + `"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`
}

// Process is a program the cluster runs in its namespaces.
type Process struct {
	// Name names it in progress lines and its log file.
	Name string
	// PID is the program's own, as the test sees it.
	PID int
	// LogFile holds what it printed.
	LogFile string
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
	ns      int // the init whose namespaces it runs in
}

// Program is what Start runs.
type Program struct {
	// Name names it in progress lines and its log file.
	Name string
	// Args is the command line; Args[0] is the program's path.
	Args []string
	// Env is added to the test's environment.
	Env []string
	// Served, when not nil, runs it in a mount namespace of its own,
	// nested in the cluster's, with the mounts Served sets up: a
	// consumer that must see a rendered overlay as a container does.
	Served *hosttest.Served
}

// Start runs a program in the control plane's namespaces until the test
// ends (or Stop): nfd-master, or, on the single node that shares them, a
// kubelet plugin or a device plugin (Node.Start runs one on a worker).
// The program sees the API server at Kubeconfig's address.
func (c *Cluster) Start(t testing.TB, p Program) *Process {
	t.Helper()
	proc := c.start(t, c.initPID, p)
	t.Cleanup(func() { proc.Stop(t) })
	return proc
}

// Run runs a client command to its end in the control plane's
// namespaces, where the API server's address is reachable, with env added
// to the test's and KUBECONFIG naming Kubeconfig: helm, as a user runs it
// against the cluster. It returns what the command printed, and an error
// naming the command when it failed.
func (c *Cluster) Run(env []string, name string, args ...string) (string, error) {
	cmd := containerdtest.Enter(c.initPID, name, args...)
	cmd.Env = append(append(os.Environ(), env...), "KUBECONFIG="+c.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w:\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// start runs p in the namespaces of the process ns (an init's PID).
func (c *Cluster) start(t testing.TB, ns int, p Program) *Process {
	t.Helper()
	args, env := p.Args, append(os.Environ(), p.Env...)
	if p.Served != nil {
		inner := p.Served.Command(args[0], args[1:]...)
		args, env = inner.Args, append(inner.Env, p.Env...)
	}
	proc := &Process{Name: p.Name, LogFile: filepath.Join(c.Dir, "logs", p.Name+".log"), exited: make(chan struct{}), ns: ns}
	if err := os.MkdirAll(filepath.Dir(proc.LogFile), 0o755); err != nil {
		t.Fatal(err)
	}
	log, err := os.OpenFile(proc.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	proc.cmd = containerdtest.Enter(ns, args[0], args[1:]...)
	proc.cmd.Env = env
	proc.cmd.Stdout, proc.cmd.Stderr = log, log
	proc.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := proc.cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("cluster: start %s: %v", p.Name, err)
	}
	go func() {
		_ = proc.cmd.Wait()
		log.Close()
		close(proc.exited)
	}()
	if proc.PID, err = containerdtest.ChildPID(proc.cmd); err != nil {
		t.Fatalf("cluster: %s: %v\n%s", p.Name, err, proc.Log())
	}
	c.procs = append(c.procs, proc)
	return proc
}

// Log is what the process printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

// LogTail is the end of Log, for a failure message.
func (p *Process) LogTail() string {
	s := p.Log()
	if len(s) > 6000 {
		s = "…" + s[len(s)-6000:]
	}
	return s
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM and waits for the exit, then SIGKILLs what is left
// of its process group. It reports a process that exited before it was
// asked to.
func (p *Process) Stop(t testing.TB) {
	if p.stopped || p.cmd == nil {
		return
	}
	p.stopped = true
	select {
	case <-p.exited:
		t.Errorf("cluster: %s exited before it was stopped (%v):\n%s", p.Name, p.cmd.ProcessState, p.LogTail())
		return
	default:
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Errorf("cluster: %s did not stop within %s of SIGTERM; killing it", p.Name, stopTimeout)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// waitFor polls ready until it holds, the process exits, or timeout; what
// is the progress line's subject.
func (c *Cluster) waitFor(t testing.TB, proc *Process, what string, timeout time.Duration, ready func() error) {
	t.Helper()
	var exited <-chan struct{}
	if proc != nil {
		exited = proc.exited
	}
	r := poll(timeout, pollInterval, exited, ready)
	switch {
	case r.last == nil:
		c.logf("%s ready in %s", what, r.took.Round(time.Millisecond))
	case r.exited:
		t.Fatalf("cluster: %s exited while starting (%v): %v\n%s", proc.Name, proc.cmd.ProcessState, r, proc.LogTail())
	default:
		msg := ""
		if proc != nil {
			msg = proc.LogTail()
		}
		t.Fatalf("cluster: %s not ready within %s: %v\n%s", what, timeout, r, msg)
	}
}

// pollResult is how a poll ended.
type pollResult struct {
	took  time.Duration
	tries int
	// last is ready's last error, nil when it held. lastState is its last
	// error that was not transient (what it saw of the object waited on),
	// kept apart so that a poll that ends on an API server's hiccup still
	// says how the object was.
	last, lastState error
	exited          bool // exited closed before ready held
}

// String says what the poll last saw, for a failure message.
func (r pollResult) String() string {
	s := fmt.Sprintf("%d tries, the last: %v", r.tries, r.last)
	if r.lastState != nil && r.lastState != r.last {
		s += fmt.Sprintf("; the last state seen: %v", r.lastState)
	}
	return s
}

// poll asks ready every interval until it returns nil, exited (when not
// nil) is closed, or timeout has passed. Every error is asked again, the
// transient ones included: an API server that restarts refuses or resets
// connections, answers 5xx or times out for seconds, and a wait must
// outlast that; only the deadline or a dead process ends it.
func poll(timeout, interval time.Duration, exited <-chan struct{}, ready func() error) pollResult {
	began := time.Now()
	deadline := began.Add(timeout)
	var r pollResult
	for {
		r.tries++
		r.last = ready()
		if r.last == nil {
			r.took = time.Since(began)
			return r
		}
		if !transient(r.last) {
			r.lastState = r.last
		}
		select {
		case <-exited:
			r.exited = true
		default:
		}
		if r.exited || !time.Now().Before(deadline) {
			r.took = time.Since(began)
			return r
		}
		time.Sleep(min(interval, time.Until(deadline)))
	}
}

// transient is whether err is the API server's (or the connection's)
// momentary failure rather than an answer about the object: a refused,
// reset or timed-out connection, a 5xx, a 429. A poll retries every error
// either way; this only sorts what its failure names.
func transient(err error) bool {
	var netErr net.Error
	var status apierrors.APIStatus
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr):
		return true
	case errors.As(err, &status):
		code := status.Status().Code
		return code >= 500 || code == http.StatusTooManyRequests || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
	}
	return false
}

// get is an HTTP GET inside the namespace's network; it wants 200.
func (c *Cluster) get(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// startControlPlane starts etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler, each once the one before it is ready.
func (c *Cluster) startControlPlane(t testing.TB) {
	t.Helper()
	plain := &http.Client{Transport: &http.Transport{DialContext: c.Dial}, Timeout: 5 * time.Second}
	etcd := c.start(t, c.initPID, Program{Name: "etcd", Args: []string{c.bins.etcd,
		"--name", "node", "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", etcdClientURL, "--advertise-client-urls", etcdClientURL,
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "node=http://127.0.0.1:2380",
		// A test's cluster survives no power loss.
		"--unsafe-no-fsync"}})
	c.waitFor(t, etcd, "etcd "+etcdClientURL, startTimeout, func() error { return c.get(plain, etcdClientURL+"/health") })

	kube := func(name string) string { return filepath.Join(c.bins.kube, name) }
	apiserver := c.start(t, c.initPID, Program{Name: "kube-apiserver", Args: append([]string{kube("kube-apiserver"),
		"--etcd-servers", etcdClientURL,
		"--bind-address", c.apiBindAddress(), "--advertise-address", c.apiHost(),
		"--secure-port", c.apiPort(),
		"--cert-dir", filepath.Join(c.Dir, "apiserver-certs"),
		"--token-auth-file", filepath.Join(c.Dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(c.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(c.Dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--endpoint-reconciler-type", "none",
		"--allow-privileged",
		"--kubelet-preferred-address-types", "InternalIP,Hostname"}, c.componentFlags("kube-apiserver")...)})
	var authed *http.Client
	c.waitFor(t, apiserver, "kube-apiserver https://"+c.apiAddress, startTimeout, func() error {
		if authed == nil {
			// The client trusts the certificate the API server makes
			// at start.
			if _, err := os.Stat(c.servingCert()); err != nil {
				return err
			}
			client, err := rest.HTTPClientFor(c.Config)
			if err != nil {
				return err
			}
			authed = client
		}
		return c.get(authed, c.Config.Host+"/readyz")
	})
	var err error
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	c.writeKubeconfig(t)

	common := []string{"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig, "--authorization-kubeconfig", c.Kubeconfig,
		"--bind-address", "127.0.0.1", "--leader-elect=false"}
	common = append(common, c.gates()...)
	cm := c.start(t, c.initPID, Program{Name: "kube-controller-manager", Args: slices.Concat([]string{kube("kube-controller-manager"),
		"--secure-port", "10257",
		"--service-account-private-key-file", filepath.Join(c.Dir, "sa.key"),
		"--root-ca-file", c.servingCert(),
		"--use-service-account-credentials=false"}, common, c.flags["kube-controller-manager"])})
	c.waitFor(t, cm, "kube-controller-manager (the default ServiceAccount)", startTimeout, func() error {
		_, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
	scheduler := c.start(t, c.initPID, Program{Name: "kube-scheduler", Args: slices.Concat([]string{kube("kube-scheduler"), "--secure-port", "10259"}, common, c.flags["kube-scheduler"])})
	insecure := &http.Client{Transport: &http.Transport{DialContext: c.Dial, TLSClientConfig: selfSigned()}, Timeout: 5 * time.Second}
	c.waitFor(t, scheduler, "kube-scheduler", startTimeout, func() error { return c.get(insecure, "https://127.0.0.1:10259/readyz") })
}

// startKubelet starts the node's kubelet on its containerd and waits
// until its Node is Ready. The single node, on loopback, then gets the
// Hostname address that /etc/hosts in the namespace resolves (the kubelet
// refuses a loopback node IP, and the API server needs an address for pod
// logs); a worker's own address is its InternalIP.
func (n *Node) startKubelet(t testing.TB) {
	t.Helper()
	c := n.c
	config := filepath.Join(n.Dir, "kubelet.yaml")
	for _, d := range []string{n.KubeletRootDir, n.manifests()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(config, []byte(n.kubeletConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	kubelet := c.start(t, n.initPID, Program{Name: n.logName("kubelet"), Args: append([]string{filepath.Join(c.bins.kube, "kubelet"),
		"--config", config, "--kubeconfig", c.Kubeconfig, "--v", "3",
		"--root-dir", n.KubeletRootDir, "--cert-dir", filepath.Join(n.KubeletRootDir, "pki"),
		"--hostname-override", n.Name, "--node-ip", n.Address}, c.gates()...)})
	c.waitFor(t, kubelet, "kubelet (Node "+n.Name+" Ready)", startTimeout, func() error {
		node, err := c.Client.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s: Ready %s: %s", n.Name, cond.Status, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", n.Name)
	})
	n.Kubelet = kubelet
	if c.workers > 0 {
		return
	}
	patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"Hostname","address":%q}]}}`, n.Name)
	if _, err := c.Client.CoreV1().Nodes().PatchStatus(context.Background(), n.Name, []byte(patch)); err != nil {
		t.Fatalf("cluster: give the node its Hostname address: %v", err)
	}
}

// componentFlags are the feature gates and Options.Flags of the
// component name.
func (c *Cluster) componentFlags(name string) []string {
	return append(c.gates(), c.flags[name]...)
}

// gates is the --feature-gates flag of Options.FeatureGates, none without.
func (c *Cluster) gates() []string {
	if len(c.featureGates) == 0 {
		return nil
	}
	return []string{"--feature-gates", strings.Join(c.featureGates, ",")}
}

// kubeletConfig is the KubeletConfiguration this machine needs
// (../shared/KUBERNETES.md): cgroup v1 allowed, no QoS cgroups, no swap
// check, no oom_score_adj below the kubelet's own (no
// CAP_SYS_RESOURCE), no iptables, no disk-pressure eviction, and its own
// API open on the node's address for the API server's log requests.
func (n *Node) kubeletConfig() string {
	return strings.Join([]string{
		"apiVersion: kubelet.config.k8s.io/v1beta1",
		"kind: KubeletConfiguration",
		"failCgroupV1: false",
		"cgroupDriver: cgroupfs",
		"cgroupsPerQOS: false",
		"enforceNodeAllocatable: []",
		"failSwapOn: false",
		"oomScoreAdj: 0",
		"makeIPTablesUtilChains: false",
		"evictionHard: {nodefs.available: \"0%\", imagefs.available: \"0%\"}",
		"imageGCHighThresholdPercent: 100",
		"resolvConf: \"\"",
		"address: " + n.Address,
		"port: " + kubeletPort,
		"readOnlyPort: 0",
		"healthzBindAddress: 127.0.0.1",
		"authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}",
		"authorization: {mode: AlwaysAllow}",
		"containerRuntimeEndpoint: unix://" + n.Runtime.Address,
		"staticPodPath: " + n.manifests(),
		"",
	}, "\n")
}

// Stop stops everything the cluster started, in the reverse order of its
// start (the test's own programs first, containerd after the kubelet, the
// namespace's init last), then removes the containers' cgroups. It runs
// when the test ends; a test that checks Leftovers calls it first.
func (c *Cluster) Stop(t testing.TB) {
	if c.stopped {
		return
	}
	c.stopped = true
	began := time.Now()
	// The workers first: their programs, their kubelets, then their
	// containerds, which remove their pods over CRI and stop, killing what
	// is left in their namespaces but their init. The control plane stops
	// after, with no pod left to hold a watch open on the API server.
	stopProcs := func(ns int) {
		for i := len(c.procs) - 1; i >= 0; i-- {
			if c.procs[i].ns == ns {
				c.procs[i].Stop(t)
			}
		}
	}
	stopRuntime := func(n *Node) {
		if n.Runtime != nil {
			c.recordContainers(t, n.Runtime)
			n.Runtime.Stop(t)
		}
	}
	for _, n := range c.Nodes {
		if n.initPID != c.initPID {
			stopProcs(n.initPID)
			stopRuntime(n)
		}
	}
	stopProcs(c.initPID)
	// The single node's containerd, started before the control plane.
	for _, n := range c.Nodes {
		if n.initPID == c.initPID {
			stopRuntime(n)
		}
	}
	// A worker's init first: the kernel kills the rest of its pid
	// namespace with it, and the control plane's init below would too.
	for _, n := range c.Nodes {
		n.stopInit()
	}
	if c.holder != nil && c.holder.Process != nil {
		// pid 1 of the namespace: the kernel kills the rest with it.
		_ = syscall.Kill(c.initPID, syscall.SIGKILL)
		_ = c.holder.Wait()
	}
	// Each nsenter ends with its program, which the kernel killed with
	// the namespace's init if nothing stopped it before.
	for _, p := range c.procs {
		select {
		case <-p.exited:
		case <-time.After(stopTimeout):
			t.Errorf("cluster: nsenter of %s (pid %d) outlived its namespace by %s", p.Name, p.cmd.Process.Pid, stopTimeout)
		}
	}
	removed, err := c.removeCgroups()
	if err != nil {
		t.Errorf("cluster: %v", err)
	}
	c.logf("stopped in %s; %d cgroups of its containers removed below %s", time.Since(began).Round(time.Millisecond), removed, podCgroup)
}

// Events lists the events of a namespace, one line each, for a failure
// message.
func (c *Cluster) Events(namespace string) string {
	list, err := c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, e := range list.Items {
		lines = append(lines, fmt.Sprintf("%s %s/%s %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
	}
	return strings.Join(lines, "\n")
}

// ProcPath is path as the control plane's namespaces (and the single
// node's) see it, from the test: /var/log/pods, say, lies in the
// namespace's private tmpfs. Node.ProcPath is a worker's.
func (c *Cluster) ProcPath(path string) string {
	return procPath(c.initPID, path)
}

func procPath(pid int, path string) string {
	return filepath.Join("/proc", strconv.Itoa(pid), "root", path)
}

// Process is the program of that name the cluster started (etcd,
// kube-apiserver, kube-scheduler, ...), nil when none: for a figure read
// from its /proc entry (its memory), by its PID.
func (c *Cluster) Process(name string) *Process {
	for _, p := range c.procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}
