package serve

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
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
	spec, err := deploy.ReadSpec(o.Output)
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
	code, body := s.probe(ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "NRI plugin not registered with "+sock+": failed to connect to NRI service")
	code, body = s.probe(MetricsPath)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "nvml_mock_sysfs_nri_registered 0\n")
	require.Contains(t, body, `nvml_mock_sysfs_nri_containers_total{result="served"} 0`)
	require.Len(t, s.logged("WARN", "cannot register with the runtime's NRI socket; trying again"), 1, "said once, however often it tries")
}
