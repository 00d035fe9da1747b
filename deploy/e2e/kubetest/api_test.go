package kubetest

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// refused is what client-go returns while the API server restarts.
func refused() error {
	return &url.Error{Op: "Get", URL: "https://" + apiServerAddress + "/api/v1/namespaces/default/pods/p",
		Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
}

func TestTransient(t *testing.T) {
	for _, err := range []error{
		refused(),
		fmt.Errorf("get pod: %w", refused()),
		apierrors.NewServiceUnavailable("etcd is restarting"),
		apierrors.NewInternalError(errors.New("boom")),
		apierrors.NewTimeoutError("slow", 1),
		apierrors.NewTooManyRequests("later", 1),
		io.ErrUnexpectedEOF,
	} {
		require.True(t, transient(err), "%v", err)
	}
	for _, err := range []error{
		errors.New("pod default/p: phase Pending"),
		apierrors.NewNotFound(corev1.Resource("pods"), "p"),
		apierrors.NewForbidden(corev1.Resource("pods"), "p", errors.New("RBAC")),
	} {
		require.False(t, transient(err), "%v", err)
	}
}

// TestPoll: two transient errors are polled through; a poll that times
// out names its last error and the last state it saw before it; a process
// that exits ends the poll at once.
func TestPoll(t *testing.T) {
	tries := 0
	r := poll(10*time.Second, time.Millisecond, nil, func() error {
		tries++
		switch tries {
		case 1:
			return refused()
		case 2:
			return apierrors.NewServiceUnavailable("etcd is restarting")
		}
		return nil
	})
	require.NoError(t, r.last)
	require.Equal(t, 3, r.tries)

	tries = 0
	r = poll(50*time.Millisecond, time.Millisecond, nil, func() error {
		tries++
		if tries == 1 {
			return errors.New("node: Ready False")
		}
		return refused()
	})
	require.Error(t, r.last)
	require.GreaterOrEqual(t, r.took, 50*time.Millisecond)
	require.Contains(t, r.String(), "connection refused")
	require.Contains(t, r.String(), "the last state seen: node: Ready False")
	require.Contains(t, r.String(), fmt.Sprintf("%d tries", tries))

	exited := make(chan struct{})
	close(exited)
	r = poll(time.Minute, time.Millisecond, exited, func() error { return errors.New("not yet") })
	require.True(t, r.exited)
	require.Equal(t, 1, r.tries)
}

// fakeCluster is a Cluster whose API is client-go's fake, holding pod
// default/p in phase; the n-th Get of a pod (from 1) fails with fail(n),
// or is answered when that is nil.
func fakeCluster(t *testing.T, phase corev1.PodPhase, fail func(n int) error) *Cluster {
	t.Helper()
	client := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: metav1.NamespaceDefault},
		Status:     corev1.PodStatus{Phase: phase},
	})
	n := 0
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		n++
		err := fail(n)
		return err != nil, nil, err
	})
	return &Cluster{Client: client, progress: io.Discard}
}

// TestWaitPodThroughAPIErrors: WaitPod outlasts an API server's restart
// (a refused connection, then a 503) and returns the pod; a wait that ends
// on an API error still names the pod's last state.
func TestWaitPodThroughAPIErrors(t *testing.T) {
	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
	c := fakeCluster(t, corev1.PodRunning, func(n int) error {
		switch n {
		case 1:
			return refused()
		case 2:
			return apierrors.NewServiceUnavailable("etcd is restarting")
		}
		return nil
	})
	pod := c.WaitPod(t, metav1.NamespaceDefault, "p", 30*time.Second, running)
	require.Equal(t, corev1.PodRunning, pod.Status.Phase)

	// One look at the pod, Pending, then only refused connections.
	c = fakeCluster(t, corev1.PodPending, func(n int) error {
		if n == 1 {
			return nil
		}
		return refused()
	})
	pod, err := c.waitPod(metav1.NamespaceDefault, "p", 300*time.Millisecond, running)
	require.Error(t, err)
	require.NotNil(t, pod, "the pod as last seen")
	require.Contains(t, err.Error(), "connection refused", "the last error")
	require.Contains(t, err.Error(), "the last state seen: pod default/p: phase Pending", "the last state")
}
