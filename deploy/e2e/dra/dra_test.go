// Package dra_test runs the NVIDIA DRA driver's kubelet plugin, the
// binary a cluster runs, on a real single-node Kubernetes
// (kubetest) for every profile of the suite set, served the mock
// sysfs as a container is, and judges from the API server's objects what
// the driver published and what the scheduler did with it: pcieRoot per
// GPU, claims aligned on one PCIe root, a claim no root can hold left
// unschedulable, and a pod that runs with its claim and the mock sysfs.
package dra_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func TestMain(m *testing.M) { os.Exit(hosttest.MainAlone(m)) }

const (
	// driverName is the DRA driver's, and its ResourceSlices'.
	driverName = "gpu.nvidia.com"
	// deviceClass selects the driver's whole GPUs.
	deviceClass = "gpu.nvidia.com"
	// pciBusIDAttribute names a device's PCI address (deviceattribute's).
	pciBusIDAttribute = "resource.kubernetes.io/pciBusID"
	// claimSpecPrefix starts the name of the CDI spec the driver writes
	// for each prepared claim (vendor k8s.gpu.nvidia.com, class claim).
	claimSpecPrefix = "k8s.gpu.nvidia.com-claim_"
	// verifyImage holds our binary and a pause program; containerd
	// resolves a short name under docker.io/library.
	verifyImage = "docker.io/library/nvml-mock-sysfs-verify:test"
	// namespace holds the suite's claims and pods.
	namespace = metav1.NamespaceDefault
	// Timeouts of the waits: the kubelet retries a failed prepare with
	// backoff (tens of seconds).
	slicesTimeout = 2 * time.Minute
	podTimeout    = 3 * time.Minute
)

// suite is what every profile shares: the node and the programs.
type suite struct {
	c                *kubetest.Cluster
	plugin, bin      string
	driverRoot, hook string
	sabotage         string
	rows             []row
	// checks are the rows of every profile's checks, the table make test's
	// sabotage suite reads.
	checks docmatrix.Rows
	// dranet is the supplied dranet, "" without it: the rows of the HCAs
	// are then not run.
	dranet string
	// driverNUMA is whether the driver's binary names the standard
	// numaNode attribute: a version that does publishes it on every GPU
	// whose numa_node the tree gives.
	driverNUMA bool
	opts       suiteOptions
}

// TestDRA runs the driver on the node for every profile of the set.
func TestDRA(t *testing.T) {
	began := time.Now()
	profiles := programs.SuiteProfiles(t)
	s := startSuite(t, profiles, suiteOptions{})
	if s == nil {
		return
	}
	for _, p := range profiles {
		t.Run(p.Name, func(t *testing.T) { s.profile(t, p) })
	}
	s.appendMatrix(t, "", began)

	// Roots that hold different numbers of GPUs are where aligning can
	// go wrong (the claim must land on a largest one): a set with no such
	// profile passing would prove that for none, silently.
	switch {
	case s.sabotage != "":
	case len(s.rows) < len(profiles):
		t.Logf("%d of %d profiles ran (-run): not judging whether the set has uneven roots", len(s.rows), len(profiles))
	case !slices.ContainsFunc(s.rows, func(r row) bool { return r.pass == "ok" && r.uneven }):
		t.Errorf("no passing profile has roots holding different numbers of GPUs: the uneven case went unproven")
	}
}

// suiteOptions are what a suite's node and drivers run with; the zero
// value is the release's defaults.
type suiteOptions struct {
	// featureGates are set on the cluster and on both drivers.
	featureGates []string
	// workers, when not zero, is how many worker nodes the cluster has
	// (kubetest.Options.Workers); zero is the single node.
	workers int
}

// driverGates is a driver's --feature-gates flag of featureGates, none
// without.
func (o suiteOptions) driverGates() []string {
	if len(o.featureGates) == 0 {
		return nil
	}
	return []string{"--feature-gates=" + strings.Join(o.featureGates, ",")}
}

// startSuite starts the node with the programs the profiles need, or, if
// the driver or nvml-mock's NVML is not supplied, reports every profile's
// rows not run and returns nil.
func startSuite(t *testing.T, profiles []programs.SuiteProfile, opts suiteOptions) *suite {
	t.Helper()
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	began := time.Now()
	plugin, mockNVML, missing := suppliedDriver(t)
	if missing != "" {
		notRunDRA(t, profiles, func(row string) string { return programs.NotRun(row, missing) })
		return nil
	}
	s := &suite{
		plugin:   plugin,
		bin:      hosttest.BuildBinary(t),
		sabotage: programs.Sabotage(t),
		opts:     opts,
	}
	s.dranet, _ = programs.NeedSupplied(t, programs.Dranet)
	var err error
	s.driverNUMA, err = programs.PublishesNUMANode(plugin)
	require.NoError(t, err, "the driver's kubelet plugin")
	dir := t.TempDir()
	s.driverRoot = filepath.Join(dir, "driver-root")
	require.NoError(t, programs.WriteDriverRoot(s.driverRoot, mockNVML), "the driver root %s", s.driverRoot)
	require.NoError(t, programs.WriteDeviceNodes(s.driverRoot, maxGPUs(t, profiles)))
	s.hook = filepath.Join(dir, "nvidia-cdi-hook")
	require.NoError(t, os.WriteFile(s.hook, []byte("#!/bin/sh\nexit 0\n"), 0o755))

	s.c = kubetest.Start(t, kubetest.Options{FeatureGates: opts.featureGates, Workers: opts.workers})
	s.c.Runtime.Import(t, ociimage.Image{
		Name: verifyImage,
		Files: []ociimage.File{
			{Path: "/nvml-mock-sysfs", Source: s.bin, Mode: 0o755},
			{Path: "/pause", Source: hosttest.BuildStatic(t, "./deploy/e2e/containerdtest/testdata/pause"), Mode: 0o755},
		},
		Entrypoint: []string{"/pause"},
	}, containerdtest.CRINamespace)
	s.c.CreateDeviceClass(t, deviceClass, `device.driver == "`+driverName+`" && device.attributes["`+driverName+`"].type == "gpu"`)
	s.createNICClasses(t)
	t.Logf("node and programs ready in %s", time.Since(began).Round(time.Second))
	return s
}

// suppliedDriver finds the driver's kubelet plugin and the directory of
// nvml-mock's NVML. No registry serves either (the stand-in serves GFD,
// not the driver): missing names the first not supplied, whose absence
// makes every row of a suite not run; "" when both are.
func suppliedDriver(t *testing.T) (plugin, mockNVML, missing string) {
	t.Helper()
	plugin, ok := programs.NeedSupplied(t, programs.GPUKubeletPlugin)
	if !ok {
		return "", "", programs.GPUKubeletPlugin
	}
	nvml, ok := programs.NeedSupplied(t, programs.MockNVML)
	if !ok {
		return "", "", programs.MockNVML
	}
	return plugin, filepath.Dir(nvml), ""
}

// appendMatrix adds the suite's matrix to the Kubernetes matrix, under a
// heading that says what it ran with (about, "" for the defaults).
func (s *suite) appendMatrix(t *testing.T, about string, began time.Time) {
	var buf bytes.Buffer
	writeMatrix(&buf, about, s.rows)
	fmt.Fprintf(&buf, "\n%d profiles on one node in %s; the API objects judged are in bin/k8s/<profile>/\n\n%s", len(s.rows), time.Since(began).Round(time.Second), s.checks.Table("profile", "check", "result"))
	kubetest.AppendMatrix(t, buf.String())
}

// notRunDRA reports every profile's rows as not run, their program
// missing, in the log (counted by make test's closing line) and the
// matrix.
func notRunDRA(t *testing.T, profiles []programs.SuiteProfile, why func(row string) string) {
	var rows docmatrix.Rows
	for _, p := range profiles {
		checks := draChecks()
		if p.Facts(t).HCAs {
			checks = append(checks, nicChecks()...)
		}
		t.Run(p.Name, func(t *testing.T) {
			for _, c := range checks {
				t.Run(c, func(t *testing.T) {
					rows.Expect(t, p.Name, c, "")
					rows.NotRun(t, why(t.Name()))
				})
			}
		})
	}
	kubetest.AppendMatrix(t, "DRA driver on a real node (gpu-kubelet-plugin, kube-scheduler "+programs.KubeVersion+"):\n\n"+rows.Table("profile", "check", "result"))
}

// draChecks are the checks of every profile, each a row (profile); a
// profile with HCAs has nicChecks too.
func draChecks() []string {
	return []string{checkEscaped, checkSlices, checkFit, checkTooMany, checkVerify, checkUnprepare, checkVerifyOptedOut, checkGPUNUMA, checkGPUNUMATooMany}
}

// The checks' names.
const (
	checkEscaped   = "escaped links"
	checkSlices    = "slices"
	checkFit       = "claim fit"
	checkTooMany   = "claim too-many"
	checkVerify    = "verify in the claim's pod"
	checkUnprepare = "unprepare"
	// checkVerifyOptedOut is checkVerify's control, in podOptedOut.
	checkVerifyOptedOut = "verify in the claim's pod, opted out"
	podOptedOut         = "fit-opted-out"
)

// maxGPUs is the most GPUs a profile of the set has: the driver root
// gets that many device nodes. All of a profile's GPUs, not only those
// NVML lists: a GPU keeps its minor number (its /dev/nvidiaN) in the
// profile NVML is served on a passthrough node (programs.NVMLProfile).
func maxGPUs(t *testing.T, profiles []programs.SuiteProfile) int {
	n := 0
	for _, p := range profiles {
		n = max(n, len(p.Facts(t).GPUs))
	}
	return n
}

// subject is one profile: its GPUs and roots, rendered.
type subject struct {
	programs.SuiteProfile
	// gpus are the GPUs NVML lists, the ones the driver can see: on a
	// passthrough node those the profile leaves on nvidia; vfio counts the
	// others, which the tree still holds (bound to vfio-pci).
	gpus []profilefacts.GPU
	vfio int
	// nvml is the profile the mock NVML serves (programs.NVMLProfile):
	// the file itself, or on a passthrough node its nvidia-bound GPUs
	// alone.
	nvml string
	// root and escaped are the overlay as rendered and with plainly
	// escaped links; served is what the plugin is served: root, or in a
	// sabotaged run escaped or nothing (""), as our spec serves too.
	root, escaped, served string
	// servedByNRI is the root serve --nri renders and serves the node's
	// pods; serving is that serve.
	servedByNRI string
	serving     *containerdtest.ServeNRI
	// perRoot counts the GPUs NVML lists under each root complex.
	perRoot map[string]int
	// facts are the profile as the wing's reader states it, with the
	// suite's literals.
	facts *profilefacts.Profile
}

// row is one profile's block of the matrix.
type row struct {
	name          string
	gpus, devices int
	vfio          int      // GPUs on vfio-pci, which NVML does not list
	roots         string   // GPUs per pcieRoot, as published
	perGPU        []string // each device's pcieRoot: "gpu-0 pci0000:00"
	uneven        bool     // the profile's roots hold different numbers of GPUs
	escapedRoots  int      // devices with pcieRoot when served escaped links
	numa          string
	// gpuNUMA is whether the driver published the standard numaNode on
	// a GPU; gpuDevices are its devices by name.
	gpuNUMA     bool
	gpuDevices  map[string]resourcev1.Device
	numaClaims  []string // the GPU claims on numaNode and what they got
	nics        *nicRow  // the HCAs, on a profile with an infiniband block
	fit, fitGot string   // the aligned claim and what it got
	tooMany     string
	tooManyGot  string
	verify      string
	unprepare   string
	optedOut    string // verify in the claim's pod opted out of serve --nri
	pass        string
}

func (s *suite) profile(t *testing.T, p programs.SuiteProfile) {
	r := row{name: p.Name, pass: "FAIL"}
	defer func() {
		if !t.Failed() {
			r.pass = "ok"
		}
		s.rows = append(s.rows, r)
	}()
	objects := kubetest.ObjectsDir(t, kubetest.Slug(p.Name))
	judged := map[string][]byte{}
	// The objects behind the profile's lines of the matrix, as the API
	// server returned them: those judged, or, for a profile that failed
	// before they were, what the API server has when it failed. A defer,
	// not a cleanup: it runs before the cleanups delete the pods and
	// claims and stop the plugin.
	defer func() {
		for _, file := range objectFiles() {
			b, ok := judged[file]
			if !ok {
				var err error
				if b, err = s.list(file); err != nil {
					t.Errorf("%s, for %s: %v", file, objects, err)
					continue
				}
			}
			kubetest.WriteObject(t, objects, file, b)
		}
	}()
	x := s.render(t, p)
	r.gpus, r.vfio = len(x.gpus), x.vfio
	// A profile that failed half-way leaves nothing to the next one.
	t.Cleanup(func() { s.removePods(t) })
	// Each check is a row of its own (s.checks) and a subtest: one that
	// fails does not stop the next, so a sabotaged run shows every row
	// the tree decides red and the others green.
	check := func(name, want string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			s.checks.Expect(t, p.Name, name, want)
			f(t)
		})
	}

	// The negative control first: plainly escaped links lose pcieRoot.
	check(checkEscaped, "no device has a pcieRoot", func(t *testing.T) {
		escaped, stop := s.publish(t, x, x.escaped, "escaped links")
		defer s.unpublish(t, stop)
		for _, d := range escaped {
			if _, ok := d.Attributes[resourcev1.QualifiedName(programs.PCIeRootAttribute)]; ok {
				r.escapedRoots++
			}
		}
		require.Zero(t, r.escapedRoots, "served plainly escaped links, the driver must publish no pcieRoot")
	})

	served := x.served
	devices, stop := s.publish(t, x, served, "the tree")
	t.Cleanup(func() { s.unpublish(t, stop) })
	r.devices = len(devices)
	r.gpuDevices = map[string]resourcev1.Device{}
	for _, d := range devices {
		r.gpuDevices[d.Name] = d
	}
	rootOf := map[string]string{}
	check(checkSlices, "a device per GPU NVML lists, each with its root complex as pcieRoot and the profile's numaNode where published", func(t *testing.T) {
		rootOf = judgeSlices(t, x, devices, s.driverNUMA, &r)
	})
	if len(x.perRoot) == 0 {
		// The profile places some GPU on no root: the claims' sizes are
		// the published roots'.
		for _, root := range rootOf {
			x.perRoot[root]++
		}
	}
	require.NotEmpty(t, x.perRoot, "the GPUs per root, for the claims' sizes")

	// dranet, beside it, before the claims: the slices judged hold both
	// drivers'.
	var hcas *hcaSubject
	var nics map[string]resourcev1.Device
	if x.facts.HCAs {
		hcas, r.nics = newHCASubject(t, x.facts), &nicRow{}
		if s.dranet == "" {
			for _, c := range nicChecks() {
				check(c, "", func(t *testing.T) { s.checks.NotRun(t, programs.NotRun(t.Name(), programs.Dranet)) })
			}
		} else {
			nics = s.publishNICs(t, x, hcas, r.nics, check)
		}
	}

	// The claims: as many GPUs as the largest root holds, aligned on one
	// root, and one more than any root holds (of the GPUs NVML lists: on
	// a passthrough node with one nvidia-bound GPU, 1 and 2, and the
	// second is more than the node has).
	counts := slices.Collect(maps.Values(x.perRoot))
	most := slices.Max(counts)
	r.uneven = slices.Min(counts) != most
	fit := s.claim(t, "fit", most)
	tooMany := s.claim(t, "too-many", most+1)
	r.fit = fmt.Sprintf("%s, one pcieRoot", count(most, "GPU"))
	r.tooMany = fmt.Sprintf("%s, one pcieRoot", count(most+1, "GPU"))
	s.verifyPod(t, "fit", fit.Name, nil)
	s.holdPod(t, "too-many", tooMany.Name)
	// Running once verify, its init container, has passed; Failed if
	// not; unschedulable where no root can hold the claim.
	s.c.WaitPod(t, namespace, "fit", podTimeout, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed || kubetest.Unschedulable(p) != ""
	})
	s.c.WaitPod(t, namespace, "too-many", podTimeout, func(p *corev1.Pod) bool { return kubetest.Unschedulable(p) != "" })

	// The objects judged, as the API server returns them.
	for _, file := range objectFiles() {
		b, err := s.list(file)
		require.NoError(t, err, "%s", file)
		judged[file] = b
	}
	recorded := map[string]func(resourcev1.Device) bool{driverName: nil}
	if nics != nil {
		recorded[nicDriver] = hcas.nodeOwn
	}
	s.recordSlices(t, p.Literal, kubetest.Slug(p.Name), judged["resourceslices.json"], recorded)
	var sl resourcev1.ResourceSliceList
	require.NoError(t, json.Unmarshal(judged["resourceslices.json"], &sl), "resourceslices.json")
	var gpuSlices []resourcev1.ResourceSlice
	for _, item := range sl.Items {
		if item.Spec.Driver == driverName {
			gpuSlices = append(gpuSlices, item)
		}
	}
	require.Len(t, devicesOf(gpuSlices), len(devices), "the slices judged hold the devices published")
	var claims resourcev1.ResourceClaimList
	require.NoError(t, json.Unmarshal(judged["resourceclaims.json"], &claims), "resourceclaims.json")
	var pods corev1.PodList
	require.NoError(t, json.Unmarshal(judged["pods.json"], &pods), "pods.json")
	got := map[string]*resourcev1.ResourceClaim{}
	for i := range claims.Items {
		got[claims.Items[i].Name] = &claims.Items[i]
	}
	podNamed := map[string]*corev1.Pod{}
	for i := range pods.Items {
		podNamed[pods.Items[i].Name] = &pods.Items[i]
	}

	check(checkFit, fmt.Sprintf("%s allocated on one pcieRoot, a largest", count(most, "GPU")), func(t *testing.T) {
		fitClaim := got["fit"]
		require.NotNil(t, fitClaim, "claim fit")
		require.NotNil(t, fitClaim.Status.Allocation, "claim fit is allocated (pod fit: %s)", kubetest.Unschedulable(podNamed["fit"]))
		var allocated []string
		roots := map[string]bool{}
		for _, res := range fitClaim.Status.Allocation.Devices.Results {
			require.Equal(t, driverName, res.Driver)
			allocated = append(allocated, res.Device)
			roots[rootOf[res.Device]] = true
		}
		slices.SortFunc(allocated, byDeviceName)
		require.Len(t, allocated, most, "claim fit's devices")
		// One root holding all most devices is the root that can hold
		// the claim; on an uneven profile, a root of the largest size.
		require.Len(t, roots, 1, "claim fit's devices %v share one pcieRoot: %v", allocated, roots)
		root := slices.Collect(maps.Keys(roots))[0]
		require.NotEmpty(t, root, "claim fit's devices have a pcieRoot")
		r.fitGot = fmt.Sprintf("%s on %s (holds %d)", strings.Join(allocated, ","), root, x.perRoot[root])
		if r.uneven {
			r.fitGot += "; roots uneven, it took a largest"
		}
	})
	check(checkTooMany, "pending, with the scheduler's reason", func(t *testing.T) {
		tm := got["too-many"]
		require.NotNil(t, tm, "claim too-many")
		require.Nil(t, tm.Status.Allocation, "claim too-many must not be allocated")
		require.Contains(t, podNamed, "too-many")
		reason := kubetest.Unschedulable(podNamed["too-many"])
		require.Contains(t, reason, kubetest.DRAUnschedulable, "the scheduler's reason")
		r.tooManyGot = "Unschedulable: " + reason
		if len(x.perRoot) == 1 {
			r.tooManyGot += " (one root: more than the node has)"
		}
	})

	// The pod that used the claim: verify ran in it, with the claim's
	// devices from the driver's CDI spec and the mock sysfs from ours.
	spec := ""
	if c := got["fit"]; c != nil {
		spec = filepath.Join(s.c.Runtime.CDIDir, claimSpecPrefix+string(c.UID)+".yaml")
	}
	check(checkVerify, "verify passes, with the claim's GPUs as device nodes", func(t *testing.T) {
		pod := podNamed["fit"]
		require.NotNil(t, pod, "pod fit")
		require.Equal(t, corev1.PodRunning, pod.Status.Phase, "pod fit: %s", kubetest.Unschedulable(pod))
		r.verify = s.judgeVerify(t, pod, most)
		require.FileExists(t, spec, "the driver's CDI spec of the prepared claim")
	})

	// Deleting the pod unprepares the claim: with the claim still there,
	// the kubelet calls NodeUnprepareResources and the driver removes the
	// claim's spec. Only then go the other pod and the claims.
	check(checkUnprepare, "the pod's deletion alone removes the claim's CDI spec", func(t *testing.T) {
		_, err := os.Stat(spec)
		require.NoError(t, err, "the claim's CDI spec, before the pod's deletion")
		s.remove(t, []string{"fit"}, nil)
		s.c.Wait(t, "NodeUnprepareResources of claim fit once its pod is deleted (its CDI spec removed)", podTimeout, func() error {
			if _, err := os.Stat(spec); err == nil {
				return fmt.Errorf("%s is still there", spec)
			}
			return nil
		})
		_, err = s.c.Client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), "fit", metav1.GetOptions{})
		require.NoError(t, err, "claim fit outlives its pod: the pod's deletion unprepared it")
		r.unprepare = "pod deleted -> spec removed, claim kept"
	})

	// The control of the pod's tree: the same claim's pod, opted out of
	// serve --nri, gets the claim's GPUs and not our mounts.
	check(checkVerifyOptedOut, "verify fails: no overlay in the container", func(t *testing.T) {
		s.verifyPod(t, podOptedOut, "fit", map[string]string{nriplugin.InjectAnnotation: "false"})
		pod := s.c.WaitPod(t, namespace, podOptedOut, podTimeout, func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed || kubetest.Unschedulable(p) != ""
		})
		require.Equal(t, corev1.PodFailed, pod.Status.Phase, "pod %s: %s", podOptedOut, kubetest.Unschedulable(pod))
		logs, err := s.c.Client.CoreV1().Pods(namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "verify"}).DoRaw(context.Background())
		require.NoError(t, err, "verify's log through the API server")
		// verify refuses to judge a container without our overlay, in
		// one line naming where it looked.
		refusal := "no effective profile at " + plan.DefaultContainerRoot
		require.Contains(t, string(logs), refusal, "verify's refusal")
		r.optedOut = "verify fails: " + refusal
	})
	s.removePods(t)

	s.gpuNUMA(t, x, &r, judged, check)
	if nics != nil {
		s.alignNICs(t, x, hcas, &r, nics, judged, check)
	}
}

// objectFiles are the lists a profile's directory of judged objects
// holds.
func objectFiles() []string {
	return []string{"resourceslices.json", "resourceclaims.json", "pods.json"}
}

// list GETs one of objectFiles' lists as the API server returns it.
func (s *suite) list(file string) ([]byte, error) {
	ctx := context.Background()
	switch file {
	case "resourceslices.json":
		return s.c.Client.ResourceV1().RESTClient().Get().Resource("resourceslices").DoRaw(ctx)
	case "resourceclaims.json":
		return s.c.Client.ResourceV1().RESTClient().Get().Namespace(namespace).Resource("resourceclaims").DoRaw(ctx)
	case "pods.json":
		return s.c.Client.CoreV1().RESTClient().Get().Namespace(namespace).Resource("pods").DoRaw(ctx)
	}
	return nil, fmt.Errorf("no list %s", file)
}

// removePods deletes the suite's pods and claims, if there, and waits
// until they are gone.
func (s *suite) removePods(t *testing.T) {
	t.Helper()
	s.remove(t, []string{"fit", "too-many", podOptedOut}, []string{"fit", "too-many"})
}

// remove deletes the pods and the claims named, if there, and waits until
// they are gone.
func (s *suite) remove(t *testing.T, podNames, claimNames []string) {
	t.Helper()
	ctx := context.Background()
	pods, claims := s.c.Client.CoreV1().Pods(namespace), s.c.Client.ResourceV1().ResourceClaims(namespace)
	for _, name := range podNames {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", name, err)
		}
	}
	for _, name := range claimNames {
		if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete claim %s: %v", name, err)
		}
	}
	s.c.Wait(t, fmt.Sprintf("pods %v and claims %v deleted", podNames, claimNames), podTimeout, func() error {
		for _, name := range podNames {
			if _, err := pods.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s: %v", name, cmp.Or(err, errors.New("still there")))
			}
		}
		for _, name := range claimNames {
			if _, err := claims.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim %s: %v", name, cmp.Or(err, errors.New("still there")))
			}
		}
		return nil
	})
}

// render renders the profile's tree, whole, and its plainly escaped
// copy, and writes the profile NVML serves.
func (s *suite) render(t *testing.T, p programs.SuiteProfile) *subject {
	x := &subject{SuiteProfile: p, perRoot: map[string]int{}}
	// The expectations: the profile as the wing's own reader states it,
	// and its literals for the suite's own profiles.
	facts := p.Facts(t)
	x.facts = facts
	// A real passthrough node's NVML lists no GPU bound to vfio-pci, so
	// neither does the driver, which finds its GPUs through NVML.
	var err error
	x.nvml, err = programs.NVMLProfile(t.TempDir(), p.Name, p.File)
	require.NoError(t, err, "the profile NVML serves")
	x.gpus = facts.NVIDIABound()
	for _, g := range facts.GPUs {
		if g.Driver == profilefacts.DriverVFIO {
			x.vfio++
		}
	}
	// The claims' sizes come from the GPUs per root the profile states;
	// where it places some GPU on no root, from those the driver
	// publishes (profile).
	if !slices.ContainsFunc(x.gpus, func(g profilefacts.GPU) bool { return g.Root == "" }) {
		for _, g := range x.gpus {
			x.perRoot[g.Root]++
		}
	}
	require.NotEmpty(t, x.gpus)
	s.driverLibraries(t, x.nvml)
	x.root = filepath.Join(t.TempDir(), "tree")
	// As the DaemonSet renders: the node's own PCI devices stay listed,
	// which verify checks.
	_, _, err = overlay.Render(overlay.Options{Profile: p.File, Root: x.root, HostDevices: overlay.HostDevicesMerge})
	require.NoError(t, err, "render %s", p.Name)
	x.escaped = hosttest.PlainLinksCopy(t, x.root)
	// What the plugin is served: the tree, or in a sabotaged run its
	// plainly escaped copy or nothing.
	x.served = x.root
	switch s.sabotage {
	case programs.SabotageEscaped:
		x.served = x.escaped
	case programs.SabotageNoTree:
		x.served = ""
	}
	// The claims' pods get the tree as any pod on a node does: serve, the
	// node's NRI plugin, node-wide (its default), rendering the profile
	// into a root of its own; they ask for nothing. In a sabotaged run it
	// serves a root it cannot render, so they start without the tree.
	x.servedByNRI = filepath.Join(t.TempDir(), "served")
	x.serving = s.c.Runtime.StartServeNRI(t, s.bin, containerdtest.ServeNRIOptions{Root: x.servedByNRI, Profile: p.File})
	return x
}

// publish starts the driver's kubelet plugin served root (the overlay
// read-only at its container root, the links directory at
// /sys/bus/pci/devices; empty: the node's own), with the mock NVML
// reading the profile NVML serves (x.nvml), and waits until its slices
// hold a device per GPU NVML lists; it returns those devices.
func (s *suite) publish(t *testing.T, x *subject, root, what string) ([]resourcev1.Device, func()) {
	t.Helper()
	kubelet := s.c.KubeletRootDir
	proc := s.c.Start(t, kubetest.Program{
		Name: "gpu-kubelet-plugin",
		Args: append([]string{s.plugin,
			"--node-name", kubetest.NodeName, "--namespace", namespace,
			"--image-name", "nvml-mock-sysfs-test", "--kubeconfig", s.c.Kubeconfig,
			"--nvidia-driver-root", s.driverRoot, "--container-driver-root", s.driverRoot,
			"--nvidia-cdi-hook-path", s.hook, "--cdi-root", s.c.Runtime.CDIDir,
			"--kubelet-registrar-directory-path", filepath.Join(kubelet, "plugins_registry"),
			"--kubelet-plugins-directory-path", filepath.Join(kubelet, "plugins")},
			s.opts.driverGates()...),
		Env:    []string{"MOCK_NVML_CONFIG=" + x.nvml, "LD_LIBRARY_PATH=" + filepath.Join(s.driverRoot, "usr/lib64")},
		Served: &hosttest.Served{Root: root},
	})
	t.Cleanup(func() { proc.Stop(t) })
	devices := s.waitPublished(t, proc, fmt.Sprintf("%s: ResourceSlices with %d GPUs (driver served %s)", x.Name, len(x.gpus), what), func(devices []resourcev1.Device) error {
		if len(devices) != len(x.gpus) {
			return fmt.Errorf("%d devices, want %d", len(devices), len(x.gpus))
		}
		return nil
	})
	return devices, func() { proc.Stop(t) }
}

// unpublish stops the plugin and removes its slices and its state (the
// checkpoint of prepared claims), so the next profile starts clean.
func (s *suite) unpublish(t *testing.T, stop func()) {
	t.Helper()
	stop()
	s.c.Unpublish(t, driverName, slicesTimeout)
}

// waitPublished waits until the ResourceSlices of the plugin proc hold
// devices that want accepts, failing at once if it exits, then until the
// kubelet registered it: publishing is the plugin's own doing, and
// NodePrepareResources needs the registration too. It returns the devices.
func (s *suite) waitPublished(t *testing.T, proc *kubetest.Process, what string, want func([]resourcev1.Device) error) []resourcev1.Device {
	t.Helper()
	var devices []resourcev1.Device
	s.c.Wait(t, what, slicesTimeout, func() error {
		var err error
		if devices, err = s.published(t, proc, driverName); err != nil {
			return err
		}
		return want(devices)
	})
	s.waitRegistered(t, proc, 1)
	return devices
}

// waitRegistered waits until the kubelet holds n registrations of the
// driver, failing at once if the plugin proc (when not nil) exits.
func (s *suite) waitRegistered(t *testing.T, proc *kubetest.Process, n int) {
	t.Helper()
	s.c.Wait(t, fmt.Sprintf("the kubelet holds %d registrations of the plugin", n), slicesTimeout, func() error {
		if proc != nil {
			select {
			case <-proc.Exited():
				t.Fatalf("the kubelet plugin exited:\n%s", proc.LogTail())
			default:
			}
		}
		if got, err := s.c.Nodes[0].Registrations(context.Background(), driverName); err != nil || got != n {
			return fmt.Errorf("the kubelet holds %d registrations of %s (%v)", got, driverName, err)
		}
		return nil
	})
}

// published lists the devices of the driver's ResourceSlices, failing
// at once if its plugin proc exited.
func (s *suite) published(t *testing.T, proc *kubetest.Process, driver string) ([]resourcev1.Device, error) {
	t.Helper()
	select {
	case <-proc.Exited():
		t.Fatalf("the kubelet plugin exited (driver %s):\n%s", driver, proc.LogTail())
	default:
	}
	list, err := s.c.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
	if err != nil {
		return nil, err
	}
	return devicesOf(list.Items), nil
}

// devicesOf lists the devices of slices.
func devicesOf(items []resourcev1.ResourceSlice) []resourcev1.Device {
	var out []resourcev1.Device
	for _, sl := range items {
		out = append(out, sl.Spec.Devices...)
	}
	return out
}

// numaAttributes are the names a device's NUMA node would have: the
// driver's own (unqualified, and qualified with its domain) and the
// standard one.
func numaAttributes() []string {
	return []string{"numa", driverName + "/numa", numaNodeAttribute}
}

// byDeviceName orders gpu-2 before gpu-10.
func byDeviceName(a, b string) int {
	return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
}

// judgeSlices requires a device per GPU NVML lists, each with its
// profile root complex as pcieRoot and, where the driver publishes a NUMA
// attribute (numaAttributes: the August 2026 driver publishes
// resource.kubernetes.io/numaNode, the May one none), the profile's NUMA
// node, none where the profile has -1; and returns each device's pcieRoot
// by device name. No check is tied to one driver version: the matrix says
// what this one published.
func judgeSlices(t *testing.T, x *subject, devices []resourcev1.Device, driverNUMA bool, r *row) map[string]string {
	t.Helper()
	byAddress := map[string]profilefacts.GPU{}
	for _, g := range x.gpus {
		byAddress[g.BusID] = g
	}
	rootOf := map[string]string{}
	published := map[string]int{}
	numa := map[string]int{}     // devices by NUMA attribute
	forms := map[string]string{} // each NUMA attribute's form: int or list
	for _, d := range devices {
		bdf, ok := kubetest.StringAttribute(d, pciBusIDAttribute)
		require.True(t, ok, "device %s has no %s", d.Name, pciBusIDAttribute)
		g, ok := byAddress[strings.ToLower(bdf)]
		require.True(t, ok, "device %s at %s is no GPU NVML lists (%d of the profile's on %s)", d.Name, bdf, x.vfio, profile.DriverVFIO)
		delete(byAddress, g.BusID)
		root, ok := kubetest.StringAttribute(d, programs.PCIeRootAttribute)
		require.True(t, ok, "device %s (%s) has no pcieRoot", d.Name, bdf)
		if g.Root == "" {
			t.Logf("device %s (%s): pcieRoot %s not judged: %s", d.Name, bdf, root, g.RootSaid())
		} else {
			require.Equal(t, g.Root, root, "device %s (%s): pcieRoot, the profile's %s", d.Name, bdf, g.RootSaid())
		}
		rootOf[d.Name] = root
		published[root]++
		if _, ok := d.Attributes[numaNodeAttribute]; driverNUMA && onNUMANode(g) && !ok {
			t.Errorf("device %s (%s): no %s, where the driver publishes it and the profile gives NUMA node %d: the tree lost its numa_node", d.Name, bdf, numaNodeAttribute, g.NUMANode)
		}
		for _, name := range numaAttributes() {
			a, ok := d.Attributes[resourcev1.QualifiedName(name)]
			if !ok {
				continue
			}
			numa[name]++
			if a.IntValues != nil {
				forms[name] = "list"
			} else if forms[name] == "" {
				forms[name] = "int"
			}
			// Each form judged as the standard attribute is.
			if _, err := judgeNUMA(resourcev1.Device{Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{numaNodeAttribute: a}}, numaOf(g)); err != nil {
				t.Errorf("device %s (%s): %s: %v", d.Name, bdf, name, err)
			}
		}
	}
	require.Empty(t, byAddress, "GPUs NVML lists with no device in the slices")
	var roots []string
	for _, root := range slices.Sorted(maps.Keys(published)) {
		roots = append(roots, fmt.Sprintf("%s×%d", root, published[root]))
	}
	r.roots = strings.Join(roots, " ")
	for _, name := range slices.SortedFunc(maps.Keys(rootOf), byDeviceName) {
		r.perGPU = append(r.perGPU, name+" "+rootOf[name])
	}
	r.numa = "none on any GPU device (this driver version publishes no NUMA attribute on a GPU)"
	if !slices.ContainsFunc(x.gpus, onNUMANode) {
		r.numa = "none on any GPU device, as the profile gives none a NUMA node (-1)"
	}
	if len(numa) > 0 {
		var said []string
		for _, name := range slices.Sorted(maps.Keys(numa)) {
			said = append(said, fmt.Sprintf("%s (%s) on %d of %d GPUs, each the profile's NUMA node", name, forms[name], numa[name], len(devices)))
		}
		r.numa = strings.Join(said, "; ")
	}
	r.gpuNUMA = numa[numaNodeAttribute] > 0
	return rootOf
}

// numaOf is the GPU's NUMA node as the profile gives it (its root
// complex's numa_node), -1 where it gives none.
func numaOf(g profilefacts.GPU) int {
	if g.NUMAGiven {
		return g.NUMANode
	}
	return -1
}

// onNUMANode reports whether the profile places the GPU on a NUMA node.
func onNUMANode(g profilefacts.GPU) bool { return numaOf(g) >= 0 }

// claim creates a claim for n GPUs of the class that must share a
// pcieRoot.
func (s *suite) claim(t *testing.T, name string, n int) *resourcev1.ResourceClaim {
	t.Helper()
	c, err := s.c.Client.ResourceV1().ResourceClaims(namespace).Create(context.Background(), &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(n),
			}}},
			Constraints: []resourcev1.DeviceConstraint{{
				Requests:       []string{"gpus"},
				MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(programs.PCIeRootAttribute)),
			}},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "create claim %s", name)
	return c
}

// verifyPod is a pod whose init container runs verify with the claim's
// devices and, by the annotation docs/user/dra.md gives DRA workloads, the
// mock sysfs; its container then holds the claim (pause) until the pod is
// deleted, so the claim stays prepared until then.
func (s *suite) verifyPod(t *testing.T, name, claim string, annotations map[string]string) {
	t.Helper()
	pod := s.pod(name, claim)
	pod.Annotations = annotations
	pod.Spec.InitContainers = []corev1.Container{{
		Name: "verify", Image: verifyImage, ImagePullPolicy: corev1.PullNever,
		Command:   []string{"/nvml-mock-sysfs", "verify", "--format", "json"},
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
	}}
	_, err := s.c.Client.CoreV1().Pods(namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err, "create pod %s", name)
}

// holdPod is a pod that only holds the claim.
func (s *suite) holdPod(t *testing.T, name, claim string) {
	t.Helper()
	_, err := s.c.Client.CoreV1().Pods(namespace).Create(context.Background(), s.pod(name, claim), metav1.CreateOptions{})
	require.NoError(t, err, "create pod %s", name)
}

// pod is a pod of the pause program with the claim.
func (s *suite) pod(name, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(claim)}},
			Containers: []corev1.Container{{
				Name: "hold", Image: verifyImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

// judgeVerify requires that verify passed in the pod's init container,
// from its log through the API server, and that the container got the
// claim's n GPUs as device nodes (from the driver's CDI spec).
func (s *suite) judgeVerify(t *testing.T, pod *corev1.Pod, n int) string {
	t.Helper()
	require.Len(t, pod.Status.InitContainerStatuses, 1)
	st := pod.Status.InitContainerStatuses[0].State.Terminated
	require.NotNil(t, st, "verify has ended")
	report := s.verifyReport(t, pod)
	require.Zero(t, st.ExitCode, "verify's failures: %+v", report.Failures())
	require.True(t, report.OK())

	id := strings.TrimSpace(s.c.Runtime.Crictl(t, "ps", "--all", "--quiet", "--label", "io.kubernetes.pod.name="+pod.Name, "--label", "io.kubernetes.container.name=verify"))
	require.NotEmpty(t, id, "verify's CRI container")
	var inspect struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Devices []struct {
						Path string `json:"path"`
					} `json:"devices"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	require.NoError(t, json.Unmarshal([]byte(s.c.Runtime.Crictl(t, "inspect", strings.Fields(id)[0])), &inspect))
	var gpus []string
	gpu := regexp.MustCompile(`^/dev/nvidia[0-9]+$`)
	for _, d := range inspect.Info.RuntimeSpec.Linux.Devices {
		if gpu.MatchString(d.Path) {
			gpus = append(gpus, d.Path)
		}
	}
	require.Len(t, gpus, n, "the claim's GPUs as device nodes in verify's container")
	slices.Sort(gpus)
	return fmt.Sprintf("pass, %d checks; devices %s", len(report.Results), strings.Join(gpus, ","))
}

// verifyReport is the report verify printed in the pod's init container,
// read through the API server.
func (s *suite) verifyReport(t *testing.T, pod *corev1.Pod) compat.Report {
	t.Helper()
	logs, err := s.c.Client.CoreV1().Pods(namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "verify"}).DoRaw(context.Background())
	require.NoError(t, err, "verify's log through the API server")
	var report compat.Report
	require.NoError(t, json.Unmarshal(logs, &report), "verify's report:\n%s", logs)
	return report
}

// writeMatrix prints the matrix, one profile a block, under a heading
// that says what the suite ran with (about, "" for the defaults).
func writeMatrix(w *bytes.Buffer, about string, rows []row) {
	fmt.Fprintf(w, "DRA driver on a real node (gpu-kubelet-plugin, kube-scheduler %s%s):\n", programs.KubeVersion, about)
	for _, r := range rows {
		fmt.Fprintf(w, "\n%s: %s\n", r.name, r.pass)
		fmt.Fprintf(w, "  slices:        %s; GPUs per pcieRoot %s; with escaped links %d devices with pcieRoot\n", r.published(), cmp.Or(r.roots, "-"), r.escapedRoots)
		fmt.Fprintf(w, "  pcieRoot:      %s\n", cmp.Or(wrap(r.perGPU, 4, "\n                 "), "-"))
		fmt.Fprintf(w, "  numaNode:      %s\n", cmp.Or(r.numa, "-"))
		fmt.Fprintf(w, "  claim %-22s -> %s\n", "("+r.fit+")", cmp.Or(r.fitGot, "-"))
		fmt.Fprintf(w, "  claim %-22s -> %s\n", "("+r.tooMany+")", cmp.Or(r.tooManyGot, "-"))
		fmt.Fprintf(w, "  verify in pod: %s; unprepare: %s; opted out: %s\n", cmp.Or(r.verify, "-"), cmp.Or(r.unprepare, "-"), cmp.Or(r.optedOut, "-"))
		for _, c := range r.numaClaims {
			fmt.Fprintf(w, "  claim %s\n", c)
		}
		if n := r.nics; n != nil {
			fmt.Fprintf(w, "  dranet:        %d of %d HCAs published; without the tree %s\n", n.published, n.hcas, cmp.Or(n.noTree, "-"))
			fmt.Fprintf(w, "  HCAs:          %s\n", cmp.Or(wrap(n.perHCA, 3, "\n                 "), "-"))
			fmt.Fprintf(w, "  node's own:    %s\n", cmp.Or(n.nodeNICs, "-"))
			for _, c := range n.claims {
				fmt.Fprintf(w, "  claim %s\n", c)
			}
			fmt.Fprintf(w, "  prepare:       %s\n", cmp.Or(n.prepare, "-"))
		}
	}
}

// published says how many devices the slices held for how many GPUs:
// on a passthrough node, those NVML lists, beside those on vfio-pci.
func (r row) published() string {
	text := fmt.Sprintf("%s for %s", count(r.devices, "device"), count(r.gpus, "GPU"))
	if r.vfio > 0 {
		text += fmt.Sprintf(" NVML lists (%d on %s not in NVML)", r.vfio, profile.DriverVFIO)
	}
	return text
}

// count is "1 device" or "n devices".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// wrap joins items with ", ", n to a line, lines joined by sep.
func wrap(items []string, n int, sep string) string {
	var lines []string
	for c := range slices.Chunk(items, n) {
		lines = append(lines, strings.Join(c, ", "))
	}
	return strings.Join(lines, ","+sep)
}

// driverLibraries adds to the driver root the files NodePrepareResources
// looks for by the driver version NVML reports (the profile's):
// libnvidia-ml.so.VERSION, the mock NVML itself, and libcuda.so.VERSION,
// which the claim's CDI spec only mounts (a copy of the same file).
func (s *suite) driverLibraries(t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err, "profile %s", file)
	var doc struct {
		System struct {
			DriverVersion string `yaml:"driver_version"`
		} `yaml:"system"`
	}
	require.NoError(t, yaml.Unmarshal(data, &doc), "%s", file)
	// programs.SuiteProfiles serves every profile with a driver version
	// (a built-in states one; ServableProfile adds one to the others), which the mock NVML requires too.
	version := doc.System.DriverVersion
	require.NotEmpty(t, version, "%s: system.driver_version", file)
	lib := filepath.Join(s.driverRoot, "usr/lib64")
	mock, err := os.ReadFile(filepath.Join(lib, programs.MockNVML))
	require.NoError(t, err, "the mock NVML in the driver root")
	for _, name := range []string{"libnvidia-ml.so." + version, "libcuda.so." + version} {
		require.NoError(t, os.WriteFile(filepath.Join(lib, name), mock, 0o755), "the driver root's %s", name)
	}
}
