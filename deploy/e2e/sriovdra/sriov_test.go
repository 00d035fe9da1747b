// Package sriovdra_test runs k8snetworkplumbingwg's DRA driver for SR-IOV
// virtual functions (its kubelet plugin, supplied as dra-driver-sriov) on
// the real single-node Kubernetes of kubetest, served serve --writable's
// view of testdata/profiles/sriov.yaml as a container with the writable CDI
// spec's mounts is: two GPUs, each beside a ConnectX-7 whose physical
// function offers 8 virtual functions. A write of sriov_numvfs through the
// view makes the VFs; the plugin, which discovers devices once, at its
// start, runs before the write and after it, and the suite judges what it
// published in ResourceSlices by oracles of its own: each VF where the
// kernel puts it (its physical function's routing ID, the First VF Offset
// and the VF Stride: vfAddress), with the root complex and NUMA node the
// profile gives the HCA's GPU (profilefacts); never the product's planner.
//
// The plugin keeps a physical function only if it finds the function's
// network interface, a directory under <PF>/net, which the tree does not
// render. Served the tree as it is, its scan reaches every VF the write
// made and it publishes none: the rows say so in its own words. Given a
// stand-in interface directory under each PF (an overlay in the plugin's
// own mount namespace, nothing else changed), it publishes every VF with
// its address and the pcieRoot of its HCA's GPU. Before the write it
// publishes none: the negative control, on which the VF check must fail.
package sriovdra_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

func TestMain(m *testing.M) {
	// The cluster's directory (kubetest's Dir) goes where TMPDIR says;
	// Main makes that a directory below /dev/shm when TMPDIR is unset.
	// There, the plugin's socket, <Dir>/kubelet/plugins/<its 36-byte
	// driver name>/dra.sock, would be longer than a Unix socket's path may
	// be (107 bytes).
	if os.Getenv("TMPDIR") == "" {
		os.Setenv("TMPDIR", os.TempDir())
	}
	os.Exit(hosttest.MainAlone(m))
}

const (
	// driverName is the driver's, its ResourceSlices' and the prefix of
	// its own attributes.
	driverName = "sriovnetwork.k8snetworkplumbingwg.io"
	// policyGroup is the API group of its SriovResourcePolicy and
	// DeviceAttributes kinds, which its controller watches.
	policyGroup = "sriovnetwork.k8snetworkplumbingwg.io/v1alpha1"
	// policyNamespace is where it watches policies (its --namespace's
	// default).
	policyNamespace = "dra-driver-sriov"
	// pciBusIDAttribute is the standard attribute of a device's address.
	pciBusIDAttribute = "resource.kubernetes.io/pciBusID"
	// numaAttribute is the driver's NUMA node attribute (dranet's name).
	numaAttribute = "dra.net/numaNode"
	sriovProfile  = "testdata/profiles/sriov.yaml"
	waitTimeout   = 2 * time.Minute
)

// The rows, in the order they run.
const (
	rowBeforeServed  = "before the write, the tree as served"
	rowBeforeStandIn = "before the write, a stand-in netdev under each PF"
	rowWrite         = "sriov_numvfs written through the view"
	rowAfterServed   = "after the write, the tree as served"
	rowAfterStandIn  = "after the write, a stand-in netdev under each PF"
	rowRemoved       = "sriov_numvfs 0, a stand-in netdev under each PF"
	rowLeftovers     = "after the suite"
)

// rows are the rows a supplied plugin runs, each with what it must show.
func rows() [][2]string {
	return [][2]string{
		{rowBeforeServed, "no device in ResourceSlices; the plugin skips each PF, which has no netdev"},
		{rowBeforeStandIn, "no device in ResourceSlices, each PF found with 0 VFs and its GPU's pcieRoot; the VF check fails here (negative control)"},
		{rowWrite, "sriov_totalvfs VFs on each HCA, where the kernel's offset/stride rule puts them; the read-only tree refuses the write"},
		{rowAfterServed, "the plugin's scan reaches every VF the write made; it publishes none: its PF has no netdev"},
		{rowAfterStandIn, "every VF in ResourceSlices: pciBusID by the kernel's offset/stride rule, its PF, the pcieRoot and NUMA node the profile gives the HCA's GPU"},
		{rowRemoved, "no device in ResourceSlices, each PF found with 0 VFs"},
	}
}

// suite is the node, the view and what the rows share.
type suite struct {
	c      *kubetest.Cluster
	plugin string
	bin    string
	file   string // the profile
	facts  *profilefacts.Profile
	// pfs are the HCAs' physical functions the view shows, judged
	// against the profile (findPFs).
	pfs []physFn
	// mounts are serve --writable's spec's.
	mounts  []*specs.Mount
	rows    docmatrix.Rows
	details []string
	objects string
	runs    int
	// sabotage is programs.Sabotage's: the plugin is served nothing.
	sabotage string
}

// TestSRIOVDRA: the plugin publishes the VFs a write of sriov_numvfs made,
// each with its PF's pcieRoot, where it finds the PF's netdev; none before
// the write; and says why it publishes none on the tree as served.
func TestSRIOVDRA(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "nsenter")
	began := time.Now()
	plugin, ok := programs.NeedSupplied(t, programs.DRADriverSRIOV)
	if !ok {
		var rs docmatrix.Rows
		for _, r := range rows() {
			t.Run(r[0], func(t *testing.T) {
				rs.Expect(t, r[0], "")
				rs.NotRun(t, programs.NotRun(t.Name(), programs.DRADriverSRIOV))
			})
		}
		kubetest.AppendMatrix(t, title+rs.Table("check", "result"))
		return
	}
	overlaytest.RequireFUSE(t)
	// The plugin lists devices with ghw, whose PCI database must be there.
	if _, err := os.Stat(programs.HostPCIIDs); err != nil {
		overlaytest.Missing(t, "%s is missing (Debian package pci.ids, which pciutils pulls in; make deps installs it): %v", programs.HostPCIIDs, err)
	}
	s := &suite{plugin: plugin, bin: hosttest.BuildBinary(t), file: filepath.Join(overlaytest.Repo(t), sriovProfile), sabotage: programs.Sabotage(t)}
	// The matrix is written however the suite ends, each row a failure
	// stopped it before red (docmatrix.Rows.Unreached).
	t.Cleanup(func() {
		var all [][]string
		for _, r := range append(rows(), [2]string{rowLeftovers, ""}) {
			all = append(all, r[:])
		}
		s.rows.Unreached("the suite stopped before this row (its log says where)", all...)
		text := title + s.rows.Table("check", "result") + "\n" + strings.Join(s.details, "\n") +
			fmt.Sprintf("\n\nin %s; the ResourceSlices judged are in %s\n", time.Since(began).Round(time.Second), s.objects)
		t.Logf("\n%s", text)
		kubetest.AppendMatrix(t, text)
	})
	var err error
	s.facts, err = profilefacts.Read(s.file)
	require.NoError(t, err)
	require.True(t, s.facts.HCAs, "%s has HCAs", sriovProfile)
	require.NotZero(t, s.facts.TotalVFs, "%s: infiniband.sriov_totalvfs", sriovProfile)

	s.c = kubetest.Start(t, kubetest.Options{})
	s.objects = kubetest.ObjectsDir(t, "sriovdra")
	s.startServe(t)
	s.findPFs(t)
	s.installPolicy(t)
	t.Logf("node, writable view and policy ready in %s", time.Since(began).Round(time.Second))

	n := s.facts.TotalVFs
	s.check(t, rowBeforeServed, func(t *testing.T) string {
		devices, log := s.runPlugin(t, "before-served", false)
		require.Empty(t, devices, "no VF exists yet")
		require.Empty(t, field(lines(log, "Skipping VF device"), "address"), "no VF exists yet")
		return "0 devices; " + s.pfsSkipped(t, log)
	})
	s.check(t, rowBeforeStandIn, func(t *testing.T) string {
		devices, log := s.runPlugin(t, "before-stand-in", true)
		require.Empty(t, devices, "no VF exists yet")
		pfs := s.pfsFound(t, log, 0)
		// The negative control: the check of the VFs, on what was
		// published before they exist, must fail.
		miss := s.judgeVFs(devices, n, true)
		require.Error(t, miss, "the VF check passed with no VF published: it cannot fail")
		return fmt.Sprintf("0 devices; %s; the VF check: %v", pfs, firstLine(miss))
	})
	s.check(t, rowWrite, func(t *testing.T) string {
		got := s.write(t, n)
		ro := s.readOnlyWrite(t, n)
		return fmt.Sprintf("%s; read-only tree: %s", got, ro)
	})
	s.check(t, rowAfterServed, func(t *testing.T) string {
		devices, log := s.runPlugin(t, "after-served", false)
		want := s.vfAddresses(n)
		seen := field(lines(log, "Skipping VF device"), "address")
		slices.Sort(seen)
		require.Equal(t, want, seen, "the plugin's scan (ghw) reaches every VF the write made and knows it for a VF (physfn)")
		if len(devices) > 0 {
			// A tree that gives the PF a netdev: the VFs, judged.
			require.NoError(t, s.judgeVFs(devices, n, false))
			return fmt.Sprintf("its scan reached the %d VFs; %d published, each as judged", len(seen), len(devices))
		}
		return fmt.Sprintf("its scan reached the %d VFs, 0 devices published; %s", len(seen), s.pfsSkipped(t, log))
	})
	s.check(t, rowAfterStandIn, func(t *testing.T) string {
		devices, log := s.runPlugin(t, "after-stand-in", true)
		require.NoError(t, s.judgeVFs(devices, n, true))
		pfs := s.pfsFound(t, log, n)
		return fmt.Sprintf("%s; %s; %s", s.publishedVFs(devices), pfs, s.standInLimits(log, devices))
	})
	s.check(t, rowRemoved, func(t *testing.T) string {
		got := s.write(t, 0)
		devices, log := s.runPlugin(t, "removed-stand-in", true)
		require.Empty(t, devices, "0 removed the VFs")
		return fmt.Sprintf("%s; 0 devices; %s", got, s.pfsFound(t, log, 0))
	})

	s.c.Stop(t)
	t.Run("nothing is left on the host", func(t *testing.T) {
		s.rows.Expect(t, rowLeftovers, "nothing on the host")
		require.Empty(t, s.c.Leftovers())
	})
}

const title = "TestSRIOVDRA (deploy/e2e/sriovdra): dra-driver-sriov on a real node, serve --writable (" + sriovProfile + ")\n\n"

// check runs a row as a subtest; f returns its detail.
func (s *suite) check(t *testing.T, row string, f func(t *testing.T) string) {
	want := ""
	for _, r := range rows() {
		if r[0] == row {
			want = r[1]
		}
	}
	t.Run(row, func(t *testing.T) {
		s.rows.Expect(t, row, want)
		detail := f(t)
		s.details = append(s.details, "- "+row+": "+detail)
		t.Logf("detail: %s", detail)
	})
}

// nodeDir is where the node's trees go: below the cluster's private /run
// (a tmpfs of its mount namespace, gone with it), as the chart keeps the
// writable tree in memory. Not below the test's TMPDIR (/dev/shm): a
// served namespace mounts its own tmpfs there before it takes the spec's
// sources.
const nodeDir = "/run/nvml-mock-sysfs"

// startServe runs serve --writable in the cluster's namespaces, as the
// chart's writable DaemonSet runs it on a node, until its spec is written
// (once the view is mounted); the plugin and the writers get the spec's
// mounts from there.
func (s *suite) startServe(t *testing.T) {
	t.Helper()
	spec := filepath.Join(t.TempDir(), "spec.json")
	proc := s.c.Start(t, kubetest.Program{Name: "serve-writable", Args: []string{s.bin, "serve", "--writable",
		"--writable-tree", nodeDir + "/tree", "--profile", s.file, "--root", nodeDir + "/root",
		"--output", spec, "--listen", "127.0.0.1:0", "--no-watch"}})
	s.c.Wait(t, "serve --writable wrote its spec", waitTimeout, func() error {
		select {
		case <-proc.Exited():
			t.Fatalf("serve --writable exited:\n%s", proc.LogTail())
		default:
		}
		_, err := os.Stat(spec)
		return err
	})
	s.mounts = readMounts(t, spec)
}

// shell runs a shell script in a container of mounts on the node: in a
// private mount namespace made from the cluster's (where serve mounted the
// view), with the spec's mounts as runc applies them, and in the cluster's
// network and pid namespaces, as the kubelet's containers are. It returns
// what the script printed, and an error with it when it failed.
func (s *suite) shell(mounts []*specs.Mount, script string) (string, error) {
	cmd := hosttest.Served{Spec: mounts}.Command("sh", "-ec", script)
	return s.c.Run(nil, cmd.Args[0], cmd.Args[1:]...)
}

// readMounts are the mounts of a spec of our one device.
func readMounts(t *testing.T, file string) []*specs.Mount {
	t.Helper()
	sp, err := cdispec.ReadSpec(file)
	require.NoError(t, err)
	require.Len(t, sp.Devices, 1)
	return sp.Devices[0].ContainerEdits.Mounts
}

// installPolicy installs the driver's two kinds (CRDs of this suite's own,
// with no schema: the driver's chart has the real ones) and a policy that
// advertises every Mellanox VF on every node. The plugin advertises only
// what a policy selects.
func (s *suite) installPolicy(t *testing.T) {
	t.Helper()
	var crds []string
	for _, k := range [][2]string{{"SriovResourcePolicy", "sriovresourcepolicies"}, {"DeviceAttributes", "deviceattributes"}} {
		group, version, _ := strings.Cut(policyGroup, "/")
		crds = append(crds, fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[2]s.%[3]s
spec:
  group: %[3]s
  scope: Namespaced
  names: {kind: %[1]s, listKind: %[1]sList, plural: %[2]s, singular: %[5]s}
  versions:
  - name: %[4]s
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, k[0], k[1], group, version, strings.ToLower(k[0])))
	}
	s.c.ApplyYAML(t, "the driver's CRDs", []byte(strings.Join(crds, "---\n")))
	s.c.Wait(t, "the driver's kinds served", waitTimeout, func() error {
		list, err := s.c.Client.Discovery().ServerResourcesForGroupVersion(policyGroup)
		if err != nil {
			return err
		}
		if len(list.APIResources) < 2 {
			return fmt.Errorf("%d kinds of %s served", len(list.APIResources), policyGroup)
		}
		return nil
	})
	s.c.ApplyYAML(t, "the policy", []byte(`apiVersion: v1
kind: Namespace
metadata:
  name: `+policyNamespace+`
---
apiVersion: `+policyGroup+`
kind: SriovResourcePolicy
metadata:
  name: mellanox-vfs
  namespace: `+policyNamespace+`
spec:
  configs:
  - resourceFilters:
    - vendors: ["15b3"]
`))
}

// runPlugin runs the plugin, served the view's mounts (and, with standIn,
// a netdev directory under each PF), until it has resolved its policy
// and the ResourceSlices hold what it advertises; it returns those devices
// and its log, and stops it, leaving the node as before (no registration,
// no slice, no checkpoint).
func (s *suite) runPlugin(t *testing.T, name string, standIn bool) ([]resourcev1.Device, string) {
	t.Helper()
	kubelet := s.c.KubeletRootDir
	args := []string{s.plugin, "--node-name", kubetest.NodeName, "--kubeconfig", s.c.Kubeconfig,
		"--cdi-root", s.c.Runtime.CDIDir,
		"--kubelet-registrar-directory-path", filepath.Join(kubelet, "plugins_registry"),
		"--kubelet-plugins-directory-path", filepath.Join(kubelet, "plugins"),
		// MULTUS leaves out its NRI plugin (STANDALONE's), which would
		// need containerd's NRI socket; discovery and publishing are the
		// same in both modes.
		"--configuration-mode", "MULTUS",
		// 4: the reason it gives for skipping a PF (host.go) is logged at 4.
		"-v", "4"}
	if standIn {
		args = append([]string{"sh", "-c", s.standIn(), "sh"}, args...)
	}
	mounts := s.mounts
	if s.sabotage != "" {
		// serve --writable serves the view it renders, never an escaped
		// copy, so both sabotages serve the plugin nothing: the node's own
		// /sys, where no PF of the profile is, and every row the plugin
		// judges turns red. The writes (rowWrite) judge the view itself,
		// as the writers get it, and stay green.
		mounts = nil
	}
	s.runs++
	proc := s.c.Start(t, kubetest.Program{Name: fmt.Sprintf("dra-driver-sriov-%d-%s", s.runs, name), Args: args,
		Served: &hosttest.Served{Spec: mounts}})
	defer s.stopPlugin(t, proc)

	matching := -1
	s.c.Wait(t, name+": the plugin resolved its policy", waitTimeout, func() error {
		select {
		case <-proc.Exited():
			t.Fatalf("the plugin exited:\n%s", proc.LogTail())
		default:
		}
		resolved := lines(proc.Log(), "Policy devices resolved")
		if len(resolved) == 0 {
			return fmt.Errorf("no policy resolved in its log yet")
		}
		var err error
		matching, err = strconv.Atoi(value(resolved[len(resolved)-1], "matchingDevices"))
		return err
	})
	var devices []resourcev1.Device
	var list *resourcev1.ResourceSliceList
	s.c.Wait(t, fmt.Sprintf("%s: ResourceSlices with the %d devices it advertises", name, matching), waitTimeout, func() error {
		var err error
		list, err = s.c.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
		if err != nil {
			return err
		}
		devices = devices[:0]
		for _, sl := range list.Items {
			devices = append(devices, sl.Spec.Devices...)
		}
		switch {
		case len(list.Items) == 0:
			return fmt.Errorf("no ResourceSlice of %s", driverName)
		case len(devices) != matching:
			return fmt.Errorf("%d devices in %d slices, want %d", len(devices), len(list.Items), matching)
		}
		return nil
	})
	s.c.Wait(t, name+": the kubelet registered the plugin", waitTimeout, func() error {
		if n, err := s.c.Nodes[0].Registrations(context.Background(), driverName); err != nil || n != 1 {
			return fmt.Errorf("the kubelet holds %d registrations of %s (%v)", n, driverName, err)
		}
		return nil
	})
	kubetest.WriteObject(t, s.objects, fmt.Sprintf("%d-%s-resourceslices.json", s.runs, name), list)
	log := proc.Log()
	t.Logf("the plugin's discovery:\n%s", strings.Join(discovery(log), "\n"))
	return devices, log
}

// stopPlugin stops the plugin and removes its slices and its state, so
// that the next starts clean.
func (s *suite) stopPlugin(t *testing.T, proc *kubetest.Process) {
	t.Helper()
	proc.Stop(t)
	s.c.Unpublish(t, driverName, waitTimeout)
}

// standIn is the shell that gives each PF a netdev directory, net/ibN (the
// kernel's name of the N-th IPoIB interface), before it runs the plugin:
// a read-only overlay of a directory holding net/ibN over the PF's
// directory in the view, in the plugin's mount namespace only, on a tmpfs
// of its own there. The view is bound aside first: an overlay's lowerdir
// cannot hold the colons of a PCI address.
func (s *suite) standIn() string {
	lines := []string{"set -eu", "mount -t tmpfs -o mode=0755 tmpfs /dev/shm"}
	for i, pf := range s.pfs {
		dir := fmt.Sprintf("/dev/shm/stand-in/%d", i)
		lines = append(lines,
			fmt.Sprintf("d=$(readlink -f /sys/bus/pci/devices/%s)", pf.addr),
			fmt.Sprintf("mkdir -p %[1]s/netdev/net/%[2]s %[1]s/pf", dir, standInName(i)),
			fmt.Sprintf(`mount --bind "$d" %s/pf`, dir),
			fmt.Sprintf(`mount -t overlay -o ro,lowerdir=%[1]s/netdev:%[1]s/pf overlay "$d"`, dir))
	}
	return strings.Join(append(lines, `exec "$@"`), "\n")
}

// standInName is the stand-in netdev of the i-th HCA.
func standInName(i int) string { return "ib" + strconv.Itoa(i) }

// write writes n to every HCA's sriov_numvfs through the view, as a
// container with the writable spec's mounts does, and requires each PF's
// virtfnN links to name vfAddress(PF, N), N < n. It returns what it saw.
func (s *suite) write(t *testing.T, n int) string {
	t.Helper()
	var script []string
	for _, p := range s.pfs {
		pf := p.addr.String()
		script = append(script,
			fmt.Sprintf("echo %d > /sys/bus/pci/devices/%s/sriov_numvfs", n, pf),
			fmt.Sprintf(`for l in /sys/bus/pci/devices/%[1]s/virtfn*; do if [ -L "$l" ]; then echo %[1]s "${l##*/}" "$(readlink "$l")"; fi; done`, pf))
	}
	out, err := s.shell(s.mounts, strings.Join(script, "\n"))
	require.NoError(t, err, "write sriov_numvfs %d through the view", n)
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			i, err := strconv.Atoi(strings.TrimPrefix(f[1], "virtfn"))
			require.NoError(t, err, "%q", line)
			vfs := got[f[0]]
			for len(vfs) <= i {
				vfs = append(vfs, "")
			}
			vfs[i] = filepath.Base(f[2])
			got[f[0]] = vfs
		}
	}
	var said []string
	for _, p := range s.pfs {
		pf := p.addr
		var want []string
		for i := range n {
			want = append(want, vfAddress(pf, vfOffset, vfStride, i).String())
		}
		require.Equal(t, want, got[pf.String()], "%s's virtfnN after writing %d", pf, n)
		if n == 0 {
			said = append(said, fmt.Sprintf("%s: no virtfn", pf))
		} else {
			said = append(said, fmt.Sprintf("%s: virtfn0-%d -> %s-%s", pf, n-1, want[0], want[n-1]))
		}
	}
	return fmt.Sprintf("wrote %d to each sriov_numvfs; %s", n, strings.Join(said, ", "))
}

// readOnlyWrite is the write against the default mode's read-only tree,
// rendered on the node, and its spec's read-only mounts: it must be
// refused. It returns the refusal.
func (s *suite) readOnlyWrite(t *testing.T, n int) string {
	t.Helper()
	root, spec := nodeDir+"/read-only", filepath.Join(t.TempDir(), "read-only.json")
	_, err := s.c.Run(nil, s.bin, "render", "--root", root, "--profile", s.file)
	require.NoError(t, err)
	_, err = s.c.Run(nil, s.bin, "cdi", "--root", root, "--output", spec)
	require.NoError(t, err)
	pf := s.pfs[0].addr.String()
	out, err := s.shell(readMounts(t, spec), fmt.Sprintf("echo %d > /sys/bus/pci/devices/%s/sriov_numvfs", n, pf))
	require.Error(t, err, "the read-only tree took a write of sriov_numvfs")
	require.Contains(t, out, "Read-only file system")
	return strings.TrimSpace(out)
}

// vfAddresses are the addresses of the first n VFs of every HCA, sorted.
func (s *suite) vfAddresses(n int) []string {
	var out []string
	for _, pf := range s.pfs {
		for i := range n {
			out = append(out, vfAddress(pf.addr, vfOffset, vfStride, i).String())
		}
	}
	slices.Sort(out)
	return out
}

// pfsSkipped requires the plugin to have skipped every PF for want of its
// netdev and returns its reasons, in its own words.
func (s *suite) pfsSkipped(t *testing.T, log string) string {
	t.Helper()
	skipped := field(lines(log, "Unable to get interface name for device, skipping"), "address")
	var reasons []string
	for _, p := range s.pfs {
		pf := p.addr.String()
		require.Contains(t, skipped, pf, "the plugin skips PF %s for want of its netdev", pf)
		why := ""
		for _, l := range lines(log, "failed to get PF interface name") {
			if value(l, "pciAddr") == pf {
				why = value(l, "err")
			}
		}
		require.Contains(t, why, pf+"/net", "the plugin's reason for %s", pf)
		reasons = append(reasons, why)
	}
	return fmt.Sprintf(`the plugin: "Unable to get interface name for device, skipping" for %s: %s`,
		strings.Join(field(lines(log, "Unable to get interface name for device, skipping"), "address"), ", "),
		strings.Join(reasons, "; "))
}

// pfsFound requires the plugin, given the stand-in netdevs, to have found
// every PF with its stand-in name, the root complex the profile gives its
// GPU as pcieRoot, and vfs VFs; it returns what it found.
func (s *suite) pfsFound(t *testing.T, log string, vfs int) string {
	t.Helper()
	found := map[string]string{}
	for _, l := range lines(log, "Found SR-IOV PF device") {
		found[value(l, "address")] = l
	}
	counts := map[string]string{}
	for _, l := range lines(log, "Found VFs for PF") {
		counts[value(l, "pf")] = value(l, "vfCount")
	}
	var said []string
	for i, p := range s.pfs {
		pf, name := p.addr.String(), standInName(i)
		l, ok := found[pf]
		require.True(t, ok, "the plugin found no PF %s; its discovery:\n%s", pf, strings.Join(discovery(log), "\n"))
		require.Equal(t, name, value(l, "interface"), "PF %s's netdev", pf)
		require.Equal(t, p.root, value(l, "pcieRoot"), "PF %s's pcieRoot: its GPU's root complex, by the profile", pf)
		require.Equal(t, strconv.Itoa(vfs), counts[name], "VFs of PF %s (%s)", pf, name)
		said = append(said, fmt.Sprintf("PF %s (%s) pcieRoot %s, %s VFs", pf, name, value(l, "pcieRoot"), counts[name]))
	}
	return strings.Join(said, ", ")
}

// judgeVFs says what is wrong with devices as the first n VFs of every
// HCA, each its own device: the address the kernel's rule gives it
// (vfAddress), its VF index, its PF's address (and, standIn, the stand-in
// netdev's name), the root complex and NUMA node the profile gives the
// HCA's GPU, the vendor's and the ConnectX's device ids; and no other
// device. nil when every one is as it must be.
func (s *suite) judgeVFs(devices []resourcev1.Device, n int, standIn bool) error {
	byName := map[string]resourcev1.Device{}
	for _, d := range devices {
		byName[d.Name] = d
	}
	var wrong []string
	listed := 0
	pfDevice, err := s.facts.HCADevice()
	if err != nil {
		return err
	}
	for i, p := range s.pfs {
		pf := p.addr
		for k := range n {
			a := vfAddress(pf, vfOffset, vfStride, k)
			name := strings.NewReplacer(":", "-", ".", "-").Replace(a.String())
			d, ok := byName[name]
			if !ok {
				wrong = append(wrong, fmt.Sprintf("VF %s (%s) not published", a, name))
				continue
			}
			delete(byName, name)
			listed++
			want := map[string]string{
				pciBusIDAttribute:            a.String(),
				driverName + "/pciAddress":   a.String(),
				driverName + "/vfID":         strconv.Itoa(k),
				driverName + "/pfPciAddress": pf.String(),
				programs.PCIeRootAttribute:   p.root,
				numaAttribute:                strconv.Itoa(p.numa),
				driverName + "/vendor":       fmt.Sprintf("%04x", mellanox),
				driverName + "/deviceID":     fmt.Sprintf("%04x", connectXVF),
				driverName + "/pfDeviceID":   fmt.Sprintf("%04x", pfDevice),
				"k8s.cni.cncf.io/deviceID":   a.String(),
			}
			if standIn {
				want[driverName+"/PFName"] = standInName(i)
			}
			for _, attr := range slices.Sorted(maps.Keys(want)) {
				if got := attribute(d, attr); got != want[attr] {
					wrong = append(wrong, fmt.Sprintf("VF %s: %s %s, want %s", a, attr, got, want[attr]))
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		wrong = append(wrong, fmt.Sprintf("device %s is no VF the write made", name))
	}
	if len(wrong) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d VFs published: %s", listed, n*len(s.pfs), strings.Join(wrong, "; "))
}

// publishedVFs says which VFs the slices hold, by PF: their addresses and
// the attributes judged.
func (s *suite) publishedVFs(devices []resourcev1.Device) string {
	var said []string
	for _, p := range s.pfs {
		var vfs []string
		root, numa := "", ""
		for _, d := range devices {
			if attribute(d, driverName+"/pfPciAddress") == p.addr.String() {
				vfs = append(vfs, attribute(d, pciBusIDAttribute))
				root, numa = attribute(d, programs.PCIeRootAttribute), attribute(d, numaAttribute)
			}
		}
		slices.Sort(vfs)
		if len(vfs) > 0 {
			said = append(said, fmt.Sprintf("%d VFs of %s (%s-%s) with pcieRoot %s (its GPU %s's root complex), numaNode %s",
				len(vfs), p.addr, vfs[0], vfs[len(vfs)-1], root, strings.Join(p.gpus, ", "), numa))
		}
	}
	return fmt.Sprintf("%d devices: %s", len(devices), strings.Join(said, "; "))
}

// standInLimits says what else the plugin could not read from the mock
// node (nothing it needs to publish): the interface's link type, the
// eswitch mode over devlink, RDMA.
func (s *suite) standInLimits(log string, devices []resourcev1.Device) string {
	var said []string
	if ls := lines(log, "Failed to get link type"); len(ls) > 0 {
		said = append(said, fmt.Sprintf("linkType %q (the plugin: %q)", attribute(devices[0], driverName+"/linkType"), value(ls[0], "err")))
	}
	if ls := lines(log, "devlink eswitch query not supported, assuming legacy"); len(ls) > 0 {
		said = append(said, fmt.Sprintf("EswitchMode %q (devlink: %q)", attribute(devices[0], driverName+"/EswitchMode"), value(ls[0], "err")))
	}
	said = append(said, fmt.Sprintf("rdmaCapable %s", attribute(devices[0], driverName+"/rdmaCapable")))
	return "not from the tree: " + strings.Join(said, ", ")
}

// attribute is a device's attribute as text, "<none>" where it has none.
// The driver's own may be published qualified or not.
func attribute(d resourcev1.Device, name string) string {
	a, ok := d.Attributes[resourcev1.QualifiedName(name)]
	if short, cut := strings.CutPrefix(name, driverName+"/"); !ok && cut {
		a, ok = d.Attributes[resourcev1.QualifiedName(short)]
	}
	switch {
	case !ok:
		return "<none>"
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return "<empty>"
}

// lines are the lines of a klog text log with the message msg.
func lines(log, msg string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `] "`+msg+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// keyValue is a klog key="quoted value" or key=value.
var keyValue = regexp.MustCompile(` ([A-Za-z]+)=("(?:[^"\\]|\\.)*"|\S+)`)

// value is key's value in a klog line, unquoted; "" when absent.
func value(line, key string) string {
	for _, m := range keyValue.FindAllStringSubmatch(line, -1) {
		if m[1] != key {
			continue
		}
		if v, err := strconv.Unquote(m[2]); err == nil {
			return v
		}
		return m[2]
	}
	return ""
}

// field is key's value in each line.
func field(ls []string, key string) []string {
	var out []string
	for _, l := range ls {
		out = append(out, value(l, key))
	}
	return out
}

// discovery are the log lines of the plugin's device discovery and policy.
func discovery(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `logger="DiscoverSriovDevices"`) && !strings.Contains(l, "non-network device") && !strings.Contains(l, "Processing PCI device") ||
			strings.Contains(l, `"failed to get PF interface name"`) || strings.Contains(l, `"Policy devices resolved"`) {
			out = append(out, l)
		}
	}
	return out
}

// firstLine is err's text up to its third clause, for a detail.
func firstLine(err error) string {
	parts := strings.SplitN(err.Error(), "; ", 3)
	if len(parts) == 3 {
		parts[2] = "…"
	}
	return strings.Join(parts, "; ")
}
