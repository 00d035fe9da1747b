package kubetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Wait polls ready until it returns nil, printing one progress line
// (what, and how long it took), or fails the test after timeout with
// ready's last error: every wait on the cluster is on readiness, never a
// fixed sleep.
func (c *Cluster) Wait(t testing.TB, what string, timeout time.Duration, ready func() error) {
	t.Helper()
	c.waitFor(t, nil, what, timeout, ready)
}

// WaitPod waits until the pod satisfies done and returns it; the failure
// names the pod's last status and the namespace's events.
func (c *Cluster) WaitPod(t testing.TB, namespace, name string, timeout time.Duration, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.Wait(t, "pod "+namespace+"/"+name, timeout, func() error {
		p, err := c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = p
		if done(p) {
			return nil
		}
		return fmt.Errorf("pod %s/%s: phase %s, conditions %+v, containers %+v\nevents:\n%s", namespace, name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses, c.Events(namespace))
	})
	return pod
}
