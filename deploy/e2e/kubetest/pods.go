package kubetest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
)

// InClusterEnv is what a pod needs for client-go's in-cluster config on
// this cluster. The kubelet sets KUBERNETES_SERVICE_HOST and _PORT to the
// kubernetes Service's address, which no kube-proxy serves here. On a
// cluster of workers the API server listens at that very address
// (nodes.go), so nothing more is needed. On the single node a
// hostNetwork pod gets the two variables naming the API server on the
// node's loopback: a container's own env wins over the kubelet's. The
// pod's ServiceAccount token and kube-root-ca.crt (the API server's
// certificate, which names 127.0.0.1) do the rest.
func (c *Cluster) InClusterEnv() []corev1.EnvVar {
	if c.workers > 0 {
		return nil
	}
	host, port, _ := strings.Cut(apiServerAddress, ":")
	return []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: host}, {Name: "KUBERNETES_SERVICE_PORT", Value: port}}
}

// HostPathVolumes are the hostPath volumes and mounts that give a pod's
// container what containerdtest.Mounts give a CRI container: one volume per
// mount, named prefix-0, prefix-1, ....
func HostPathVolumes(prefix string, mounts []containerdtest.Mount) ([]corev1.Volume, []corev1.VolumeMount) {
	var volumes []corev1.Volume
	var volumeMounts []corev1.VolumeMount
	for i, m := range mounts {
		name := prefix + "-" + strconv.Itoa(i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: m.HostPath}}})
		volumeMounts = append(volumeMounts, corev1.VolumeMount{Name: name, MountPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	return volumes, volumeMounts
}

// podLogTimeout bounds PodLog's retries of transient errors: an API
// server's restart, or the kubelet's behind it.
const podLogTimeout = 30 * time.Second

// PodLog is what a pod's container printed, through the API server (which
// asks the kubelet). A transient error is asked again, up to
// podLogTimeout, so that a wait that reads the log outlasts an API
// server's restart; any other error fails the test at once.
func (c *Cluster) PodLog(t testing.TB, namespace, name string) string {
	t.Helper()
	var log string
	var lasting error
	r := poll(podLogTimeout, pollInterval, nil, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		b, err := c.Client.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil && transient(err) {
			return err
		}
		log, lasting = string(b), err
		return nil
	})
	switch {
	case r.last != nil:
		t.Fatalf("cluster: log of pod %s/%s: not within %s: %v", namespace, name, podLogTimeout, r)
	case lasting != nil:
		t.Fatalf("cluster: log of pod %s/%s: %v", namespace, name, lasting)
	}
	return log
}

// PodReady is whether the pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Unschedulable is the scheduler's reason for not placing the pod, from
// its PodScheduled condition; "" while it has none.
func Unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

// PodDone is whether the pod ran to its end (Succeeded or Failed).
func PodDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// podRunTimeout bounds a run-to-completion pod: scheduling, the sandbox
// (the bridge network's first retry), and the program.
const podRunTimeout = 3 * time.Minute

// RunPod creates the pod and waits until it ended, failing the test
// unless it Succeeded; it returns the pod's log.
func (c *Cluster) RunPod(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	done, log := c.RunPodToEnd(t, pod)
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("cluster: pod %s/%s %s: %s\nlog:\n%s", pod.Namespace, pod.Name, done.Status.Phase, fmt.Sprint(done.Status.ContainerStatuses), log)
	}
	return log
}

// RunPodToEnd creates a run-to-completion pod and waits until it has
// succeeded or failed, returning it as it ended and its log: for a pod
// that must fail.
func (c *Cluster) RunPodToEnd(t testing.TB, pod *corev1.Pod) (*corev1.Pod, string) {
	t.Helper()
	_, err := c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		t.Fatalf("cluster: create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	done := c.WaitPod(t, pod.Namespace, pod.Name, podRunTimeout, PodDone)
	return done, c.PodLog(t, pod.Namespace, pod.Name)
}
