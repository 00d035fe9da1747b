package hosttest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// RequireMountSet requires that a CDI spec's mounts are the mount set
// (cdispec.Mounts, its one home) of the tree at root, as serve's args
// (--container-root, each --also-at) ask for it: the tree's directories
// and the node's own /sys/module beside the module view, nothing else.
func RequireMountSet(t testing.TB, got []*specs.Mount, root string, args []string) {
	t.Helper()
	var containerRoot string
	var alsoAt []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--container-root="); ok {
			containerRoot = v
		}
		if v, ok := strings.CutPrefix(a, "--also-at="); ok {
			alsoAt = append(alsoAt, v)
		}
	}
	want, err := cdispec.Mounts(root, containerRoot, alsoAt)
	require.NoError(t, err, "the mount set of %s", root)
	var wantPairs, gotPairs []string
	for _, m := range want {
		wantPairs = append(wantPairs, m.Source+" -> "+m.Destination)
	}
	for _, m := range got {
		gotPairs = append(gotPairs, m.HostPath+" -> "+m.ContainerPath)
	}
	require.ElementsMatch(t, wantPairs, gotPairs, "the spec's mounts: the mount set of %s", root)
}
