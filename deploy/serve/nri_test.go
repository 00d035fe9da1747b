package serve

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
)

// TestNRIEditsAreTheSpecs: what the NRI plugin gives a container is the
// CDI device's edits as the spec file holds them, and nothing before a
// complete render.
func TestNRIEditsAreTheSpecs(t *testing.T) {
	cm := newConfigMap(t, builtinText(t, "dgx-a100"))
	var o Options
	s := start(t, cm, func(opts *Options) {
		opts.NRI = &nriplugin.Options{Socket: filepath.Join(t.TempDir(), "no-runtime.sock")}
		o = *opts
	})
	s.waitFirstSync()
	edits, err := s.srv.Edits()
	require.NoError(t, err)
	spec, err := cdispec.ReadSpec(o.Output)
	require.NoError(t, err)
	require.Equal(t, spec.Devices[0].ContainerEdits, edits)
	require.Contains(t, edits.Env, "GFD_MACHINE_TYPE_FILE=/opt/nvml-mock/dmi/product_name", "a DGX names its machine")

	unrendered, err := New(Options{Render: o.Render, Output: o.Output})
	require.NoError(t, err)
	unrendered.opts.Render.Root = t.TempDir()
	_, err = unrendered.Edits()
	require.ErrorContains(t, err, "holds no complete render")
}

// TestNRINotRegistered: with no runtime at the socket, serve still renders
// and writes the spec, but is not ready, and says why; /metrics shows it.
func TestNRINotRegistered(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nri.sock")
	s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) {
		o.NRI = &nriplugin.Options{Socket: sock, Retry: 10 * time.Millisecond}
	})
	s.waitFirstSync()
	code, body := s.probe(endpoints.ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "NRI plugin not registered with "+sock+": failed to connect to NRI service")
	code, body = s.probe(endpoints.MetricsPath)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "nvml_mock_sysfs_nri_registered 0\n")
	require.Contains(t, body, `nvml_mock_sysfs_nri_containers_total{result="served"} 0`)
	require.Len(t, s.logged("WARN", "cannot register with the runtime's NRI socket; trying again"), 1, "said once, however often it tries")
}

// TestNRIReadOnlyEditsBesideTheWritable: with Writable, the spec's device
// (Edits) is the writable view, and what the NRI plugin gives a container
// its policy does not make a writer (ReadOnlyEdits) is the read-only
// tree's mount set of the same root, every mount read-only; without
// Writable the two are one.
func TestNRIReadOnlyEditsBesideTheWritable(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	spec := filepath.Join(t.TempDir(), "spec.yaml")
	ro, err := cdispec.Mounts(root, "", nil)
	require.NoError(t, err)
	rw, err := cdispec.WritableMounts(root, "", nil, "", kernelRelease())
	require.NoError(t, err)
	mountsOf := func(edits func() (specs.ContainerEdits, error)) []*specs.Mount {
		e, _ := edits() // nothing rendered: the mounts it would serve
		return e.Mounts
	}
	for _, writable := range []bool{false, true} {
		s, err := New(Options{Render: overlay.Options{Root: root}, Output: spec, Writable: writable,
			NRI: &nriplugin.Options{Socket: filepath.Join(t.TempDir(), "nri.sock")}})
		require.NoError(t, err)
		require.Equal(t, cdispec.DeviceEdits(ro, nil).Mounts, mountsOf(s.ReadOnlyEdits), "writable %v", writable)
		for _, m := range mountsOf(s.ReadOnlyEdits) {
			require.Contains(t, m.Options, "ro", m.ContainerPath)
		}
		want := ro
		if writable {
			want = rw
		}
		require.Equal(t, cdispec.DeviceEdits(want, nil).Mounts, mountsOf(s.Edits), "writable %v", writable)
	}
}
