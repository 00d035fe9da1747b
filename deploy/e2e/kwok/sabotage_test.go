package kwok_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	fleetmap "github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// TestWithoutTopology: the sabotaged publisher's profiles are the
// profiles' GPUs and HCAs with no root complex given, the map untouched.
func TestWithoutTopology(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(overlaytest.Repo(t), "testdata/profiles/sriov.yaml"))
	require.NoError(t, err)
	before, err := profilefacts.Parse("sriov.yaml", text)
	require.NoError(t, err)
	require.True(t, before.Topology, "the premise: the profile gives pcie_topology")
	out, err := withoutTopology(map[string]string{"sriov.yaml": string(text), fleetmap.ConfigMapKey: "labels: []\n"})
	require.NoError(t, err)
	require.Equal(t, "labels: []\n", out[fleetmap.ConfigMapKey])
	after, err := profilefacts.Parse("sriov.yaml", []byte(out["sriov.yaml"]))
	require.NoError(t, err)
	require.False(t, after.Topology)
	require.Len(t, after.GPUs, len(before.GPUs))
	for i, g := range after.GPUs {
		require.Equal(t, before.GPUs[i].BusID, g.BusID)
		require.Equal(t, before.GPUs[i].HCAs, g.HCAs)
		require.False(t, g.RootGiven(), "GPU %s", g.BusID)
	}
	_, err = withoutTopology(map[string]string{"bad.yaml": "- a list\n"})
	require.ErrorContains(t, err, "profile bad.yaml: not a YAML mapping")
}

// TestRefusedForClaims: a pending pod's reason is its claims' on exactly
// the nodes it may go to, and nothing else passes.
func TestRefusedForClaims(t *testing.T) {
	for _, tc := range []struct {
		message string
		may     int
		want    bool
	}{
		{"0/50 nodes are available: 50 cannot allocate all claims. preemption: 0/50 nodes are available: 50 Preemption is not helpful for scheduling.", 50, true},
		{"0/50 nodes are available: 1 cannot allocate all claims, 49 node(s) didn't match Pod's node affinity/selector.", 1, true},
		{"0/50 nodes are available: 11 cannot allocate all claims, 39 node(s) had untolerated taint.", 1, false},
		{"0/50 nodes are available: 11 cannot allocate all claims, 39 node(s) had untolerated taint.", 50, false},
		{"0/50 nodes are available: 50 node(s) had untolerated taint {kwok.x-k8s.io/node: fake}.", 50, false},
		{"0/50 nodes are available: 50 node(s) were unschedulable.", 50, false},
	} {
		require.Equal(t, tc.want, refusedForClaims(tc.message, tc.may), "%q, %d nodes", tc.message, tc.may)
	}
}
