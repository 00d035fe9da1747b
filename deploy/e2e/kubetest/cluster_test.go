package kubetest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/overlaytest"
)

func TestMain(m *testing.M) { os.Exit(overlaytest.MainAlone(m)) }

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
