package kubetest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRegisteredPlugins(t *testing.T) {
	exposition := `# HELP plugin_manager_total_plugins [ALPHA] Number of plugins in Plugin Manager
# TYPE plugin_manager_total_plugins gauge
plugin_manager_total_plugins{socket_path="/k/plugins_registry/gpu.nvidia.com-reg.sock",state="actual_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/k/plugins_registry/gpu.nvidia.com-reg.sock",state="desired_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/k/plugins_registry/other-reg.sock",state="desired_state_of_world"} 1
plugin_manager_total_plugins{socket_path="/k/plugins_registry/gone-reg.sock",state="actual_state_of_world"} 0
kubelet_running_pods 3
`
	got, err := registeredPlugins([]byte(exposition))
	require.NoError(t, err)
	require.Equal(t, []string{"/k/plugins_registry/gpu.nvidia.com-reg.sock"}, got, "registered: in the actual state of the world, with a positive count")
	_, err = registeredPlugins([]byte(`plugin_manager_total_plugins{socket_path="x",state="actual_state_of_world"} one` + "\n"))
	require.ErrorContains(t, err, `"plugin_manager_total_plugins{socket_path=\"x\",state=\"actual_state_of_world\"} one"`)
}
