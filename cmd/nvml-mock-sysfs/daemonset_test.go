package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// daemonSetTurn runs one turn of the DaemonSet's loop: every nvml-mock-sysfs
// line of its script, with the node's paths moved under dir.
func daemonSetTurn(t *testing.T, script string, dir string) []string {
	t.Helper()
	var outs []string
	for _, line := range strings.Split(script, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "/nvml-mock-sysfs" {
			continue
		}
		args := fields[1:]
		for i, a := range args {
			for _, node := range []string{"/var/lib/nvml-mock-sysfs", "/var/run/cdi", "/etc/nvml-mock"} {
				if a == node || strings.HasPrefix(a, node+"/") {
					args[i] = filepath.Join(dir, a)
				}
			}
		}
		code, stdout, stderr := runCLI(t, args...)
		require.Equal(t, exitOK, code, "%s: %s", line, stderr)
		outs = append(outs, stdout)
	}
	require.Len(t, outs, 2, "the script renders and writes the spec")
	return outs
}

// TestDaemonSetLoopFollowsTheConfigMap runs the DaemonSet's own command
// lines against the example ConfigMap, then against a changed profile, as
// the kubelet would swap it in.
func TestDaemonSetLoopFollowsTheConfigMap(t *testing.T) {
	var ds appsv1.DaemonSet
	var cm corev1.ConfigMap
	b, err := os.ReadFile("../../deploy/kubernetes/nvml-mock-sysfs.yaml")
	require.NoError(t, err)
	docs := strings.Split(string(b), "\n---\n")
	require.NoError(t, yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), &ds))
	b, err = os.ReadFile("../../deploy/kubernetes/standalone/nvml-mock-config.yaml")
	require.NoError(t, err)
	docs = strings.Split(string(b), "\n---\n")
	require.NoError(t, yaml.UnmarshalStrict([]byte(docs[len(docs)-1]), &cm))
	script := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, "\n")

	dir := t.TempDir()
	profileFile := filepath.Join(dir, "etc/nvml-mock/config.yaml")
	require.NoError(t, os.MkdirAll(filepath.Dir(profileFile), 0o755))
	require.NoError(t, os.WriteFile(profileFile, []byte(cm.Data["config.yaml"]), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "var/run/cdi"), 0o755))

	first := daemonSetTurn(t, script, dir)
	require.Contains(t, first[0], "GPUs 8,")
	require.Contains(t, first[1], "wrote ")
	spec := filepath.Join(dir, "var/run/cdi/nvml-mock-sysfs.yaml")
	s, err := cdi.ReadSpec(spec, 0)
	require.NoError(t, err)
	require.Len(t, s.Devices[0].ContainerEdits.Mounts, 3, "overlay, links, and the NFD path")

	again := daemonSetTurn(t, script, dir)
	require.Contains(t, again[0], "wrote 0 files, 0 links", "an unchanged profile writes nothing")
	require.True(t, strings.HasPrefix(again[1], "unchanged "), again[1])

	// The ConfigMap changes: the next turn renders the new profile.
	t4, ok := builtin.Get("t4-vm")
	require.True(t, ok)
	text, err := profile.Marshal(t4, "changed")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(profileFile, text, 0o644))
	changed := daemonSetTurn(t, script, dir)
	require.Contains(t, changed[0], "GPUs 4,")
	require.Contains(t, changed[0], "removed ")
	b, err = os.ReadFile(filepath.Join(dir, "var/lib/nvml-mock-sysfs", plan.ProfileFile))
	require.NoError(t, err)
	require.Contains(t, string(b), "Tesla T4")
}
