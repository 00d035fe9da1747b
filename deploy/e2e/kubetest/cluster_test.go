package kubetest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
)

func TestMain(m *testing.M) { os.Exit(hosttest.MainAlone(m)) }

// TestCluster starts the node, runs a pod on the bridge network through
// the scheduler and the kubelet, stops the node, and finds nothing of it
// on the host; the sysctl files the kubelet wrote inside show the
// containment was needed.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: containerdtest.PauseImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	_, err := c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	running := c.WaitPod(t, pod.Namespace, pod.Name, 2*time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	require.True(t, strings.HasPrefix(running.Status.PodIP, "10.244.0."), "pod IP %q from the bridge network", running.Status.PodIP)
	// The kubelet's account of its plugins, through the API: the node has
	// none registered (the DRA suite reads it for the driver's).
	plugins, err := c.RegisteredPlugins(ctx)
	require.NoError(t, err)
	require.Empty(t, plugins, "no plugin registered on a bare node")

	c.Stop(t)
	require.Empty(t, c.Leftovers(), "left on the host after the cluster stopped")
	written, err := os.ReadFile(filepath.Join(c.Dir, "sysctl", "vm.overcommit_memory"))
	require.NoError(t, err)
	require.Equal(t, "1", strings.TrimSpace(string(written)), "the kubelet sets vm.overcommit_memory, into the namespace's file")
}

// TestWorkers starts a control plane and two workers and checks what
// makes them two nodes: a pod lands on each, on that worker's own pod
// subnet, and reaches the API server by the in-cluster configuration the
// kubelet gives it (the probe reads its Node: the address the API server
// knows it by is the worker's own); the API server reaches each kubelet
// for the pod's log; each worker has its own /run, so a CDI spec on one
// is not on the other; and nothing is left on the host.
func TestWorkers(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Workers: 2})
	require.Len(t, c.Nodes, 2)
	ctx := context.Background()
	// The probe reads its own Node: the default ServiceAccount may get
	// Nodes, nothing else.
	_, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "whereami"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "whereami"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "whereami"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default", Namespace: metav1.NamespaceDefault}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	img := containerdtest.ProgramImage(t, "localhost/nvml-mock-sysfs/whereami:test", "./deploy/e2e/kubetest/testdata/whereami", "/whereami")
	for i, n := range c.Nodes {
		n.Runtime.Import(t, img, containerdtest.CRINamespace)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "whereami-" + strconv.Itoa(i+1), Namespace: metav1.NamespaceDefault},
			Spec: corev1.PodSpec{
				NodeName:      n.Name,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "whereami", Image: img.Name, ImagePullPolicy: corev1.PullNever,
					Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
				}},
			},
		}
		log := c.RunPod(t, pod)
		require.Equal(t, fmt.Sprintf("node %s addresses InternalIP=%s,Hostname=%s", n.Name, n.Address, n.Name), strings.TrimSpace(log))
		ran, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(ran.Status.PodIP, fmt.Sprintf("10.244.%d.", i+1)), "pod IP %q on %s's own subnet", ran.Status.PodIP, n.Name)
	}
	// Each worker's /var/run/cdi is its own.
	spec := "/var/run/cdi/only-on-the-first.yaml"
	require.NoError(t, os.MkdirAll(filepath.Dir(c.Nodes[0].ProcPath(spec)), 0o755))
	require.NoError(t, os.WriteFile(c.Nodes[0].ProcPath(spec), nil, 0o644))
	require.FileExists(t, c.Nodes[0].ProcPath(spec))
	require.NoFileExists(t, c.Nodes[1].ProcPath(spec), "%s's /run is not %s's", c.Nodes[1].Name, c.Nodes[0].Name)
	for _, n := range c.Nodes {
		plugins, err := n.RegisteredPlugins(ctx)
		require.NoError(t, err, "%s's kubelet at %s", n.Name, n.Address)
		require.Empty(t, plugins)
	}

	c.Stop(t)
	require.Empty(t, c.Leftovers(), "left on the host after the cluster stopped")
}
