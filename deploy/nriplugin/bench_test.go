package nriplugin

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// kubeletMounts are the mounts the kubelet gives an ordinary pod's
// container: what the plugin looks through at each creation.
func kubeletMounts() []*api.Mount {
	var ms []*api.Mount
	for _, dst := range []string{"/etc/hosts", "/dev/termination-log", "/etc/hostname", "/etc/resolv.conf",
		"/var/run/secrets/kubernetes.io/serviceaccount"} {
		ms = append(ms, &api.Mount{Destination: dst, Source: "/var/lib/kubelet/pods/0123/volumes" + dst, Type: "bind", Options: []string{"rbind", "rprivate", "ro"}})
	}
	return append(ms, &api.Mount{Destination: "/dev/shm", Source: "/run/containerd/sandboxes/0123/shm", Type: "bind", Options: []string{"rbind", "ro"}})
}

// BenchmarkCreateContainer is the plugin's own work at a served
// creation, the runtime's round trip left out: the policy, the edits
// (serve's, with the hook), what goes beneath the node's / and the
// adjustment. Beneath reads a tree with 8 iommu groups and this node's
// /sys, as serve's does. BenchmarkServeNRI (deploy/e2e/containerdtest)
// measures the whole creation through containerd.
func BenchmarkCreateContainer(b *testing.B) {
	root := b.TempDir()
	for g := range 8 {
		require.NoError(b, os.MkdirAll(filepath.Join(root, plan.IOMMUGroupsDir, string(rune('0'+g))), 0o755))
	}
	mounts, err := cdispec.Mounts(root, "/opt/nvml-mock-sysfs", nil)
	require.NoError(b, err)
	tr := &tree{edits: cdispec.DeviceEdits(mounts, []string{cdispec.MachineTypeFileEnv + "=/opt/nvml-mock-sysfs/product_name"},
		cdispec.ProcHook("/var/lib/nvml-mock-sysfs-hook/nvml-mock-sysfs", root))}
	beneath := func() cdispec.Beneath { return cdispec.NewBeneath(root, os.DirFS(root), os.DirFS("/sys")) }
	p, err := New(Options{Edits: tr.Edits, Beneath: beneath, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	gfd := pod("gpu-operator", map[string]string{"app": "gpu-feature-discovery", "pod-template-hash": "5d8f7c9b6"},
		map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-07T00:00:00Z"})
	for _, c := range []struct {
		name   string
		mounts []*api.Mount
	}{
		{"pod", kubeletMounts()},
		{"host-root", append(kubeletMounts(), hostPath("/", "/host-root"))},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctr := &api.Container{Id: "c", Name: "gfd", Mounts: c.mounts}
			b.ReportAllocs()
			for b.Loop() {
				adjust, _, err := p.CreateContainer(context.Background(), gfd, ctr)
				if err != nil || len(adjust.GetMounts()) == 0 {
					b.Fatalf("not served: %v %v", adjust, err)
				}
			}
		})
	}
}
