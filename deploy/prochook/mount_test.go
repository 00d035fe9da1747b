package prochook

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A container's /proc is judged by its mount's optional fields: shared
// (a Bidirectional mount of the node's /proc) is refused; a slave of the
// node's (HostToContainer) or a private one is not.
func TestMountShared(t *testing.T) {
	const info = `22 27 0:21 / /proc rw,relatime - proc proc rw
812 790 0:21 / /run/c/rootfs/proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
813 790 0:21 / /run/d/rootfs/proc rw,relatime master:5 - proc proc rw
814 790 0:21 / /run/e/rootfs/proc rw,relatime shared:9 master:5 - proc proc rw
`
	for _, tc := range []struct {
		id            uint64
		shared, found bool
	}{
		{22, false, true},
		{812, true, true},
		{813, false, true},
		{814, true, true},
		{99, false, false},
	} {
		shared, found := mountShared([]byte(info), tc.id)
		require.Equal(t, tc.shared, shared, "mount %d shared", tc.id)
		require.Equal(t, tc.found, found, "mount %d found", tc.id)
	}
}
