// Package node_test runs the deploy path on a real single-node Kubernetes
// (kubetest), as a user runs it: the standalone ConfigMap applied through
// the API server and the chart installed with nri.enabled, as the README's
// quick start does, GPU Feature Discovery and nfd-worker in pods that ask
// for nothing, served the tree by serve --nri (the DaemonSet is the node's
// NRI plugin), their labels reaching the Node through the NodeFeature API
// and nfd-master, a re-profile through the ConfigMap, and the DaemonSet's
// deletion. Every check reads the API server, the node's paths or the
// pods' own logs; each has a negative control.
package node_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func TestMain(m *testing.M) { os.Exit(hosttest.MainAlone(m)) }

const (
	// reprofileTo is the profile the ConfigMap is changed to: four GPUs
	// (the standalone ConfigMap has eight) and an HCA beside each, so
	// gpu.count, gpu.machine and nfd-worker's pci-15b3 all change. The
	// built-in names no machine (GFD would label it unknown), so the
	// ConfigMap gives it one, the documented way: system.product_name.
	reprofileTo        = "gb200-tray"
	reprofileToMachine = "GB200 compute tray"
	// badProfile fails the profile check at one field.
	badProfile = "testdata/hostile/link-gen-is-a-float.yaml"
	// serviceAccount is the labellers' (GFD's, nfd-worker's) account.
	serviceAccount = "node-labeller"
	// profileVolume is where the labeller pods mount nvml-mock's
	// ConfigMap, as nvml-mock's DaemonSet and ours do: the mock NVML reads
	// the profile the tree is rendered from.
	profileDir = "/etc/nvml-mock"
	// objectsName is this suite's directory below kubetest.ObjectsEnv's: the
	// profile it deploys, the standalone ConfigMap's.
	objectsName = "standalone-h100"
	// Label keys judged on the Node.
	labelMode    = "nvidia.com/gpu.mode"
	labelCount   = "nvidia.com/gpu.count"
	labelMachine = "nvidia.com/gpu.machine"
	labelNVIDIA  = "feature.node.kubernetes.io/pci-10de.present"
	labelHCA     = "feature.node.kubernetes.io/pci-15b3.present"
	nfdLabelPref = "feature.node.kubernetes.io/pci-"
	labelTimeout = 2 * time.Minute
)

// gpuOperatorPCI is nfd-worker's PCI source as the GPU Operator deploys it
// (docs/user/kubernetes.md, "nfd-worker and the HCAs").
var gpuOperatorPCI = struct{ classes, fields []string }{
	classes: []string{"02", "0200", "0207", "0300", "0302"},
	fields:  []string{"vendor"},
}

// suite is the node and what the steps share. The fleet (fleet_test.go)
// has one per worker, on one cluster.
type suite struct {
	c        *kubetest.Cluster
	node     *kubetest.Node // the node the suite's pods run on
	repo     string
	objects  string // bin/k8s/<objectsName>/: the objects judged
	ds       appsv1.DaemonSet
	cm       corev1.ConfigMap
	key      string // the ConfigMap's profile key
	root     string // the tree's node path (--root)
	spec     string // the CDI spec's node path (--output)
	nvml     programs.NVML
	gfd, nfd string // build directories
	rows     docmatrix.Rows
	sabotage string // programs.Sabotage's: the served labellers go unserved
	figures  []string
	reprof   reprofile
}

// reprofile is reprofile.json: the ConfigMap swap's timings.
type reprofile struct {
	From               string            `json:"from"`
	To                 string            `json:"to"`
	APIUpdate          time.Time         `json:"apiUpdate"`
	VolumeSwapped      time.Time         `json:"volumeSwapped"`
	TreeRendered       time.Time         `json:"treeRendered"`
	UpdateToSwap       time.Duration     `json:"updateToSwapNs"`
	SwapToTree         time.Duration     `json:"swapToTreeNs"`
	UpdateToTree       time.Duration     `json:"updateToTreeNs"`
	KubeletSyncPeriod  time.Duration     `json:"kubeletSyncPeriodNs"`
	ReaderScans        int               `json:"readerScans"`
	ReaderTorn         int               `json:"readerTorn"`
	ReaderViews        []int             `json:"readerViews"`
	LabelsAfterGFD     map[string]string `json:"labelsAfterGFD"`
	ExpectedGPUs       int               `json:"expectedGPUs"`
	ExpectedMachine    string            `json:"expectedMachine"`
	UpdateToSwapString string            `json:"updateToSwap"`
	SwapToTreeString   string            `json:"swapToTree"`
}

// kubeletSyncPeriod is the kubelet's syncFrequency, its default (the
// harness sets none): a ConfigMap volume is refreshed on a pod's periodic
// sync, at most this long (jittered) after the change reached the
// kubelet's cache.
const kubeletSyncPeriod = time.Minute

// TestNode deploys and checks, step after step; each step needs the
// DaemonSet the first applies.
func TestNode(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	s := &suite{repo: overlaytest.Repo(t), objects: kubetest.ObjectsDir(t, objectsName), sabotage: programs.Sabotage(t)}
	s.nvml = programs.NeedNVML(t)
	s.gfd = programs.Need(t, programs.GFD())
	s.nfd = programs.Need(t, programs.NFDWorker())
	master := programs.NeedBinary(t, programs.NFDMaster())
	bin := hosttest.BuildBinary(t)

	m := podtest.DecodeManifests(t, filepath.Join(s.repo, "deploy/kubernetes/standalone"))
	require.Len(t, m.ConfigMaps, 1)
	s.cm = m.ConfigMaps[0]
	for k := range s.cm.Data {
		s.key = k
	}
	// The chart with nri.enabled renders this DaemonSet
	// (TestHelmNRIRendersTheRawNRIDaemonSet).
	ds := podtest.DecodeManifests(t, filepath.Join(s.repo, "deploy/kubernetes/nri"))
	require.Len(t, ds.DaemonSets, 1)
	s.ds = ds.DaemonSets[0]
	args := s.ds.Spec.Template.Spec.Containers[0].Args
	s.root, s.spec = podtest.FlagValue(args, "--root"), podtest.FlagValue(args, "--output")

	s.c = kubetest.Start(t, kubetest.Options{})
	s.node = s.c.Nodes[0]
	// The kubelet pulls nothing: each image is imported first, under the
	// name the kubelet asks containerd for.
	s.c.Runtime.Import(t, containerdtest.BinaryImage(t, containerdtest.NormalizedImage(s.ds.Spec.Template.Spec.Containers[0].Image), bin), containerdtest.CRINamespace)
	s.c.Runtime.Import(t, containerdtest.ConsumerBaseImage(), containerdtest.CRINamespace)
	s.c.Runtime.Import(t, containerdtest.ReaderBaseImage(t), containerdtest.CRINamespace)
	helm := programs.NeedBinary(t, programs.Helm())
	// The Node's labels come from NodeFeature objects, which nfd-master
	// turns into labels, for the whole suite.
	s.c.Apply(t, nfdCRDs(t))
	s.c.Start(t, kubetest.Program{Name: "nfd-master", Args: []string{master, "-kubeconfig", s.c.Kubeconfig, "-port", "8081"},
		Env: []string{"NODE_NAME=" + kubetest.NodeName, "POD_NAMESPACE=" + s.ds.Namespace}})

	// Every step needs the DaemonSet applied; a failure after that stops
	// nothing, so a sabotaged run reaches every step and shows each
	// served row red, beside the rows that must stay green.
	runSteps(t, []step{
		{"the quick start installs a Ready DaemonSet that renders", func(t *testing.T) { s.testApply(t, helm) }, false},
		{"GFD labels the Node", s.testGFD, true},
		{"nfd-worker labels the Node", s.testNFDWorker, true},
		{"GFD's own chart labels the Node", s.testStockGFD, true},
		{"the GPU Operator's operand gate", s.testOperandGate, true},
		{"a re-profile through the ConfigMap", s.testReprofile, true},
		{"E2E_PROFILES through the ConfigMap", s.testExtraProfiles, true},
		{"a bad profile makes the pod not Ready", s.testBadProfile, true},
		{"deleting the DaemonSet", s.testDelete, false},
	})
	s.c.Stop(t)
	t.Run("nothing is left on the host", func(t *testing.T) {
		s.rows.Expect(t, "after the suite", "nothing on the host (sysctls, kubelet directories, cgroups, processes, mounts)")
		require.Empty(t, s.c.Leftovers())
	})
	s.report(t)
}

// step is one step of a suite, run as a subtest.
type step struct {
	name string
	run  func(*testing.T)
	next bool // the next step runs even if this one failed
}

// runSteps runs the steps in order, until one fails whose next is false.
// A step that passed after another failed does not stop the rest: a
// sabotaged run, whose served rows fail, reaches every row.
func runSteps(t *testing.T, steps []step) {
	for _, step := range steps {
		if !t.Run(step.name, step.run) && !step.next {
			return
		}
	}
}

// nodePath is where the test finds a path of the suite's node.
func (s *suite) nodePath(path string) string {
	return s.node.ProcPath(path)
}

// facts are a profile text's facts as the suite's own reader reads them
// (profilefacts: apart from the renderer), with the suites' literal where
// literal names one of their own profiles (empty: none).
func facts(t *testing.T, name, literal, text string) *profilefacts.Profile {
	t.Helper()
	p, err := profilefacts.Parse(name, []byte(text))
	require.NoError(t, err)
	require.NoError(t, p.Literal(literal))
	return p
}

// standaloneLiteral names the standalone ConfigMap's profile in the
// suites' literals: its H100s name no machine, so the board's (DGX H100)
// is our inference, judged against the literal.
const standaloneLiteral = "nvml-mock-config"

// daemonSetPod is the DaemonSet's one pod on the suite's node.
func (s *suite) daemonSetPod(t *testing.T) *corev1.Pod {
	t.Helper()
	list, err := s.c.Client.CoreV1().Pods(s.ds.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: metav1.FormatLabelSelector(s.ds.Spec.Selector), FieldSelector: "spec.nodeName=" + s.node.Name})
	require.NoError(t, err)
	require.Len(t, list.Items, 1, "the DaemonSet's pods on %s", s.node.Name)
	return &list.Items[0]
}

// The README's Kubernetes quick start's lines this suite runs: the
// standalone ConfigMap, applied, and the chart, installed.
const (
	quickStartApply   = "kubectl apply --server-side -f "
	quickStartInstall = "helm install "
)

// testApply runs the README's Kubernetes quick start's lines, in its order,
// as its kubectl and helm lines do (the API server for the first, the Helm
// CLI against the cluster for the second), and checks the pod, the tree and
// the spec.
func (s *suite) testApply(t *testing.T, helm string) {
	s.rows.Expect(t, "the README quick start's `kubectl apply --server-side` and `helm install --set nri.enabled=true` lines", "the pod Running and Ready by its probe (registered as the node's NRI plugin), 1 ready pod, tree and spec at the chart's node paths")
	ctx := context.Background()
	var applied []string
	var install []string
	for _, step := range overlaytest.ReadmeShell(t)["Kubernetes quick start"] {
		if file, ok := strings.CutPrefix(step, quickStartApply); ok {
			applied = append(applied, file)
		}
		if rest, ok := strings.CutPrefix(step, quickStartInstall); ok {
			install = strings.Fields(rest)
		}
	}
	require.Equal(t, []string{"deploy/kubernetes/standalone/nvml-mock-config.yaml"}, applied, "the quick start applies the standalone ConfigMap")
	require.Equal(t, []string{"nvml-mock-sysfs", "deploy/helm/nvml-mock-sysfs", "-n", s.ds.Namespace, "--set", "nri.enabled=true"}, install,
		"the quick start installs the chart as the node's NRI plugin, in the ConfigMap's namespace")
	began := time.Now()
	s.c.Apply(t, filepath.Join(s.repo, applied[0]))
	install[1] = filepath.Join(s.repo, install[1])
	out, err := s.c.Run(programs.HelmEnv(t.TempDir()), helm, append([]string{"install"}, install...)...)
	require.NoError(t, err)
	t.Logf("helm install:\n%s", out)
	s.c.Wait(t, "DaemonSet "+s.ds.Name+": 1 ready pod", 3*time.Minute, func() error {
		d, err := s.c.Client.AppsV1().DaemonSets(s.ds.Namespace).Get(ctx, s.ds.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.NumberReady != 1 || d.Status.DesiredNumberScheduled != 1 {
			return fmt.Errorf("desired %d, ready %d\nevents:\n%s", d.Status.DesiredNumberScheduled, d.Status.NumberReady, s.c.Events(s.ds.Namespace))
		}
		return nil
	})
	readyIn := time.Since(began)
	pod := s.daemonSetPod(t)
	require.Equal(t, corev1.PodRunning, pod.Status.Phase)
	require.True(t, kubetest.PodReady(pod), "Ready: %+v", pod.Status.Conditions)
	require.Zero(t, pod.Status.ContainerStatuses[0].RestartCount)

	want := facts(t, s.key, standaloneLiteral, s.cm.Data[s.key])
	_, err = writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
	require.NoError(t, err, "a complete tree at the node's %s", s.root)
	require.Equal(t, len(want.GPUs), s.servedGPUs(t), "the tree has the ConfigMap's GPUs, as ghw lists them")
	spec, err := cdi.ReadSpec(s.nodePath(s.spec), 0)
	require.NoError(t, err, "the CDI spec at the node's %s", s.spec)
	require.NotEmpty(t, spec.Devices)
	hosttest.RequireMountSet(t, spec.Devices[0].ContainerEdits.Mounts, s.root, s.ds.Spec.Template.Spec.Containers[0].Args)
	d, err := s.c.Client.AppsV1().DaemonSets(s.ds.Namespace).Get(ctx, s.ds.Name, metav1.GetOptions{})
	require.NoError(t, err)
	kubetest.WriteObject(t, s.objects, "daemonset.json", d)
	s.figure("quick start applied and installed -> 1 ready pod, registered as the NRI plugin, in %s", readyIn.Round(time.Millisecond))
}

// labellerAccess makes the labellers' ServiceAccount, allowed what GFD
// and nfd-worker ask of the API server: NodeFeature objects, and the Node.
func (s *suite) labellerAccess(t *testing.T) {
	ctx := context.Background()
	ns := s.ds.Namespace
	_, err := s.c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"nfd.k8s-sigs.io"}, Resources: []string{"nodefeatures"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"get", "list"}},
	}
	// docs/evidence/kubernetes.md says what the labellers are allowed: the same.
	page, err := os.ReadFile(kubernetesPage().Path)
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(page)), " ")
	for _, r := range rules {
		said := "(" + strings.Join(r.Verbs, ", ") + ")"
		if r.APIGroups[0] != "" {
			said = "(`" + r.APIGroups[0] + "`: " + strings.Join(r.Verbs, ", ") + ")"
		}
		require.Contains(t, text, said, "%s says the labellers' verbs on %v", kubernetesPage().Path, r.Resources)
	}
	_, err = s.c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccount}, Rules: rules,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = s.c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: serviceAccount},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: ns}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// labellerPod is a run-to-completion pod of one consumer container: the
// consumer image with the host's /usr, the build and the mock NVML
// (hostPath volumes), nvml-mock's ConfigMap at /etc/nvml-mock, the
// labellers' ServiceAccount, the node's network (the API server is on its
// loopback), and the extra mounts. served gives the container our device
// (serve), as a sabotaged run has it.
func (s *suite) labellerPod(t *testing.T, name, container, build string, inv programs.Invocation, served bool, extra ...containerdtest.Mount) *corev1.Pod {
	volumes, mounts := kubetest.HostPathVolumes("consumer", append(containerdtest.ConsumerMounts(build, s.nvml.Dir), extra...))
	volumes = append(volumes, corev1.Volume{Name: "profile", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: s.cm.Name}}}})
	mounts = append(mounts, corev1.VolumeMount{Name: "profile", MountPath: profileDir, ReadOnly: true})
	env := s.c.InClusterEnv()
	for _, e := range inv.Env {
		k, v, _ := strings.Cut(e, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	fieldEnv := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	// GFD reads NODE_NAME and NAMESPACE, nfd-worker NODE_NAME and
	// KUBERNETES_NAMESPACE (or its ServiceAccount's namespace file).
	for _, e := range []corev1.EnvVar{fieldEnv("NODE_NAME", "spec.nodeName"), fieldEnv("NAMESPACE", "metadata.namespace"), fieldEnv("KUBERNETES_NAMESPACE", "metadata.namespace")} {
		if !slices.ContainsFunc(env, func(have corev1.EnvVar) bool { return have.Name == e.Name }) {
			env = append(env, e)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ds.Namespace},
		Spec: corev1.PodSpec{
			NodeName:           s.node.Name,
			ServiceAccountName: serviceAccount,
			HostNetwork:        true,
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: container, Image: containerdtest.ConsumerImage, ImagePullPolicy: corev1.PullNever,
				Command: inv.Args, Env: env, VolumeMounts: mounts,
			}},
			Volumes: volumes,
		},
	}
	if served {
		s.serve(t, pod, container)
	} else {
		optOut(pod)
	}
	return pod
}

// serve gives the pod's container our device: serve --nri, the node's NRI
// plugin, serves every pod that does not opt out, so a served pod needs
// nothing.
//
// A sabotaged run serves something else, so that the served rows that
// need our tree turn red: no-tree serves nothing (the pod opts out);
// escaped serves, by hostPath volumes, a copy of the DaemonSet's tree as
// it is now with plainly escaped links (hosttest.PlainLinksCopy), which
// every reader here resolves but deviceattribute's pcieRoot would refuse.
func (s *suite) serve(t *testing.T, pod *corev1.Pod, container string) {
	t.Helper()
	switch s.sabotage {
	case programs.SabotageNoTree:
		optOut(pod)
	case programs.SabotageEscaped:
		s.serveRoot(t, pod, container, hosttest.PlainLinksCopy(t, s.nodePath(s.root)))
	}
}

// optOut keeps serve --nri from serving a pod: a control that must run
// without our tree.
func optOut(pod *corev1.Pod) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[nriplugin.InjectAnnotation] = "false"
}

// serveRoot gives the pod's container a tree other than the DaemonSet's
// (which serve --nri serves), by hostPath volumes of the mounts and the
// variables the CDI spec would hold for it (cdispec.Mounts and cdispec.Env,
// their one home), the DaemonSet's --also-at included; the pod opts out of
// serve --nri.
func (s *suite) serveRoot(t *testing.T, pod *corev1.Pod, container, root string) {
	t.Helper()
	optOut(pod)
	// The container root the render recorded (the DaemonSet's
	// --container-root), where its links point.
	containerRoot, err := cdispec.ServedContainerRoot(os.DirFS(s.nodePath(root)), root, "")
	require.NoError(t, err)
	mounts, err := cdispec.Mounts(root, containerRoot, []string{programs.NFDHostPCIDevices})
	require.NoError(t, err, "the mounts of %s", root)
	var cm []containerdtest.Mount
	for _, m := range mounts {
		cm = append(cm, containerdtest.Mount{HostPath: m.Source, ContainerPath: m.Destination, ReadOnly: true})
	}
	volumes, volumeMounts := kubetest.HostPathVolumes("served", cm)
	pod.Spec.Volumes = append(pod.Spec.Volumes, volumes...)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != container {
			continue
		}
		c.VolumeMounts = append(c.VolumeMounts, volumeMounts...)
		for _, e := range cdispec.Env(os.DirFS(s.nodePath(root)), containerRoot) {
			k, v, _ := strings.Cut(e, "=")
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
		}
	}
}

// servedGPUs counts the NVIDIA display-class devices ghw lists in the
// DaemonSet's tree, served as a container gets it: the count as a consumer
// reads it, not the writer's own marker.
func (s *suite) servedGPUs(t *testing.T) int {
	t.Helper()
	// A copy: the node's tree lies in its own mount namespace, which a
	// bind mount cannot take a source from.
	root := filepath.Join(t.TempDir(), "tree")
	out, err := exec.Command("cp", "-a", s.nodePath(s.root), root).CombinedOutput()
	require.NoError(t, err, "copy the node's tree: %s", out)
	containerRoot, err := cdispec.ServedContainerRoot(os.DirFS(root), root, "")
	require.NoError(t, err)
	cmd := programs.GHWListRun{Binary: programs.NeedBinary(t, programs.GHWList())}.Invocation().In(hosttest.Served{Root: root, ContainerRoot: containerRoot})
	out, err = cmd.Output()
	require.NoError(t, err, "ghw-list in the served tree")
	devices, err := programs.ParseGHWDevices(out)
	require.NoError(t, err)
	n := 0
	for _, d := range devices {
		if d.Vendor == "10de" && d.Class == "03" {
			n++
		}
	}
	return n
}

// servedBy names how the served pods get our device, for the rows.
const servedBy = "serve --nri, the pod asking nothing"

// gfdPod runs GFD once, publishing a NodeFeature object. A served pod
// reads the render's machine type: our CDI device sets GFD's
// GFD_MACHINE_TYPE_FILE (cdispec.MachineTypeFileEnv) to it.
func (s *suite) gfdPod(t *testing.T, name string, served bool) *corev1.Pod {
	run := programs.GFDRun{
		Binary:         containerdtest.InConsumerBuild + "/gpu-feature-discovery",
		NVMLDir:        containerdtest.InMockNVML,
		Profile:        profileDir + "/" + s.key,
		NodeFeatureAPI: true,
	}
	return s.labellerPod(t, name, "gpu-feature-discovery", s.gfd, run.Invocation(), served)
}

// nodeLabels are the Node's labels now.
func (s *suite) nodeLabels(t *testing.T) map[string]string {
	t.Helper()
	n, err := s.c.Client.CoreV1().Nodes().Get(context.Background(), s.node.Name, metav1.GetOptions{})
	require.NoError(t, err)
	return n.Labels
}

// waitLabels waits until the Node's labels satisfy ok (nil when they do,
// else what is missing) and returns them.
func (s *suite) waitLabels(t *testing.T, what string, ok func(map[string]string) error) map[string]string {
	t.Helper()
	var labels map[string]string
	s.c.Wait(t, "Node "+what, labelTimeout, func() error {
		labels = s.nodeLabels(t)
		if err := ok(labels); err != nil {
			return fmt.Errorf("%w; labels %v", err, labels)
		}
		return nil
	})
	return labels
}

// wantLabels is a waitLabels condition: every key with its value.
func wantLabels(want map[string]string) func(map[string]string) error {
	return func(got map[string]string) error {
		for k, v := range want {
			if got[k] != v {
				return fmt.Errorf("%s=%q, want %q", k, got[k], v)
			}
		}
		return nil
	}
}

// machineLabel is the nvidia.com/gpu.machine GFD must put on the Node for
// a profile, and how a row says it: the profile's system.product_name,
// else the suites' literal of its board's machine (the render's
// inference, said so), made a label value as GFD makes it. It comes from
// the profile, not from the tree at the node, so a render that wrote the
// wrong machine fails the check. Empty where neither gives one (a PCIe
// board's, or a profile the suites have no literal of): GFD then labels
// the node's own DMI name, which the check could not tell from a wrong
// render, and the row says it is not judged.
func machineLabel(p *profilefacts.Profile) (label, said string) {
	switch {
	case p.MachineFrom == "":
		return "", "not judged (the profile names no machine, and the suites have no literal of its board's)"
	case p.Machine == "":
		return "", "not judged (a PCIe board's profile: no machine)"
	}
	label = programs.GFDMachineLabel(p.Machine)
	if p.MachineFrom == profilefacts.FromLiteral {
		return label, label + " (" + profilefacts.FromLiteral + ")"
	}
	return label, label
}

// requireMachineLabel is machineLabel for a step that judges the machine:
// its profile must give one.
func requireMachineLabel(t *testing.T, p *profilefacts.Profile) (label, said string) {
	t.Helper()
	label, said = machineLabel(p)
	require.NotEmpty(t, label, "%s: the step judges gpu.machine, so its profile must give one: %s", p.File, said)
	return label, said
}

// nfdCRDs is the NodeFeature CRDs' file in node-feature-discovery's
// module, which the Go module proxy serves (and nfd-master's build
// fetched).
func nfdCRDs(t *testing.T) string {
	t.Helper()
	return filepath.Join(moduleDir(t, programs.NFDModule, programs.NFDVersion), "deployment/base/nfd-crds/nfd-api-crds.yaml")
}

// moduleDir is a module's directory in the module cache, as the Go module
// proxy's zip of it holds it (the programs' builds fetched it).
func moduleDir(t *testing.T, module, version string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	require.NoError(t, err, "go mod download %s@%s", module, version)
	var mod struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &mod))
	return mod.Dir
}

// testGFD runs GFD in pods: first one not served the tree (the negative
// control), then one served.
func (s *suite) testGFD(t *testing.T) {
	s.labellerAccess(t)
	want := facts(t, s.key, standaloneLiteral, s.cm.Data[s.key])

	t.Run("not served", func(t *testing.T) {
		s.rows.Expect(t, "GFD pod not served our device (`--use-node-feature-api`, nfd-master)", "the pod fails: GFD reads each GPU's PCI vendor from sysfs; no `"+labelMode+"` on the Node")
		// GFD v0.17.4 stops at the first GPU NVML lists that sysfs lacks
		// (later sources label gpu.mode=unknown instead).
		done, log := s.c.RunPodToEnd(t, s.gfdPod(t, "gfd-unserved", false))
		require.Equal(t, corev1.PodFailed, done.Status.Phase, "log:\n%s", log)
		require.Contains(t, log, "unable to read PCI device vendor id", "GFD's own reason")
		require.NotContains(t, s.nodeLabels(t), labelMode)
	})
	t.Run("served", func(t *testing.T) {
		machine, said := requireMachineLabel(t, want)
		s.rows.Expect(t, "GFD pod served our device", fmt.Sprintf("Node `%s=compute`, `%s=%d`, `%s` %s (by %s; %s)", labelMode, labelCount, len(want.GPUs), labelMachine, said, servedBy, s.nvml.Name()))
		began := time.Now()
		s.c.RunPod(t, s.gfdPod(t, "gfd-served", true))
		labels := s.waitLabels(t, "GFD's labels", wantLabels(map[string]string{
			labelMode: "compute", labelCount: fmt.Sprint(len(want.GPUs)), labelMachine: machine,
		}))
		s.figure("GFD pod created -> Node %s=%s %s=%s %s=%s in %s", labelMode, labels[labelMode], labelCount, labels[labelCount], labelMachine, labels[labelMachine], time.Since(began).Round(time.Millisecond))
		keys, header, row := s.readmeLabels(t)
		require.Equal(t, []string{labelMode, labelCount, labelMachine}, keys, "the README's kubectl get nodes -L shows the labels judged here")
		var values []string
		for i, k := range keys {
			require.Equal(t, strings.ToUpper(k[strings.LastIndex(k, "/")+1:]), header[i], "the README sample's column of %s", k)
			values = append(values, labels[k])
		}
		require.Equal(t, values, row, "the README's sample row against this Node's labels")
	})
}

// readmeLabels reads the README's Kubernetes quick start: the label keys
// its kubectl get nodes line asks for with -L, and the label columns'
// header and values in its sample output (kubectl's last columns, one per
// key, headed by the key's name after its prefix, upper-cased).
func (s *suite) readmeLabels(t *testing.T) (keys, header, row []string) {
	t.Helper()
	for _, step := range overlaytest.ReadmeShell(t)["Kubernetes quick start"] {
		if f := strings.Fields(step); len(f) > 3 && strings.Join(f[:3], " ") == "kubectl get nodes" {
			for i, w := range f {
				if w == "-L" && i+1 < len(f) {
					keys = append(keys, f[i+1])
				}
			}
		}
	}
	require.NotEmpty(t, keys, "README: the quick start's kubectl get nodes -L line")
	readme, err := os.ReadFile(filepath.Join(s.repo, "README.md"))
	require.NoError(t, err)
	lines := strings.Split(string(readme), "\n")
	for i, line := range lines[:len(lines)-1] {
		if f := strings.Fields(line); len(f) > len(keys) && f[0] == "NAME" {
			r := strings.Fields(lines[i+1])
			require.Len(t, r, len(f), "README: the sample row under %q", line)
			return keys, f[len(f)-len(keys):], r[len(r)-len(keys):]
		}
	}
	t.Fatal("README: no sample output of kubectl get nodes (a NAME header line)")
	return nil, nil, nil
}

// nfdPod runs nfd-worker once, configured as the GPU Operator deploys it
// (the node's /sys read-only at /host-sys, where the worker reads it),
// publishing its NodeFeature object. Served, the links directory is
// mounted over /host-sys/bus/pci/devices; the node's own devices' links
// resolve into /host-sys/devices.
func (s *suite) nfdPod(t *testing.T, name string, served bool) *corev1.Pod {
	return s.nfdWorkerPod(t, name, served, false)
}

// nfdWorkerPod is nfdPod, with local the worker's local source too: the
// feature files of the node's features.d (GFD's, from its own chart),
// mounted where the worker reads them, as node-feature-discovery's chart
// mounts them.
func (s *suite) nfdWorkerPod(t *testing.T, name string, served, local bool) *corev1.Pod {
	inv, err := programs.NFDWorkerRun{
		Binary:               containerdtest.InConsumerBuild + "/nfd-worker",
		NodeName:             s.node.Name,
		DeviceClassWhitelist: gpuOperatorPCI.classes,
		DeviceLabelFields:    gpuOperatorPCI.fields,
		Publish:              true,
		Local:                local,
	}.Invocation()
	require.NoError(t, err)
	mounts := []containerdtest.Mount{{HostPath: "/sys", ContainerPath: "/host-sys", ReadOnly: true}}
	if local {
		mounts = append(mounts, containerdtest.Mount{HostPath: programs.NFDFeaturesDir, ContainerPath: programs.NFDFeaturesDir, ReadOnly: true})
	}
	return s.labellerPod(t, name, "nfd-worker", s.nfd, inv, served, mounts...)
}

// pciLabels are nfd-worker's PCI labels among the Node's.
func pciLabels(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if strings.HasPrefix(k, nfdLabelPref) {
			out[k] = v
		}
	}
	return out
}

// testNFDWorker runs nfd-worker in a pod not served the tree (the node's
// own devices only: the negative control), then in a served one, whose
// links directory is at /host-sys/bus/pci/devices.
func (s *suite) testNFDWorker(t *testing.T) {
	var own map[string]string
	t.Run("not served", func(t *testing.T) {
		s.rows.Expect(t, "nfd-worker pod not served our device (GPU Operator's PCI classes)", "no `"+labelNVIDIA+"`; the node's own devices' labels")
		t.Logf("nfd-worker's log:\n%s", s.c.RunPod(t, s.nfdPod(t, "nfd-worker-unserved", false)))
		labels := s.waitLabels(t, "nfd-worker's labels of the node's own devices", func(l map[string]string) error {
			if len(pciLabels(l)) == 0 {
				return fmt.Errorf("no %s* label", nfdLabelPref)
			}
			return nil
		})
		own = pciLabels(labels)
		require.NotContains(t, own, labelNVIDIA)
	})
	t.Run("served", func(t *testing.T) {
		s.rows.Expect(t, "nfd-worker pod served our device (links at `/host-sys/bus/pci/devices`)", "Node `"+labelNVIDIA+"`, the node's own devices' labels kept (by "+servedBy+")")
		t.Logf("nfd-worker's log:\n%s", s.c.RunPod(t, s.nfdPod(t, "nfd-worker-served", true)))
		labels := s.waitLabels(t, labelNVIDIA, wantLabels(map[string]string{labelNVIDIA: "true"}))
		for k, v := range own {
			require.Equal(t, v, labels[k], "the node's own device label %s stays", k)
		}
		require.NotContains(t, labels, labelHCA, "the standalone profile has no HCAs")
		n, err := s.c.Client.CoreV1().Nodes().Get(context.Background(), s.node.Name, metav1.GetOptions{})
		require.NoError(t, err)
		kubetest.WriteObject(t, s.objects, "node.json", n)
		s.figure("Node PCI labels: unserved %v, served %v", keys(own), keys(pciLabels(labels)))
	})
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, strings.TrimPrefix(k, nfdLabelPref))
	}
	slices.Sort(out)
	return out
}

// updateProfile puts text under the ConfigMap's key through the API
// server, returning when the server has it.
func (s *suite) updateProfile(t *testing.T, text string) time.Time {
	t.Helper()
	ctx := context.Background()
	cm, err := s.c.Client.CoreV1().ConfigMaps(s.cm.Namespace).Get(ctx, s.cm.Name, metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data[s.key] = text
	_, err = s.c.Client.CoreV1().ConfigMaps(s.cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldValidation: metav1.FieldValidationStrict})
	require.NoError(t, err)
	return time.Now()
}

// profileVolumeData is the ..data link of the DaemonSet pod's ConfigMap
// volume, which the kubelet swaps atomically when the ConfigMap changed.
func (s *suite) profileVolumeData(pod *corev1.Pod) string {
	var volume string
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil {
			volume = v.Name
		}
	}
	return s.node.ProcPath(filepath.Join(s.node.KubeletRootDir, "pods", string(pod.UID), "volumes/kubernetes.io~configmap", volume, "..data"))
}

// containerID is a pod's container as CRI names it.
func containerID(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	require.NotEmpty(t, pod.Status.ContainerStatuses)
	_, id, ok := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	require.True(t, ok, "container id %q", pod.Status.ContainerStatuses[0].ContainerID)
	return id
}

// withProductName is the profile file's text with system.product_name
// set.
func withProductName(t *testing.T, file, name string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(data, &doc))
	system, _ := doc["system"].(map[string]any)
	if system == nil {
		system = map[string]any{}
	}
	system["product_name"] = name
	doc["system"] = system
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	return string(out)
}

// testReprofile changes the ConfigMap to another profile while a served
// reader scans, times the kubelet's volume swap and serve's re-render,
// and has GFD and nfd-worker label the new profile.
func (s *suite) testReprofile(t *testing.T) {
	s.rows.Expect(t, "ConfigMap updated through the API to built-in "+reprofileTo+" (system.product_name "+reprofileToMachine+")", "tree re-rendered, 0 torn entries in a served reader throughout; GFD and nfd-worker label the new profile")
	text := withProductName(t, programs.BuiltinProfile(t, reprofileTo), reprofileToMachine)
	want := facts(t, reprofileTo, "", text)
	require.Equal(t, reprofileToMachine, want.Machine)
	require.Contains(t, text, "\ninfiniband:", "%s has HCAs", reprofileTo)
	pod := s.daemonSetPod(t)
	data := s.profileVolumeData(pod)
	oldData, err := os.Readlink(data)
	require.NoError(t, err, "the kubelet's ConfigMap volume")
	old, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
	require.NoError(t, err)

	reader := s.startReader(t, "reader")
	r := &s.reprof
	r.From, r.To, r.KubeletSyncPeriod = "standalone ConfigMap ("+s.key+")", "built-in "+reprofileTo, kubeletSyncPeriod
	r.APIUpdate = s.updateProfile(t, text)
	s.c.Wait(t, "the kubelet's volume swap and serve's re-render", podtest.ConfigMapUpdateWait, func() error {
		if r.VolumeSwapped.IsZero() {
			if now, err := os.Readlink(data); err == nil && now != oldData {
				r.VolumeSwapped = time.Now()
			}
		}
		m, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
		if err != nil || m.Digest == old.Digest {
			return fmt.Errorf("marker %+v (%v), volume swapped %v", m, err, !r.VolumeSwapped.IsZero())
		}
		r.TreeRendered = time.Now()
		return nil
	})
	require.Equal(t, len(want.GPUs), s.servedGPUs(t), "the new tree has %s's GPUs, as ghw lists them", reprofileTo)
	require.False(t, r.VolumeSwapped.IsZero(), "the tree changed before the volume did")
	r.UpdateToSwap, r.SwapToTree, r.UpdateToTree = r.VolumeSwapped.Sub(r.APIUpdate), r.TreeRendered.Sub(r.VolumeSwapped), r.TreeRendered.Sub(r.APIUpdate)
	r.UpdateToSwapString, r.SwapToTreeString = r.UpdateToSwap.Round(time.Millisecond).String(), r.SwapToTree.Round(time.Millisecond).String()
	s.c.WaitPod(t, pod.Namespace, pod.Name, time.Minute, kubetest.PodReady)

	totals := s.stopReader(t, reader)
	r.ReaderScans, r.ReaderTorn, r.ReaderViews = totals.Scans, totals.Torn, totals.Views
	require.GreaterOrEqual(t, len(totals.Views), 2, "the reader saw the first tree and the new one: %v", totals.Views)

	r.ExpectedGPUs = len(want.GPUs)
	r.ExpectedMachine, _ = requireMachineLabel(t, want)
	s.c.RunPod(t, s.gfdPod(t, "gfd-reprofiled", true))
	r.LabelsAfterGFD = s.waitLabels(t, "GFD's labels of "+reprofileTo, wantLabels(map[string]string{
		labelMode: "compute", labelCount: fmt.Sprint(r.ExpectedGPUs), labelMachine: r.ExpectedMachine,
	}))
	s.c.RunPod(t, s.nfdPod(t, "nfd-worker-reprofiled", true))
	s.waitLabels(t, labelHCA, wantLabels(map[string]string{labelNVIDIA: "true", labelHCA: "true"}))
	s.figure("after the re-profile: Node %s=%s %s=%s %s=%s, %s", labelMode, r.LabelsAfterGFD[labelMode], labelCount, r.LabelsAfterGFD[labelCount], labelMachine, r.LabelsAfterGFD[labelMachine], labelHCA)
	kubetest.WriteObject(t, s.objects, "reprofile.json", r)
	s.figure("ConfigMap update -> new tree in %s: API update -> kubelet's volume swap %s (its sync period is %s, plus its ConfigMap cache), swap -> serve's re-render %s; reader %d scans, %d torn, views %v",
		r.UpdateToTree.Round(time.Millisecond), r.UpdateToSwapString, kubeletSyncPeriod, r.SwapToTreeString, totals.Scans, totals.Torn, totals.Views)
}

// testExtraProfiles runs every profile E2E_PROFILES names
// (programs.ExtraProfiles) through the deploy path, as the re-profile
// does: the ConfigMap updated to it, the tree re-rendered with its GPUs,
// GFD's and nfd-worker's labels of it on the Node, which it writes, pass
// or fail, to bin/k8s/node-<profile>/node.json (the DRA suite's
// bin/k8s/<profile>/ is its own). With none named it runs nothing.
func (s *suite) testExtraProfiles(t *testing.T) {
	for _, p := range programs.ExtraProfiles(t) {
		t.Run(p.Name, func(t *testing.T) {
			objects := kubetest.ObjectsDir(t, "node-"+kubetest.Slug(p.Name))
			t.Cleanup(func() {
				n, err := s.c.Client.CoreV1().Nodes().Get(context.Background(), s.node.Name, metav1.GetOptions{})
				if err != nil {
					t.Errorf("the Node judged for %s: %v", p.Name, err)
					return
				}
				kubetest.WriteObject(t, objects, "node.json", n)
			})
			data, err := os.ReadFile(p.File)
			require.NoError(t, err)
			want := facts(t, p.Name, p.Literal, string(data))
			labels := map[string]string{labelMode: "compute", labelCount: fmt.Sprint(len(want.GPUs)), labelNVIDIA: "true"}
			machine, machineSaid := machineLabel(want)
			said := fmt.Sprintf("tree re-rendered with its %d GPUs; Node `%s=%d`, `%s`, `%s` %s", len(want.GPUs), labelCount, len(want.GPUs), labelNVIDIA, labelMachine, machineSaid)
			if machine != "" {
				labels[labelMachine] = machine
			}
			s.rows.Expect(t, "ConfigMap updated through the API to "+p.Name, said)
			old, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
			require.NoError(t, err)
			s.updateProfile(t, string(data))
			s.waitNewTree(t, "serve's render of "+p.Name, old)
			require.Equal(t, len(want.GPUs), s.servedGPUs(t), "the tree has %s's GPUs, as ghw lists them", p.Name)
			name := kubetest.Slug(p.Name)
			s.c.RunPod(t, s.gfdPod(t, "gfd-"+name, true))
			s.c.RunPod(t, s.nfdPod(t, "nfd-worker-"+name, true))
			s.waitLabels(t, p.Name+"'s labels", wantLabels(labels))
		})
	}
}

// waitNewTree waits, as long as a ConfigMap's update takes to reach a pod,
// until the node's tree is complete with another plan than old's.
func (s *suite) waitNewTree(t *testing.T, what string, old writer.Marker) {
	t.Helper()
	s.c.Wait(t, what, podtest.ConfigMapUpdateWait, func() error {
		m, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
		if err != nil || m.Digest == old.Digest {
			return fmt.Errorf("marker %+v (%v)", m, err)
		}
		return nil
	})
}

// startReader runs a pod on the suite's node that scans the served links
// directory of the node's tree until it is stopped (stopReader); a CPU
// limit keeps its loop from starving the node's two cores. serve --nri
// serves it the DaemonSet's tree whatever the sabotage: it judges the
// writer, not a consumer.
func (s *suite) startReader(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	reader := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ds.Namespace},
		Spec: corev1.PodSpec{NodeName: s.node.Name, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "reader", Image: containerdtest.ReaderImage, ImagePullPolicy: corev1.PullNever,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}},
		}}},
	}
	_, err := s.c.Client.CoreV1().Pods(reader.Namespace).Create(ctx, reader, metav1.CreateOptions{})
	require.NoError(t, err)
	running := s.c.WaitPod(t, reader.Namespace, reader.Name, 2*time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	s.c.Wait(t, "the reader scanning", time.Minute, func() error {
		if log := s.c.PodLog(t, reader.Namespace, reader.Name); !strings.Contains(log, "reading") {
			return fmt.Errorf("log %q", log)
		}
		return nil
	})
	return running
}

// stopReader waits until the reader has made whole scans of the tree as
// it is now, by its own count (its progress lines): two in a row, so that
// its view is no lucky moment. Then it stops it through CRI, when it
// prints its totals and exits 0, and requires that it saw no torn entry.
func (s *suite) stopReader(t *testing.T, running *corev1.Pod) containerdtest.ReaderTotals {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.nodePath(s.root), plan.LinksDir))
	require.NoError(t, err)
	s.c.Wait(t, "the reader's whole scans of the tree", time.Minute, func() error {
		views, err := containerdtest.ParseReaderViews(s.c.PodLog(t, running.Namespace, running.Name))
		if err != nil {
			return err
		}
		if n := len(views); n < 1 || views[n-1].Entries != len(entries) || views[n-1].Scans < 2 {
			return fmt.Errorf("views %+v, want a last one of %d entries scanned twice", views, len(entries))
		}
		return nil
	})
	s.node.Runtime.Crictl(t, "stop", "--timeout", "10", containerID(t, running))
	s.c.WaitPod(t, running.Namespace, running.Name, time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	totals, err := containerdtest.ParseReaderTotals(s.c.PodLog(t, running.Namespace, running.Name))
	require.NoError(t, err)
	require.Zero(t, totals.Torn, "torn entries: %v", totals.Samples)
	require.Positive(t, totals.Scans)
	return totals
}

// testBadProfile puts a bad profile in the ConfigMap: the pod turns not
// Ready (no restart), the tree stays, and the pod's log has one error line
// naming the file, the field and the value.
func (s *suite) testBadProfile(t *testing.T) {
	s.rows.Expect(t, "ConfigMap updated to a bad profile ("+badProfile+")", "the pod not Ready, not restarted, the tree kept; its log's one error names file, field and value")
	bad, err := os.ReadFile(filepath.Join(s.repo, badProfile))
	require.NoError(t, err)
	tree := overlaytest.Snapshot(t, s.nodePath(s.root), overlaytest.SnapshotOptions{Identity: true})
	pod := s.daemonSetPod(t)
	updated := s.updateProfile(t, string(bad))
	notReady := s.c.WaitPod(t, pod.Namespace, pod.Name, podtest.ConfigMapUpdateWait, func(p *corev1.Pod) bool { return !kubetest.PodReady(p) })
	s.figure("bad profile -> pod not Ready %s after the API update", time.Since(updated).Round(time.Millisecond))
	require.Equal(t, corev1.PodRunning, notReady.Status.Phase)
	require.Zero(t, notReady.Status.ContainerStatuses[0].RestartCount, "not a crash loop")
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, s.nodePath(s.root), overlaytest.SnapshotOptions{Identity: true}), "after the bad profile")
	var log podtest.Log
	_, _ = log.Write([]byte(s.c.PodLog(t, pod.Namespace, pod.Name)))
	errs := log.Records(t, "ERROR")
	require.Len(t, errs, 1, "one error line:\n%s", log.String())
	line := fmt.Sprint(errs[0])
	for _, want := range []string{profileDir + "/" + s.key, "devices[0].pcie.max_link_gen", "4.5"} {
		require.Contains(t, line, want, "the error names the file, the field and the value")
	}
	s.figure("the pod's error: %s", errs[0]["err"])
}

// testDelete deletes the DaemonSet: its pod stops with exit 0, and the
// tree and the spec stay for the pods they serve.
func (s *suite) testDelete(t *testing.T) {
	s.rows.Expect(t, "`kubectl delete` the DaemonSet", "its pod exits 0 (SIGTERM), the tree and the spec stay")
	ctx := context.Background()
	pod := s.daemonSetPod(t)
	marker, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
	require.NoError(t, err)
	w, err := s.c.Client.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + pod.Name, ResourceVersion: pod.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	deleted := time.Now()
	require.NoError(t, s.c.Client.AppsV1().DaemonSets(s.ds.Namespace).Delete(ctx, s.ds.Name, metav1.DeleteOptions{}))
	var exit *corev1.ContainerStateTerminated
	timeout := time.After(2 * time.Minute)
	for gone := false; !gone; {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended")
			if p, isPod := ev.Object.(*corev1.Pod); isPod && len(p.Status.ContainerStatuses) > 0 {
				exit = cmp.Or(p.Status.ContainerStatuses[0].State.Terminated, exit)
			}
			gone = ev.Type == watch.Deleted
		case <-timeout:
			t.Fatalf("the DaemonSet's pod still exists 2m after the DaemonSet's deletion\nevents:\n%s", s.c.Events(pod.Namespace))
		}
	}
	stopIn := time.Since(deleted)
	require.NotNil(t, exit, "the kubelet reported the container's end")
	require.Equal(t, int32(0), exit.ExitCode, "exit 0 on SIGTERM: %+v", exit)
	after, err := writer.ReadMarker(os.DirFS(s.nodePath(s.root)))
	require.NoError(t, err, "the tree stays, complete")
	require.Equal(t, marker, after)
	_, err = os.Stat(s.nodePath(s.spec))
	require.NoError(t, err, "the spec stays")
	s.figure("DaemonSet deleted -> pod gone in %s, container exit %d (%s)", stopIn.Round(time.Millisecond), exit.ExitCode, exit.Reason)
}

// figure records a measured figure for the report.
func (s *suite) figure(format string, args ...any) {
	s.figures = append(s.figures, fmt.Sprintf(format, args...))
}

// kubernetesPage holds this suite's matrix.
func kubernetesPage() docmatrix.Page {
	return docmatrix.Page{Path: "../../../docs/evidence/kubernetes.md", Suite: "deploy/e2e/node TestNode (make e2e-k8s)", Keys: 1}
}

// report prints the matrix and the figures, appends the matrix to
// kubetest.MatrixEnv's file (other Kubernetes suites write theirs there too), and
// checks docs/evidence/kubernetes.md after a green run.
func (s *suite) report(t *testing.T) {
	table := s.rows.Table("step", "on the node")
	text := "TestNode (deploy/e2e/node): our deploy on a real node\n\n" + table + "\n" + strings.Join(s.figures, "\n") + "\n"
	t.Logf("\n%s", text)
	kubetest.AppendMatrix(t, text)
	if !t.Failed() {
		kubernetesPage().Sync(t, table, os.Getenv(kubetest.MatrixEnv))
	}
}
