package kubeclient

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

// TestConfig: a kubeconfig file is read as given and names this binary to
// the API server; a missing one is refused naming the file; none outside a
// pod says to give one.
func TestConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(file, []byte(kubeconfig), 0o600))
	cfg, err := Config(file)
	require.NoError(t, err)
	require.Equal(t, "https://127.0.0.1:1", cfg.Host)
	require.Equal(t, "nvml-mock-sysfs", cfg.UserAgent)

	missing := filepath.Join(t.TempDir(), "none")
	_, err = Config(missing)
	require.ErrorContains(t, err, "kubeconfig "+missing+": ")

	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err = Config("")
	require.ErrorContains(t, err, "give a kubeconfig outside a pod")

	// Each client is Config's: nothing connects before it is used.
	_, err = NodeMetadata(file)
	require.NoError(t, err)
	_, err = Typed(file)
	require.NoError(t, err)
	_, err = Fleet(file)
	require.NoError(t, err)
	_, err = Fleet(missing)
	require.ErrorContains(t, err, missing)
}
