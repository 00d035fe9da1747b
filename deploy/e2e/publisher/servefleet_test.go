package publisher_test

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

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
)

// TestServeFleetThroughAPI: serve --fleet-configmap, as the chart's
// DaemonSet runs it with fleet.readThroughAPI (its ServiceAccount and
// RBAC), renders the profile the ConfigMap gives its node, and re-renders
// when the ConfigMap is edited; the figure is from the update to the
// render. Its control, a serve reading a copy of the map with no
// --fleet-configmap (as a volume the kubelet has not synced yet), renders
// the old profile still: its "nothing happens" window opens on an event
// it does see, its own file's change after the update.
func TestServeFleetThroughAPI(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	bin := hosttest.BuildBinary(t)
	ctx := context.Background()
	node := kubetest.NodeName
	data := map[string]string{fleet.ConfigMapKey: "nodes: {" + node + ": t4-vm}\n"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: configMap}, Data: data}
	_, err := c.Client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	asChart := chartAccount(t, c, "templates/rbac.yaml", "fleet.readThroughAPI=true")

	serve := func(name string, args ...string) *kubetest.Process {
		dir := t.TempDir()
		return c.Start(t, kubetest.Program{Name: name, Args: append([]string{bin, "serve", "--root", filepath.Join(dir, "root"),
			"--output", filepath.Join(dir, "cdi", "spec.yaml"), "--node-name", node, "--listen", "127.0.0.1:0"}, args...)})
	}
	// The control: the map as a file nobody updates.
	stale := filepath.Join(t.TempDir(), "fleet", fleet.ConfigMapKey)
	require.NoError(t, os.MkdirAll(filepath.Dir(stale), 0o755))
	require.NoError(t, os.WriteFile(stale, []byte(data[fleet.ConfigMapKey]), 0o644))
	control := serve("serve-file", "--fleet", stale)
	api := serve("serve-api", "--fleet", filepath.Join(t.TempDir(), "fleet", fleet.ConfigMapKey),
		"--fleet-configmap", namespace+"/"+configMap, "--kubeconfig", asChart)
	for _, p := range []*kubetest.Process{api, control} {
		waitFor(t, p, p.Name+" renders t4-vm", func() string { return rendered(p, "start", "t4-vm") })
	}

	data[fleet.ConfigMapKey] = "nodes: {" + node + ": hgx-h100}\n"
	updated := updateFleet(t, c.Client, data)
	waitFor(t, api, "serve-api re-renders hgx-h100", func() string { return rendered(api, "change", "hgx-h100") })
	t.Logf("figure: serve --fleet-configmap, ConfigMap update to the node's new tree: %s", time.Since(updated).Round(time.Millisecond))
	// The control's window opens on an event it must see, after the
	// update: its own file changed (to dgx-a100), which it renders. Had
	// it read the ConfigMap, it would have rendered hgx-h100 by then, as
	// serve-api did before the file changed.
	require.NoError(t, os.WriteFile(stale, []byte("nodes: {"+node+": dgx-a100}\n"), 0o644))
	waitFor(t, control, "serve-file re-renders its file's dgx-a100", func() string { return rendered(control, "change", "dgx-a100") })
	require.NotEmpty(t, rendered(control, "change", "hgx-h100"), "a serve without --fleet-configmap saw the update")
}

// rendered says what p's log lacks of a render of the built-in profile
// for reason, or "" when it has one.
func rendered(p *kubetest.Process, reason, profile string) string {
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.Contains(line, "msg=rendered reason="+reason+" ") && strings.Contains(line, `profile="built-in `+profile+`"`) {
			return ""
		}
	}
	return "no render of " + profile + " for reason " + reason + " in its log:\n" + p.LogTail()
}
