package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
)

// A cluster of workers (Options.Workers) is laid out as a small rack on
// one machine: the control plane in its namespaces (enterNamespace), on a
// bridge of its own network, and each worker in a mount, network and pid
// namespace of its own, nested in the control plane's, with a veth on that
// bridge. A worker has its own /run (so its own containerd socket and
// /var/run/cdi), /var/lib (its own /var/lib/nvml-mock-sysfs and kubelet
// directories), /var/log and /etc/hosts; its /sys/bus/pci/devices is the
// host's, which nothing of ours writes: what a container sees there is
// its CDI spec's mount. Pods get a bridge of their own on each worker, on
// the worker's own subnet, routed from the control plane.
//
// No kube-proxy runs: the `kubernetes` Service's address is an address of
// the control plane's own network, and the API server listens on the
// Service's port there, so a pod's in-cluster configuration reaches it
// unchanged, as it would through a proxy.
const (
	// controlPlaneIP is the control plane's address on the cluster's
	// bridge, clusterBridge; workerIP(i) a worker's.
	controlPlaneIP = "10.99.0.1"
	clusterBridge  = "k8s0"
	clusterPrefix  = "/24"
	// serviceIP is the `kubernetes` Service's address: the first of
	// --service-cluster-ip-range. workersAPIPort is the Service's port,
	// which the API server takes as its own.
	serviceIP      = "10.96.0.1"
	workersAPIPort = 443
	// kubeletPort is every kubelet's API port, on its node's address.
	kubeletPort = "10250"
)

// workerIP is worker i's address on the cluster's bridge (i from 1).
func workerIP(i int) string { return fmt.Sprintf("10.99.0.%d", 10+i) }

// podSubnet is node i's pod network: 0 for the single node, the worker's
// number for a worker.
func podSubnet(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// Node is one node of the cluster: its kubelet, its containerd and its
// namespaces.
type Node struct {
	// Name is the Node's name: NodeName for the single node,
	// nvml-mock-worker-<i> for worker i.
	Name string
	// Address is the node's IP in the cluster's network: its InternalIP,
	// and where its kubelet listens (127.0.0.1 for the single node).
	Address string
	// Dir holds the node's state and configuration (the cluster's own Dir
	// for the single node).
	Dir string
	// Runtime is the node's containerd; CRI's images, NRI plugins and
	// CDIDir are its.
	Runtime *containerdtest.Harness
	// KubeletRootDir is the kubelet's --root-dir: plugins_registry and
	// plugins (a DRA or CSI plugin's sockets) are below it.
	KubeletRootDir string
	// Kubelet is the kubelet's process. It logs at -v=3, which names
	// each plugin it registers and unregisters ("Registered DRA plugin").
	Kubelet *Process

	c         *Cluster
	initPID   int       // the node's namespaces' init, as the host sees it
	holder    *exec.Cmd // a worker's nsenter, whose grandchild is initPID
	podSubnet string
	pidNS     string // a worker's pid namespace, for Leftovers
}

// Start runs a program in the node's namespaces until the test ends (or
// Stop): a kubelet plugin or a device plugin that must share the node's
// kubelet directories and /var/run/cdi. Served nests it in a mount
// namespace of its own below the node's, as for Cluster.Start.
func (n *Node) Start(t testing.TB, p Program) *Process {
	t.Helper()
	p.Name = n.logName(p.Name)
	proc := n.c.start(t, n.initPID, p)
	t.Cleanup(func() { proc.Stop(t) })
	return proc
}

// StartDetached is Start for a program that outlives the (sub)test that
// starts it: it runs until its Stop or the cluster's, whichever comes
// first. A DRA plugin a suite restarts from step to step is one.
func (n *Node) StartDetached(t testing.TB, p Program) *Process {
	t.Helper()
	p.Name = n.logName(p.Name)
	return n.c.start(t, n.initPID, p)
}

// ProcPath is path as the node's namespaces see it, from the test: its
// /var/lib/nvml-mock-sysfs, say, or its /run/cdi.
func (n *Node) ProcPath(path string) string {
	if rest, ok := strings.CutPrefix(path, "/var/run/"); ok {
		// /var/run is a link to /run, which /proc/<pid>/root would
		// resolve on the host.
		path = "/run/" + rest
	}
	return procPath(n.initPID, path)
}

// logName prefixes a worker's program's name with the node's, so that
// each node's kubelet has a log of its own.
func (n *Node) logName(name string) string {
	if n.c.workers == 0 {
		return name
	}
	return n.Name + "-" + name
}

func (n *Node) manifests() string { return filepath.Join(n.Dir, "manifests") }

// startRuntime starts the node's containerd in its namespaces, with the
// pods' bridge on the node's subnet.
func (n *Node) startRuntime(t testing.TB, cniPlugins string) {
	t.Helper()
	n.Runtime = containerdtest.Start(t, containerdtest.Options{
		Progress:    n.c.progress,
		Namespace:   n.initPID,
		CNIPlugins:  cniPlugins,
		CNIConfList: bridgeConfList(n.podSubnet),
	})
	// Where a node's NRI plugins dial it, serve --nri in its DaemonSet
	// among them: its socket's directory at the node's /var/run/nri.
	out, err := containerdtest.Enter(n.initPID, "sh", "-c", `mkdir -p /run/nri && mount --bind "$1" /run/nri`, "sh", filepath.Dir(n.Runtime.NRISocket)).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster: %s's NRI socket at /var/run/nri: %v: %s", n.Name, err, out)
	}
}

// NodeNRISocket is where a pod on a node finds the runtime's NRI socket,
// as on a real node: the chart's nri.socket.
const NodeNRISocket = "/var/run/nri/nri.sock"

// apiBindAddress, apiHost and apiPort are the API server's flags: loopback
// for the single node; for workers every address of the control plane's
// network (its bridge address and the Service's), so that the serving
// certificate names controlPlaneIP (--advertise-address) and serviceIP
// (the API server adds the Service's address itself).
func (c *Cluster) apiBindAddress() string {
	if c.workers == 0 {
		return "127.0.0.1"
	}
	return "0.0.0.0"
}

func (c *Cluster) apiHost() string {
	host, _, _ := net.SplitHostPort(c.apiAddress)
	return host
}

func (c *Cluster) apiPort() string {
	_, port, _ := net.SplitHostPort(c.apiAddress)
	return port
}

// ipIn runs ip in the network namespace of the process pid, from the test.
func ipIn(pid int, args ...string) error {
	out, err := exec.Command("nsenter", append([]string{"--target", strconv.Itoa(pid), "--net", "--", "ip"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// controlPlaneNetwork gives the control plane's network the cluster's
// bridge, with the control plane's address and the Service's.
func (c *Cluster) controlPlaneNetwork(t testing.TB) {
	t.Helper()
	for _, args := range [][]string{
		{"link", "add", clusterBridge, "type", "bridge"},
		{"addr", "add", controlPlaneIP + clusterPrefix, "dev", clusterBridge},
		{"addr", "add", serviceIP + "/32", "dev", clusterBridge},
		{"link", "set", clusterBridge, "up"},
	} {
		if err := ipIn(c.initPID, args...); err != nil {
			t.Fatalf("cluster: the control plane's network: %v", err)
		}
	}
}

// newWorker makes worker i's namespaces and joins them to the cluster's
// network: a veth from the cluster's bridge to the worker's eth0, the
// worker's default route through the control plane, and the control
// plane's route to the worker's pods.
func (c *Cluster) newWorker(t testing.TB, i int) *Node {
	t.Helper()
	began := time.Now()
	n := &Node{Name: fmt.Sprintf("nvml-mock-worker-%d", i), Address: workerIP(i), Dir: filepath.Join(c.Dir, fmt.Sprintf("w%d", i)), c: c, podSubnet: podSubnet(i)}
	n.KubeletRootDir = filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(n.Dir, "namespace-ready")
	script := c.namespaceScript(t, n.hosts(t), ready, false)
	n.holder = containerdtest.Enter(c.initPID, "unshare", "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
		"sh", "-c", script)
	out := filepath.Join(n.Dir, "namespace.log")
	log, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	n.holder.Stdout, n.holder.Stderr = log, log
	n.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.holder.Start(); err != nil {
		t.Fatalf("cluster: start %s's namespaces: %v", n.Name, err)
	}
	// nsenter forks unshare into the pid namespace; unshare forks the
	// worker's init into a new one.
	unshare, err := containerdtest.ChildPID(n.holder)
	if err == nil {
		n.initPID, err = containerdtest.ChildOf(unshare)
	}
	if err != nil {
		t.Fatalf("cluster: %s's init: %v", n.Name, err)
	}
	if n.pidNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", n.initPID)); err != nil {
		t.Fatalf("cluster: %s's init: %v", n.Name, err)
	}
	waitReady(t, n.Name+"'s namespaces", ready, out, n.holder)
	veth := fmt.Sprintf("veth-w%d", i)
	steps := []struct {
		pid  int
		args []string
	}{
		{c.initPID, []string{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(n.initPID)}},
		{c.initPID, []string{"link", "set", veth, "master", clusterBridge, "up"}},
		{c.initPID, []string{"route", "add", n.podSubnet, "via", n.Address}},
		{n.initPID, []string{"addr", "add", n.Address + clusterPrefix, "dev", "eth0"}},
		{n.initPID, []string{"link", "set", "eth0", "up"}},
		{n.initPID, []string{"route", "add", "default", "via", controlPlaneIP}},
	}
	for _, s := range steps {
		if err := ipIn(s.pid, s.args...); err != nil {
			t.Fatalf("cluster: %s's network: %v", n.Name, err)
		}
	}
	c.logf("worker %s: own mount, network and pid namespace (init pid %d), address %s, pods %s, ready in %s",
		n.Name, n.initPID, n.Address, n.podSubnet, time.Since(began).Round(time.Millisecond))
	return n
}

// hosts writes the worker's /etc/hosts: its own name on loopback, as on
// the single node.
func (n *Node) hosts(t testing.TB) string {
	t.Helper()
	file := filepath.Join(n.Dir, "hosts")
	if err := os.WriteFile(file, []byte("127.0.0.1 localhost "+n.Name+"\n::1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// stopInit kills a worker's init, and with it what is left in its pid
// namespace, and waits for its nsenter.
func (n *Node) stopInit() {
	if n.holder == nil || n.holder.Process == nil {
		return
	}
	_ = syscall.Kill(n.initPID, syscall.SIGKILL)
	_ = n.holder.Wait()
	n.holder = nil
}

// RegisteredPlugins returns the registration sockets of the plugins the
// node's kubelet's plugin manager has registered (its actual state of the
// world), read from the kubelet's own API (/metrics on its port, which
// allows the cluster's anonymous reads): what the kubelet says it holds,
// not a log line's wording at some -v. The API server's node proxy would
// refuse the single node's loopback address.
func (n *Node) RegisteredPlugins(ctx context.Context) ([]string, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: n.c.Dial, TLSClientConfig: selfSigned()}}
	defer client.CloseIdleConnections()
	return kubeletPlugins(ctx, client, "https://"+net.JoinHostPort(n.Address, kubeletPort)+"/metrics")
}

// Registrations counts the registrations of the plugin named name (a DRA
// driver's name, which its registration socket's name holds) that the
// node's kubelet holds. A plugin restarted on the same socket must wait
// for 0 before it starts: the old one's late unregistration would
// otherwise make the kubelet wipe the new one's ResourceSlices.
func (n *Node) Registrations(ctx context.Context, name string) (int, error) {
	sockets, err := n.RegisteredPlugins(ctx)
	count := 0
	for _, socket := range sockets {
		if strings.Contains(filepath.Base(socket), name) {
			count++
		}
	}
	return count, err
}

// RegisteredPlugins is the first node's (Node.RegisteredPlugins).
func (c *Cluster) RegisteredPlugins(ctx context.Context) ([]string, error) {
	return c.Nodes[0].RegisteredPlugins(ctx)
}

// ShareMounts makes the node's / a shared mount, recursively, as systemd
// makes a real node's: kubetest makes the node's mount namespace with
// private propagation, where containerd refuses a pod's Bidirectional
// mount ("not a shared mount"), which stock charts' kubelet plugins ask
// for.
func (n *Node) ShareMounts(t testing.TB) {
	t.Helper()
	out, err := exec.Command("nsenter", "--target", strconv.Itoa(n.Kubelet.PID), "--mount", "--", "mount", "--make-rshared", "/").CombinedOutput()
	if err != nil {
		t.Fatalf("mount --make-rshared / in node %s's mount namespace: %v: %s", n.Name, err, out)
	}
}
