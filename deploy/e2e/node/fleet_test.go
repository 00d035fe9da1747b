package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// The fleet: one install of the Helm chart serving each node of a
// cluster of workers its own profile, by a fleet map.
const (
	// fleetEnv lists the fleet's profile files, one per worker node, in
	// order, separated by colons (make e2e-k8s E2E_FLEET=a.yaml:b.yaml);
	// unset, nvml-mock's A100 and GB200 profiles of ../shared.
	fleetEnv = "NVML_MOCK_SYSFS_E2E_FLEET"
	// chartDir is the chart, below the repository.
	chartDir     = "deploy/helm/nvml-mock-sysfs"
	fleetRelease = "nvml-mock-sysfs"
	// fleetLabel is the node label the map's rules match, as nvml-mock's
	// kind configuration once labelled its nodes.
	fleetLabel = "nvml-mock/profile"
	// The chart's fleet map and the DaemonSet's paths (its defaults, the
	// raw manifest's). The map is where serve keeps the keys it reads
	// through the API (fleet.readThroughAPI, as the suite installs it):
	// the chart's nvml-mock-sysfs.fleetDir.
	fleetMapDir = "/run/nvml-mock-sysfs/fleet"
	fleetRoot   = "/var/lib/nvml-mock-sysfs"
	fleetSpec   = "/var/run/cdi/nvml-mock-sysfs.yaml"
	// The DRA driver, when supplied, and the class the fleet's claims use.
	fleetDriver      = "gpu.nvidia.com"
	fleetDeviceClass = "fleet.gpu.nvidia.com"
	labelProduct     = "nvidia.com/gpu.product"
)

// fleetProfile is one worker's profile: the ConfigMap key the map names,
// the file the mock NVML reads, and the machine it renders.
type fleetProfile struct {
	name, key, slug, file, text string
	facts                       *profilefacts.Profile
}

// fleetProfiles are the fleet's profiles (fleetEnv, or A100 and GB200).
func fleetProfiles(t *testing.T) []fleetProfile {
	t.Helper()
	files := filepath.SplitList(os.Getenv(fleetEnv))
	// The suites' literals judge their own profiles alone: nvml-mock's,
	// the fleet's default.
	own := len(files) == 0
	if own {
		shared := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
		files = []string{filepath.Join(shared, "a100.yaml"), filepath.Join(shared, "gb200.yaml")}
	}
	require.GreaterOrEqual(t, len(files), 2, "%s: a fleet has two profiles or more, one per worker node", fleetEnv)
	var out []fleetProfile
	seen := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err, "%s", fleetEnv)
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		file, err := programs.ServableProfile(t.TempDir(), name, f, data)
		require.NoError(t, err)
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		p := fleetProfile{name: name, slug: kubetest.Slug(name), file: file, text: string(text)}
		p.key = p.slug + ".yaml"
		require.False(t, seen[p.key], "%s: %s twice; each worker's profile must differ", fleetEnv, p.key)
		seen[p.key] = true
		literal := ""
		if own {
			literal = name
		}
		p.facts = facts(t, p.key, literal, p.text)
		out = append(out, p)
	}
	return out
}

// fleet is the cluster, the chart and one node suite per worker.
type fleet struct {
	c        *kubetest.Cluster
	repo     string
	helm     string
	helmHome string // Helm's configuration, cache and data: the test's
	profiles []fleetProfile
	nodes    []*suite // nodes[i] runs profiles[i]
	objects  string   // bin/k8s/fleet
	rows     docmatrix.Rows
	figures  []string
	// dra is the driver's, when it and nvml-mock's NVML are supplied.
	dra *fleetDRA
}

// fleetDRA is what the driver's kubelet plugin needs on every node.
type fleetDRA struct {
	plugin, driverRoot, hook string
	// running is each node's plugin, by node name, and what it was served.
	running map[string]*kubetest.Process
}

// TestFleet installs the chart with a fleet map on a control plane and
// one worker per profile (kubetest's workers), and checks that each node
// is served its own profile: the first worker by its name, the others by
// a label, which they get only after the install, so that until then they
// are the negative control (not Ready, no tree: no labels, no pcieRoot,
// while the first has them). Then GFD and nfd-worker label every Node
// with its own profile, verify passes in a pod on each node (and fails
// with another node's profile), the DRA driver (supplied) publishes each
// node's GPUs with their pcieRoots and the scheduler places claims by
// product, a helm upgrade re-profiles the first worker alone while
// readers scan both, and helm uninstall leaves the trees and specs.
func TestFleet(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	began := time.Now()
	f := &fleet{repo: overlaytest.Repo(t), profiles: fleetProfiles(t), objects: kubetest.ObjectsDir(t, "fleet")}
	f.helm, f.helmHome = programs.NeedBinary(t, programs.Helm()), t.TempDir()
	nvml := programs.NeedNVML(t)
	gfd := programs.Need(t, programs.GFD())
	nfd := programs.Need(t, programs.NFDWorker())
	master := programs.NeedBinary(t, programs.NFDMaster())
	bin := hosttest.BuildBinary(t)
	f.dra = newFleetDRA(t, f.profiles)
	readmeFleet(t)
	// A sabotaged run serves each node's labellers, verify and driver
	// something else (suite.serve, publish); the rows that judge the
	// chart's render read the node's tree itself and stay green.
	sabotage := programs.Sabotage(t)

	ds := podtest.DecodeManifests(t, filepath.Join(f.repo, "deploy/kubernetes"))
	require.Len(t, ds.DaemonSets, 1)
	image := ds.DaemonSets[0].Spec.Template.Spec.Containers[0].Image

	f.c = kubetest.Start(t, kubetest.Options{Workers: len(f.profiles)})
	for i, n := range f.c.Nodes {
		n.Runtime.Import(t, containerdtest.BinaryImage(t, containerdtest.NormalizedImage(image), bin), containerdtest.CRINamespace)
		n.Runtime.Import(t, containerdtest.ConsumerBaseImage(), containerdtest.CRINamespace)
		n.Runtime.Import(t, containerdtest.ReaderBaseImage(t), containerdtest.CRINamespace)
		s := &suite{c: f.c, node: n, repo: f.repo, objects: f.objects, nvml: nvml, gfd: gfd, nfd: nfd,
			key: f.profiles[i].key, root: fleetRoot, spec: fleetSpec, sabotage: sabotage}
		f.nodes = append(f.nodes, s)
	}
	f.c.Apply(t, nfdCRDs(t))
	f.c.Start(t, kubetest.Program{Name: "nfd-master", Args: []string{master, "-kubeconfig", f.c.Kubeconfig, "-port", "8081"},
		Env: []string{"NODE_NAME=" + f.c.Nodes[0].Name, "POD_NAMESPACE=" + fleetNamespace(t, f.repo)}})
	t.Logf("%d workers and programs ready in %s", len(f.c.Nodes), time.Since(began).Round(time.Second))

	runSteps(t, []step{
		{"helm install with a fleet map", f.testInstall, false},
		{"the unlabelled workers, without our tree", f.testWithoutTree, true},
		{"labelling the other workers serves them", f.testLabel, false},
		{"each Node's labels", f.testLabels, true},
		{"verify in a pod on each node", f.testVerify, true},
		{"the DRA driver on each node", f.testDRA, true},
		{"helm upgrade re-profiles one node", f.testReprofile, true},
		{"helm uninstall", f.testUninstall, true},
	})
	f.writeObjects(t, "reprofiled")
	f.c.Stop(t)
	t.Run("nothing is left on the host", func(t *testing.T) {
		f.rows.Expect(t, "after the suite", "every node", "nothing on the host (sysctls, kubelet directories, cgroups, processes, mounts)")
		require.Empty(t, f.c.Leftovers())
	})
	f.figures = append(f.figures, fmt.Sprintf("%d workers, the whole suite in %s", len(f.c.Nodes), time.Since(began).Round(time.Second)))
	table := f.rows.Table("step", "node", "result")
	text := "TestFleet (deploy/e2e/node): one install of the chart, a profile per node\n\n" + table + "\n" + strings.Join(f.figures, "\n") + "\n"
	t.Logf("\n%s", text)
	kubetest.AppendMatrix(t, text)
}

// readmeFleet checks the README's fleet block against what this suite
// does: it labels a node with fleetLabel, installs the release of the chart
// with a map by node name and by that label, and lists labels the suite
// judges. (deploy's TestHelmDocsInstallTheChart renders its helm install.)
func readmeFleet(t *testing.T) {
	t.Helper()
	steps := overlaytest.ReadmeShell(t)["A fleet, with Helm"]
	require.Len(t, steps, 3, "README: the fleet block labels a node, installs the chart, lists the Nodes' labels")
	require.True(t, strings.HasPrefix(steps[0], "kubectl label node ") && strings.Contains(steps[0], " "+fleetLabel+"="), "README: %q labels a node with %s", steps[0], fleetLabel)
	for _, want := range []string{"helm install " + fleetRelease + " " + chartDir + " ", "'fleet.nodes=", "'fleet.labels=", `"` + fleetLabel + `"`, "fleet.readThroughAPI=true"} {
		require.Contains(t, steps[1], want, "README: the fleet's helm install")
	}
	require.Equal(t, "kubectl get nodes -L "+labelProduct+" -L "+labelCount, steps[2], "README: the labels the fleet suite judges")
}

// fleetNamespace is the namespace the chart is installed in: the raw
// manifest's, nvml-mock's own.
func fleetNamespace(t *testing.T, repo string) string {
	t.Helper()
	m := podtest.DecodeManifests(t, filepath.Join(repo, "deploy/kubernetes"))
	return m.DaemonSets[0].Namespace
}

func (f *fleet) figure(format string, args ...any) {
	f.figures = append(f.figures, fmt.Sprintf(format, args...))
}

// values is the chart's values for a fleet map: the first worker by its
// name, every other by a rule on fleetLabel; every profile a key of the
// map's ConfigMap. byName overrides the first worker's profile (the
// re-profile).
func (f *fleet) values(t *testing.T, byName fleetProfile) string {
	t.Helper()
	type rule struct {
		Match   map[string]string `yaml:"match"`
		Profile string            `yaml:"profile"`
	}
	var v struct {
		Fleet struct {
			Nodes    map[string]string `yaml:"nodes"`
			Labels   []rule            `yaml:"labels"`
			Profiles map[string]string `yaml:"profiles"`
			// ReadThroughAPI: serve reads the map from the API server, so
			// that a re-profile waits for no kubelet's ConfigMap sync (the
			// README's fleet block sets it too).
			ReadThroughAPI bool `yaml:"readThroughAPI"`
		} `yaml:"fleet"`
	}
	v.Fleet.ReadThroughAPI = true
	v.Fleet.Nodes = map[string]string{f.c.Nodes[0].Name: byName.key}
	v.Fleet.Profiles = map[string]string{}
	for i, p := range f.profiles {
		v.Fleet.Profiles[p.key] = p.text
		if i > 0 {
			v.Fleet.Labels = append(v.Fleet.Labels, rule{Match: map[string]string{fleetLabel: p.slug}, Profile: p.key})
		}
	}
	data, err := yaml.Marshal(v)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "fleet-values.yaml")
	require.NoError(t, os.WriteFile(file, data, 0o644))
	return file
}

// helmRun runs helm against the cluster, as a user does.
func (f *fleet) helmRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := f.c.Run(programs.HelmEnv(f.helmHome), f.helm, args...)
	require.NoError(t, err)
	return out
}

// readyOn is whether the DaemonSet's pod on s's node is Ready.
func (s *suite) daemonSetPodReady(t *testing.T) error {
	list, err := s.c.Client.CoreV1().Pods(s.ds.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: metav1.FormatLabelSelector(s.ds.Spec.Selector), FieldSelector: "spec.nodeName=" + s.node.Name})
	if err != nil {
		return err
	}
	if len(list.Items) != 1 || !kubetest.PodReady(&list.Items[0]) {
		return fmt.Errorf("%d pods of the DaemonSet on %s, none Ready", len(list.Items), s.node.Name)
	}
	return nil
}

// requireTree requires the node's tree to be the profile's: complete (its
// marker), every GPU of the profile at its address in the links
// directory, and as many GPUs as ghw lists in it served.
func (s *suite) requireTree(t *testing.T, p fleetProfile) {
	t.Helper()
	_, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
	require.NoError(t, err, "a complete tree at %s's %s", s.node.Name, s.root)
	for _, g := range p.facts.GPUs {
		_, err := os.Lstat(filepath.Join(s.nodePath(s.root), plan.LinksDir, g.BusID))
		require.NoError(t, err, "%s's tree: %s's GPU %s", s.node.Name, p.name, g.BusID)
	}
	require.Equal(t, len(p.facts.GPUs), s.servedGPUs(t), "%s's tree has %s's GPUs, as ghw lists them", s.node.Name, p.name)
}

// testInstall installs the chart: the first worker is matched by name,
// the others by a label they lack yet, so they are not Ready, with one log
// line naming the node and the map, and have no tree.
func (f *fleet) testInstall(t *testing.T) {
	first := f.nodes[0]
	f.rows.Expect(t, "`helm install` with a fleet map", first.node.Name, fmt.Sprintf("by name: Ready, %s's tree (%d GPUs) and spec", f.profiles[0].name, len(f.profiles[0].facts.GPUs)))
	ns := fleetNamespace(t, f.repo)
	installed := time.Now()
	// As the nodes' NRI plugin, as the README's fleet does: each worker's
	// served pods ask for nothing.
	f.helmRun(t, "install", fleetRelease, filepath.Join(f.repo, chartDir), "--namespace", ns, "--create-namespace", "--values", f.values(t, f.profiles[0]),
		"--set", "nri.enabled=true")
	d, err := f.c.Client.AppsV1().DaemonSets(ns).Get(context.Background(), fleetRelease, metav1.GetOptions{})
	require.NoError(t, err, "the chart's DaemonSet")
	cms, err := f.c.Client.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var fleetMap *corev1.ConfigMap
	for i, cm := range cms.Items {
		if _, ok := cm.Data["fleet.yaml"]; ok {
			fleetMap = &cms.Items[i]
		}
	}
	require.NotNil(t, fleetMap, "the chart's fleet ConfigMap in %s", ns)
	for _, s := range f.nodes {
		s.ds, s.cm = *d, *fleetMap
	}
	first.c.Wait(t, first.node.Name+": the DaemonSet's pod Ready", 3*time.Minute, func() error { return first.daemonSetPodReady(t) })
	f.figure("helm install -> %s's pod Ready in %s", first.node.Name, time.Since(installed).Round(time.Millisecond))
	first.requireTree(t, f.profiles[0])
	_, err = os.Stat(first.nodePath(first.spec))
	require.NoError(t, err, "the CDI spec at %s's %s", first.node.Name, first.spec)

	for _, s := range f.nodes[1:] {
		t.Run(s.node.Name, func(t *testing.T) {
			f.rows.Expect(t, "`helm install` with a fleet map", s.node.Name, "no rule matches yet: not Ready, no tree, one log line naming the node and the map")
			var log string
			s.c.Wait(t, s.node.Name+": the DaemonSet's pod logs its node and the map", 2*time.Minute, func() error {
				pod := s.daemonSetPod(t)
				log = s.c.PodLog(t, pod.Namespace, pod.Name)
				if !strings.Contains(log, s.node.Name) || !strings.Contains(log, fleetMapDir) {
					return fmt.Errorf("log:\n%s", log)
				}
				return nil
			})
			var lines []string
			for _, l := range strings.Split(log, "\n") {
				if strings.Contains(l, "matches no rule") {
					lines = append(lines, l)
				}
			}
			require.Len(t, lines, 1, "one line says why %s is not served:\n%s", s.node.Name, log)
			require.Contains(t, lines[0], s.node.Name)
			require.Error(t, s.daemonSetPodReady(t), "not Ready")
			_, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
			require.ErrorIs(t, err, os.ErrNotExist, "no tree on %s", s.node.Name)
			f.figure("%s not served: %s", s.node.Name, strings.TrimSpace(lines[0]))
		})
	}
}

// testWithoutTree is the negative control: GFD and nfd-worker on an
// unlabelled worker get no tree (there is none), so its Node has no GPU
// labels and, with the DRA driver, its devices no pcieRoot, while the
// first worker's are all there.
func (f *fleet) testWithoutTree(t *testing.T) {
	f.nodes[0].labellerAccess(t)
	for i, s := range f.nodes {
		served := i == 0
		p := f.profiles[i]
		t.Run(s.node.Name, func(t *testing.T) {
			if served {
				_, said := profileLabels(t, p)
				f.rows.Expect(t, "GFD and nfd-worker, served", s.node.Name, said+" ("+s.nvml.Name()+")")
				f.labelNode(t, s, p)
				return
			}
			f.rows.Expect(t, "GFD and nfd-worker, without our tree", s.node.Name, "GFD fails (no PCI vendor for NVML's GPUs); no `gpu.*`, no `pci-10de.present` on this Node")
			done, log := s.c.RunPodToEnd(t, s.gfdPod(t, s.node.Name+"-gfd-without-tree", false))
			require.Equal(t, corev1.PodFailed, done.Status.Phase, "log:\n%s", log)
			require.Contains(t, log, "unable to read PCI device vendor id", "GFD's own reason")
			s.c.RunPod(t, s.nfdPod(t, s.node.Name+"-nfd-without-tree", false))
			s.waitLabels(t, "nfd-worker's labels of the node's own devices", func(l map[string]string) error {
				if len(pciLabels(l)) == 0 {
					return fmt.Errorf("no %s* label", nfdLabelPref)
				}
				return nil
			})
			labels := s.nodeLabels(t)
			require.NotContains(t, labels, labelMode)
			require.NotContains(t, labels, labelNVIDIA)
		})
		t.Run(s.node.Name+" DRA", func(t *testing.T) {
			want := fmt.Sprintf("%d GPU devices, each with its pcieRoot", len(p.facts.GPUs))
			if !served {
				want = fmt.Sprintf("%d GPU devices, none with a pcieRoot", len(p.facts.GPUs))
			}
			f.rows.Expect(t, "the DRA driver's slices", s.node.Name, want)
			if f.dra == nil {
				f.rows.NotRun(t, programs.NotRun("the DRA driver's slices", programs.GPUKubeletPlugin))
				return
			}
			devices := f.dra.publish(t, s, p, served)
			for _, d := range devices {
				root, ok := kubetest.StringAttribute(d, programs.PCIeRootAttribute)
				require.Equal(t, served, ok, "device %s: pcieRoot %q", d.Name, root)
			}
		})
	}
}

// labelNode runs GFD and nfd-worker served on s's node and waits for its
// profile's labels.
func (f *fleet) labelNode(t *testing.T, s *suite, p fleetProfile) map[string]string {
	t.Helper()
	s.c.RunPod(t, s.gfdPod(t, s.node.Name+"-gfd-"+p.slug, true))
	s.c.RunPod(t, s.nfdPod(t, s.node.Name+"-nfd-"+p.slug, true))
	want, _ := profileLabels(t, p)
	return s.waitLabels(t, p.name+"'s labels", wantLabels(want))
}

// profileLabels are the labels GFD and nfd-worker must put on a node
// served p, and how a row says them: gpu.machine only where the profile
// names a machine or the suites' literal gives its board's (machineLabel;
// a PCIe board's names none, and GFD labels the node's own DMI name,
// which the check could not tell from a wrong render).
func profileLabels(t *testing.T, p fleetProfile) (map[string]string, string) {
	t.Helper()
	want := map[string]string{labelMode: "compute", labelCount: fmt.Sprint(len(p.facts.GPUs)), labelProduct: gfdProduct(p), labelNVIDIA: "true"}
	machine, said := machineLabel(p.facts)
	if machine != "" {
		want[labelMachine] = machine
	}
	return want, fmt.Sprintf("`gpu.product` %s, `gpu.count` %d, `gpu.machine` %s, `pci-10de.present`", gfdProduct(p), len(p.facts.GPUs), said)
}

// gfdProduct is the gpu.product GFD gives the profile's GPUs: NVML's name
// (the profile's), its spaces dashes.
func gfdProduct(p fleetProfile) string {
	return strings.ReplaceAll(p.facts.GPUs[0].Name, " ", "-")
}

// testLabel labels every worker but the first with its profile's rule:
// serve on each sees its Node's labels change and renders its profile,
// while the first worker's tree stays byte for byte.
func (f *fleet) testLabel(t *testing.T) {
	first := f.nodes[0]
	before := overlaytest.Snapshot(t, first.nodePath(first.root), overlaytest.SnapshotOptions{Identity: true})
	for i, s := range f.nodes[1:] {
		p := f.profiles[i+1]
		t.Run(s.node.Name, func(t *testing.T) {
			f.rows.Expect(t, "Node labelled `"+fleetLabel+"="+p.slug+"`", s.node.Name, fmt.Sprintf("by label: Ready, %s's tree (%d GPUs) and spec", p.name, len(p.facts.GPUs)))
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, fleetLabel, p.slug)
			labelled := time.Now()
			_, err := s.c.Client.CoreV1().Nodes().Patch(context.Background(), s.node.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
			s.c.Wait(t, s.node.Name+": the DaemonSet's pod Ready", 2*time.Minute, func() error { return s.daemonSetPodReady(t) })
			f.figure("Node %s labelled -> its pod Ready with %s's tree in %s (serve watches its Node)", s.node.Name, p.name, time.Since(labelled).Round(time.Millisecond))
			s.requireTree(t, p)
		})
	}
	t.Run(first.node.Name, func(t *testing.T) {
		f.rows.Expect(t, "the other Nodes labelled", first.node.Name, "its tree unchanged, byte for byte")
		overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, first.nodePath(first.root), overlaytest.SnapshotOptions{Identity: true}), first.node.Name+"'s tree")
	})
}

// testLabels has GFD and nfd-worker label every worker newly served, and
// checks that every Node has its own profile's labels.
func (f *fleet) testLabels(t *testing.T) {
	for i, s := range f.nodes {
		p := f.profiles[i]
		t.Run(s.node.Name, func(t *testing.T) {
			want, said := profileLabels(t, p)
			f.rows.Expect(t, "each Node's labels (GFD, nfd-worker, served)", s.node.Name, said+" ("+s.nvml.Name()+")")
			if i > 0 {
				f.labelNode(t, s, p)
			}
			labels := s.nodeLabels(t)
			for k, v := range want {
				require.Equal(t, v, labels[k], "%s: %s", s.node.Name, k)
			}
		})
	}
}

// testVerify runs verify in a pod on each node, served the node's tree,
// with the node's profile as the mock NVML's: it passes. With another
// node's profile it fails: the pairing is exact per node.
func (f *fleet) testVerify(t *testing.T) {
	for i, s := range f.nodes {
		own, other := f.profiles[i], f.profiles[(i+1)%len(f.profiles)]
		t.Run(s.node.Name, func(t *testing.T) {
			f.rows.Expect(t, "verify in a pod, the node's profile as NVML's", s.node.Name, "passes, `"+compat.NVMLAgreement+"` among its rows")
			log := s.c.RunPod(t, s.verifyPod(t, s.node.Name+"-verify", own))
			require.Equal(t, []string{compat.NVMLAgreement}, verifyRows(t, log, true), "verify's NVML row passed")
		})
		t.Run(s.node.Name+" with another node's profile", func(t *testing.T) {
			f.rows.Expect(t, "verify in a pod, "+other.name+"'s profile as NVML's", s.node.Name, "fails at `"+compat.NVMLAgreement+"` alone")
			done, log := s.c.RunPodToEnd(t, s.verifyPod(t, s.node.Name+"-verify-"+other.slug, other))
			require.Equal(t, corev1.PodFailed, done.Status.Phase, "verify with %s's profile on %s:\n%s", other.name, s.node.Name, log)
			require.Equal(t, []string{compat.NVMLAgreement}, verifyRows(t, log, false), "verify's own verdict, not a failure to start")
		})
	}
}

// verifyRows reads verify's JSON report and returns its NVML rows that
// passed (ok) or failed, and requires every other row to have passed.
func verifyRows(t *testing.T, log string, ok bool) []string {
	t.Helper()
	var r compat.Report
	require.NoError(t, json.Unmarshal([]byte(log), &r), "verify's report:\n%s", log)
	var got []string
	for _, row := range r.Results {
		if row.Check == compat.NVMLAgreement {
			if row.OK == ok {
				got = append(got, row.Check)
			}
			continue
		}
		require.True(t, row.OK, "verify: %+v", row)
	}
	return got
}

// verifyPod runs verify from the node's served overlay (the binary the
// render put there), with MOCK_NVML_CONFIG naming p's key of the fleet
// map's ConfigMap.
func (s *suite) verifyPod(t *testing.T, name string, p fleetProfile) *corev1.Pod {
	t.Helper()
	// The container root the render recorded (the chart's
	// --container-root), where the served pod finds the overlay.
	containerRoot, err := cdispec.ServedContainerRoot(os.DirFS(s.nodePath(s.root)), s.root, "")
	require.NoError(t, err)
	bin := filepath.Join(containerRoot, "bin", "nvml-mock-sysfs")
	inv := programs.Invocation{Args: []string{bin, "verify", "--container-root", containerRoot, "--format", "json"},
		Env: []string{"MOCK_NVML_CONFIG=" + profileDir + "/" + p.key}}
	return s.labellerPod(t, name, "verify", s.gfd, inv, true)
}

// newFleetDRA is the driver's setup, or nil when it or nvml-mock's NVML is
// not supplied (its rows are then not run).
func newFleetDRA(t *testing.T, profiles []fleetProfile) *fleetDRA {
	t.Helper()
	found := map[string]string{}
	for _, name := range []string{programs.GPUKubeletPlugin, programs.MockNVML} {
		p, ok := programs.NeedSupplied(t, name)
		if !ok {
			return nil
		}
		found[name] = p
	}
	d := &fleetDRA{plugin: found[programs.GPUKubeletPlugin], running: map[string]*kubetest.Process{}}
	dir := t.TempDir()
	d.driverRoot = filepath.Join(dir, "driver-root")
	require.NoError(t, programs.WriteDriverRoot(d.driverRoot, filepath.Dir(found[programs.MockNVML])))
	gpus := 0
	for _, p := range profiles {
		gpus = max(gpus, len(p.facts.GPUs))
	}
	require.NoError(t, programs.WriteDeviceNodes(d.driverRoot, gpus))
	d.hook = filepath.Join(dir, "nvidia-cdi-hook")
	require.NoError(t, os.WriteFile(d.hook, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	return d
}

// publish (re)starts the driver's kubelet plugin on s's node, served the
// node's tree (or, not served, the node's own /sys), with the mock NVML
// reading p, and returns the devices of the node's slices once they hold
// one per GPU.
func (d *fleetDRA) publish(t *testing.T, s *suite, p fleetProfile, served bool) []resourcev1.Device {
	t.Helper()
	ctx := context.Background()
	registered := func(want int) func() error {
		return func() error {
			if n, err := s.node.Registrations(ctx, fleetDriver); err != nil || n != want {
				return fmt.Errorf("%s's kubelet holds %d registrations of %s (%v)", s.node.Name, n, fleetDriver, err)
			}
			return nil
		}
	}
	if old := d.running[s.node.Name]; old != nil {
		old.Stop(t)
		// The next plugin has the same socket: the kubelet must have let
		// go of this one first, or its late unregistration wipes the
		// next one's slices.
		s.c.Wait(t, s.node.Name+": the kubelet unregistered the plugin", 2*time.Minute, registered(0))
	}
	slicesAPI := s.c.Client.ResourceV1().ResourceSlices()
	selector := metav1.ListOptions{FieldSelector: draSlicesOf(s.node.Name)}
	require.NoError(t, slicesAPI.DeleteCollection(ctx, metav1.DeleteOptions{}, selector))
	root := ""
	switch {
	case served && s.sabotage == programs.SabotageNoTree:
		// No tree is a spec written with --fail-open, which mounts
		// nothing (programs.SabotagedRoot): the driver sees the node's
		// own /sys, as the DRA suite serves it, and still runs; serving
		// the empty directory as a root would stop it at a mount of a
		// links directory the empty tree has not.
	case served && s.sabotage != "":
		root, _ = programs.SabotagedRoot(t, s.sabotage, s.nodePath(s.root))
	case served:
		root = s.root
	}
	kubelet := s.node.KubeletRootDir
	// Detached: the plugin serves the later steps too, until this
	// function restarts it or the cluster stops.
	d.running[s.node.Name] = s.node.StartDetached(t, kubetest.Program{
		Name: "gpu-kubelet-plugin-" + p.slug,
		Args: []string{d.plugin,
			"--node-name", s.node.Name, "--namespace", s.ds.Namespace,
			"--image-name", "nvml-mock-sysfs-test", "--kubeconfig", s.c.Kubeconfig,
			"--nvidia-driver-root", d.driverRoot, "--container-driver-root", d.driverRoot,
			"--nvidia-cdi-hook-path", d.hook, "--cdi-root", s.node.Runtime.CDIDir,
			"--kubelet-registrar-directory-path", filepath.Join(kubelet, "plugins_registry"),
			"--kubelet-plugins-directory-path", filepath.Join(kubelet, "plugins")},
		Env:    []string{"MOCK_NVML_CONFIG=" + p.file, "LD_LIBRARY_PATH=" + filepath.Join(d.driverRoot, "usr/lib64")},
		Served: &hosttest.Served{Root: root},
	})
	var devices []resourcev1.Device
	proc := d.running[s.node.Name]
	s.c.Wait(t, fmt.Sprintf("%s: ResourceSlices with %d GPUs", s.node.Name, len(p.facts.GPUs)), 2*time.Minute, func() error {
		select {
		case <-proc.Exited():
			t.Fatalf("%s: the kubelet plugin exited:\n%s", s.node.Name, proc.LogTail())
		default:
		}
		var err error
		if devices, err = s.draDevices(ctx); err != nil {
			return err
		}
		if len(devices) != len(p.facts.GPUs) {
			return fmt.Errorf("%d devices in the node's slices, want %d", len(devices), len(p.facts.GPUs))
		}
		return nil
	})
	s.c.Wait(t, s.node.Name+": the kubelet registered the plugin", 2*time.Minute, registered(1))
	return devices
}

// draDevices are the devices of the DRA driver's slices of s's node.
func (s *suite) draDevices(ctx context.Context) ([]resourcev1.Device, error) {
	list, err := s.c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: draSlicesOf(s.node.Name)})
	if err != nil {
		return nil, err
	}
	var devices []resourcev1.Device
	for _, sl := range list.Items {
		devices = append(devices, sl.Spec.Devices...)
	}
	return devices, nil
}

// draSlicesOf selects the DRA driver's slices of one node.
func draSlicesOf(node string) string {
	return "spec.driver=" + fleetDriver + ",spec.nodeName=" + node
}

// testDRA restarts the driver on each node served, checks each node's
// devices carry that node's pcieRoots (the profile's root complex of each
// GPU, by bus id), then places claims: one per profile selecting its
// product by CEL lands on that profile's node; one larger than any node
// stays pending with the scheduler's reason.
func (f *fleet) testDRA(t *testing.T) {
	for i, s := range f.nodes {
		p := f.profiles[i]
		t.Run(s.node.Name, func(t *testing.T) {
			f.rows.Expect(t, "the DRA driver's slices, served", s.node.Name, fmt.Sprintf("%d GPU devices, each with its pcieRoot from %s's tree", len(p.facts.GPUs), p.name))
			if f.dra == nil {
				f.rows.NotRun(t, programs.NotRun("the DRA driver's slices", programs.GPUKubeletPlugin))
				return
			}
			f.requirePCIeRoots(t, s, p, f.dra.publish(t, s, p, true))
		})
	}
	if f.dra != nil {
		f.c.CreateDeviceClass(t, fleetDeviceClass, `device.driver == "`+fleetDriver+`" && device.attributes["`+fleetDriver+`"].type == "gpu"`)
	}
	for i, s := range f.nodes {
		p := f.profiles[i]
		t.Run("a claim for "+p.facts.GPUs[0].Name, func(t *testing.T) {
			f.rows.Expect(t, "a claim selecting `productName` "+p.facts.GPUs[0].Name+" by CEL", s.node.Name, "allocated on this node")
			if f.dra == nil {
				f.rows.NotRun(t, programs.NotRun("the fleet's claims", programs.GPUKubeletPlugin))
				return
			}
			if slices.ContainsFunc(f.profiles[:i], func(q fleetProfile) bool { return q.facts.GPUs[0].Name == p.facts.GPUs[0].Name }) {
				f.rows.NotRun(t, programs.NotRunPrefix+p.name+"'s product is an earlier node's too: no claim can tell them apart")
				return
			}
			claim := f.claim(t, "product-"+p.slug, 1, `device.attributes["`+fleetDriver+`"].productName == "`+p.facts.GPUs[0].Name+`"`)
			pod := f.claimPod(t, claim)
			got := f.c.WaitPod(t, pod.Namespace, pod.Name, 2*time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
			require.Equal(t, s.node.Name, got.Spec.NodeName, "the pod of the claim for %s", p.facts.GPUs[0].Name)
			c, err := f.c.Client.ResourceV1().ResourceClaims(claim.Namespace).Get(context.Background(), claim.Name, metav1.GetOptions{})
			require.NoError(t, err)
			require.NotNil(t, c.Status.Allocation)
			require.Equal(t, s.node.Name, c.Status.Allocation.Devices.Results[0].Pool, "the allocated device's pool is the node's")
		})
	}
	t.Run("a claim no node can satisfy", func(t *testing.T) {
		most := 0
		for _, p := range f.profiles {
			most = max(most, len(p.facts.GPUs))
		}
		f.rows.Expect(t, fmt.Sprintf("a claim for %d GPUs", most+1), "none", "pending, with the scheduler's reason")
		if f.dra == nil {
			f.rows.NotRun(t, programs.NotRun("the fleet's claims", programs.GPUKubeletPlugin))
			return
		}
		claim := f.claim(t, "too-many", most+1, "")
		pod := f.claimPod(t, claim)
		var reason string
		f.c.WaitPod(t, pod.Namespace, pod.Name, 2*time.Minute, func(p *corev1.Pod) bool {
			reason = kubetest.Unschedulable(p)
			return reason != ""
		})
		require.Contains(t, reason, kubetest.DRAUnschedulable)
		f.figure("the claim for %d GPUs: %s", most+1, reason)
	})
	f.writeObjects(t, "")
}

// requirePCIeRoots requires every device to be a GPU of p at its bus id,
// with the pcieRoot of its root complex in p, or in the suites' literal
// where the render infers it; a root neither gives (a profile without
// pcie_topology the suites have no literal of) is required present, and
// the figure says it was not compared.
func (f *fleet) requirePCIeRoots(t *testing.T, s *suite, p fleetProfile, devices []resourcev1.Device) {
	t.Helper()
	require.Len(t, devices, len(p.facts.GPUs), "%s's devices: one per GPU of %s", s.node.Name, p.name)
	byAddress := map[string]profilefacts.GPU{}
	for _, g := range p.facts.GPUs {
		byAddress[g.BusID] = g
	}
	var roots []string
	for _, d := range devices {
		bdf, ok := kubetest.StringAttribute(d, "resource.kubernetes.io/pciBusID")
		require.True(t, ok, "device %s has no pciBusID", d.Name)
		g, ok := byAddress[strings.ToLower(bdf)]
		require.True(t, ok, "device %s at %s is none of %s's GPUs", d.Name, bdf, p.name)
		root, ok := kubetest.StringAttribute(d, programs.PCIeRootAttribute)
		require.True(t, ok, "device %s (%s) has no pcieRoot", d.Name, bdf)
		if g.Root == "" {
			roots = append(roots, d.Name+" "+root+" (not given by the profile: not compared)")
			continue
		}
		require.Equal(t, g.Root, root, "device %s (%s): pcieRoot, %s", d.Name, bdf, g.RootSaid())
		roots = append(roots, d.Name+" "+root)
	}
	slices.Sort(roots)
	f.figure("%s (%s): %s", s.node.Name, p.name, strings.Join(roots, ", "))
}

// claim creates a claim for n GPUs of the fleet's class, selected by cel
// when it is not empty.
func (f *fleet) claim(t *testing.T, name string, n int, cel string) *resourcev1.ResourceClaim {
	t.Helper()
	req := resourcev1.ExactDeviceRequest{DeviceClassName: fleetDeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(n)}
	if cel != "" {
		req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: cel}}}
	}
	ns := f.nodes[0].ds.Namespace
	c, err := f.c.Client.ResourceV1().ResourceClaims(ns).Create(context.Background(), &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &req}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "create claim %s", name)
	return c
}

// claimPod is a pod of the pause image holding the claim, placed by the
// scheduler.
func (f *fleet) claimPod(t *testing.T, claim *resourcev1.ResourceClaim) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Namespace: claim.Namespace},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(claim.Name)}},
			Containers: []corev1.Container{{
				Name: "hold", Image: containerdtest.PauseImage, ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	_, err := f.c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err, "create pod %s", pod.Name)
	return pod
}

// testReprofile upgrades the release with the first worker mapped to the
// second profile, while a served reader scans each node's tree: the first
// worker's tree, labels and slices change to the new profile, every other
// tree stays byte for byte, and no reader sees a torn entry.
func (f *fleet) testReprofile(t *testing.T) {
	first, to := f.nodes[0], f.profiles[1]
	f.rows.Expect(t, "`helm upgrade`: "+first.node.Name+" mapped to "+to.name, first.node.Name, fmt.Sprintf("%s's tree, labels and slices; 0 torn entries in a served reader", to.name))
	others := map[string]map[string]string{}
	for _, s := range f.nodes[1:] {
		others[s.node.Name] = overlaytest.Snapshot(t, s.nodePath(s.root), overlaytest.SnapshotOptions{Identity: true})
	}
	readers := map[string]*corev1.Pod{}
	for _, s := range f.nodes {
		readers[s.node.Name] = s.startReader(t, s.node.Name+"-reader")
	}
	old, err := writer.ReadMarker(os.DirFS(first.nodePath(first.root)))
	require.NoError(t, err)
	upgraded := time.Now()
	f.helmRun(t, "upgrade", fleetRelease, filepath.Join(f.repo, chartDir), "--namespace", first.ds.Namespace, "--values", f.values(t, to),
		"--set", "nri.enabled=true")
	first.waitNewTree(t, first.node.Name+": "+to.name+"'s tree", old)
	took := time.Since(upgraded)
	first.c.Wait(t, first.node.Name+": the DaemonSet's pod Ready", time.Minute, func() error { return first.daemonSetPodReady(t) })
	first.requireTree(t, to)
	for _, s := range f.nodes {
		totals := s.stopReader(t, readers[s.node.Name])
		f.figure("reader on %s: %d scans, %d torn, views %v", s.node.Name, totals.Scans, totals.Torn, totals.Views)
	}
	f.figure("helm upgrade -> %s's new tree in %s (serve reads the map through the API: no kubelet's ConfigMap sync, then its render)", first.node.Name, took.Round(time.Millisecond))
	for _, s := range f.nodes[1:] {
		t.Run(s.node.Name, func(t *testing.T) {
			f.rows.Expect(t, "`helm upgrade`: "+first.node.Name+" mapped to "+to.name, s.node.Name, "its tree unchanged, byte for byte; 0 torn entries in a served reader")
			overlaytest.RequireSameTree(t, others[s.node.Name], overlaytest.Snapshot(t, s.nodePath(s.root), overlaytest.SnapshotOptions{Identity: true}), s.node.Name+"'s tree")
		})
	}
	first.key = to.key
	f.profiles[0] = to
	t.Run("slices", func(t *testing.T) {
		f.rows.Expect(t, "`helm upgrade`: the DRA driver restarted", first.node.Name, to.name+"'s GPUs and pcieRoots; every other node's slices as they were")
		if f.dra == nil {
			f.rows.NotRun(t, programs.NotRun("the DRA driver's slices after the re-profile", programs.GPUKubeletPlugin))
			return
		}
		f.requirePCIeRoots(t, first, to, f.dra.publish(t, first, to, true))
		// The other nodes' slices stay: the first's restart touched none.
		for i, s := range f.nodes[1:] {
			devices, err := s.draDevices(context.Background())
			require.NoError(t, err)
			f.requirePCIeRoots(t, s, f.profiles[i+1], devices)
		}
	})
	// The labels last: a node the labellers were not served stops this
	// step, and the slices' row is judged first.
	labels := f.labelNode(t, first, to)
	f.figure("after the re-profile: %s %s=%s %s=%s", first.node.Name, labelProduct, labels[labelProduct], labelCount, labels[labelCount])
}

// testUninstall uninstalls the release: the DaemonSet's pods go, and each
// node keeps its tree and its spec, as after SIGTERM.
func (f *fleet) testUninstall(t *testing.T) {
	f.rows.Expect(t, "`helm uninstall`", "every node", "the pods gone; each node's tree and spec stay")
	ns := f.nodes[0].ds.Namespace
	f.helmRun(t, "uninstall", fleetRelease, "--namespace", ns, "--wait")
	f.c.Wait(t, "the DaemonSet's pods gone", 2*time.Minute, func() error {
		list, err := f.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(f.nodes[0].ds.Spec.Selector)})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d pods left", len(list.Items))
		}
		return err
	})
	_, err := f.c.Client.AppsV1().DaemonSets(ns).Get(context.Background(), fleetRelease, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the DaemonSet: %v", err)
	for _, s := range f.nodes {
		_, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
		require.NoError(t, err, "%s's tree stays", s.node.Name)
		_, err = os.Stat(s.nodePath(s.spec))
		require.NoError(t, err, "%s's spec stays", s.node.Name)
	}
}

// writeObjects writes what the suite judged, as the API server returns
// them, into the objects' directory (or its subdirectory sub): the Nodes,
// the slices and the claims.
func (f *fleet) writeObjects(t *testing.T, sub string) {
	ctx := context.Background()
	dir := filepath.Join(f.objects, sub)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	nodes, err := f.c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, dir, "nodes.json", nodes)
	slicesList, err := f.c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, dir, "resourceslices.json", slicesList)
	claims, err := f.c.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, dir, "resourceclaims.json", claims)
}
