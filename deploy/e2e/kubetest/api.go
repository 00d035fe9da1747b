package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// requestTimeout bounds one API request of a poll, so that a connection
// the API server left hanging is one more transient error, not the end of
// the wait.
const requestTimeout = 10 * time.Second

// Wait polls ready until it returns nil, printing one progress line
// (what, and how long it took), or fails the test after timeout with
// ready's last error, and the last that was not transient: every wait on
// the cluster is on readiness, never a fixed sleep. Every error of ready
// is polled through until the timeout, an API server's restart included.
func (c *Cluster) Wait(t testing.TB, what string, timeout time.Duration, ready func() error) {
	t.Helper()
	c.waitFor(t, nil, what, timeout, ready)
}

// WaitPod waits until the pod satisfies done and returns it; the failure
// names the pod's last state seen, the last error, and the namespace's
// events. An API error, a transient one above all, is polled through until
// the timeout.
func (c *Cluster) WaitPod(t testing.TB, namespace, name string, timeout time.Duration, done func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	pod, err := c.waitPod(namespace, name, timeout, done)
	if err != nil {
		t.Fatalf("cluster: %v\nevents:\n%s", err, c.Events(namespace))
	}
	return pod
}

// waitPod is WaitPod's poll, without the test: it returns the pod as done
// saw it, or an error naming what it last saw.
func (c *Cluster) waitPod(namespace, name string, timeout time.Duration, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	what := "pod " + namespace + "/" + name
	var pod *corev1.Pod
	r := poll(timeout, pollInterval, nil, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get %s: %w", what, err)
		}
		pod = p
		if done(p) {
			return nil
		}
		return fmt.Errorf("%s: phase %s, conditions %+v, containers %+v", what, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	if r.last != nil {
		return pod, fmt.Errorf("%s not as waited for within %s: %v", what, timeout, r)
	}
	c.logf("%s ready in %s", what, r.took.Round(time.Millisecond))
	return pod, nil
}

// CreateDeviceClass creates the DeviceClass name, selecting the devices
// the CEL expression accepts: the class a suite's claims ask for.
func (c *Cluster) CreateDeviceClass(t testing.TB, name, expression string) {
	t.Helper()
	_, err := c.Client.ResourceV1().DeviceClasses().Create(context.Background(), &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expression}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create DeviceClass %s: %v", name, err)
	}
}

// Unpublish clears what a stopped DRA kubelet plugin of driver left, so
// that the next plugin of that name starts clean: it waits for the
// kubelet to unregister it (the next one has the same endpoint, and a late
// unregistration would remove it), deletes the driver's ResourceSlices and
// waits for them to go, and removes the plugin's state directory.
func (c *Cluster) Unpublish(t testing.TB, driver string, timeout time.Duration) {
	t.Helper()
	c.Wait(t, "the kubelet unregistered the plugin", timeout, func() error {
		if n, err := c.Nodes[0].Registrations(context.Background(), driver); err != nil || n != 0 {
			return fmt.Errorf("the kubelet holds %d registrations of %s (%v)", n, driver, err)
		}
		return nil
	})
	ctx := context.Background()
	slices := c.Client.ResourceV1().ResourceSlices()
	selector := metav1.ListOptions{FieldSelector: "spec.driver=" + driver}
	if err := slices.DeleteCollection(ctx, metav1.DeleteOptions{}, selector); err != nil {
		t.Fatalf("delete the ResourceSlices of %s: %v", driver, err)
	}
	c.Wait(t, "the driver's ResourceSlices deleted", timeout, func() error {
		list, err := slices.List(ctx, selector)
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d slices left", len(list.Items))
		}
		return err
	})
	if err := os.RemoveAll(filepath.Join(c.KubeletRootDir, "plugins", driver)); err != nil {
		t.Fatal(err)
	}
}

// GPUPresentLabel is the Node label stock NVIDIA charts' affinity asks
// for (GFD's, the DRA driver's kubelet plugin's), which nvml-mock's chart
// puts on a mock GPU node.
const GPUPresentLabel = "nvidia.com/gpu.present"

// MarkGPUNode labels the Node GPUPresentLabel=true, as nvml-mock's chart
// does, until the test ends.
func (c *Cluster) MarkGPUNode(t testing.TB, node string) {
	t.Helper()
	ctx := context.Background()
	label := func(value string) error {
		patch := `{"metadata":{"labels":{"` + GPUPresentLabel + `":` + value + `}}}`
		_, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	if err := label(`"true"`); err != nil {
		t.Fatalf("cluster: label Node %s %s=true: %v", node, GPUPresentLabel, err)
	}
	t.Cleanup(func() { _ = label("null") })
}
