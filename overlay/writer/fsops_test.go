package writer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenBeneathRefusesLinks opens directories below a root holding a
// planted symlink, with openat2 and with the O_NOFOLLOW walk used where the
// kernel lacks openat2: both must refuse to pass through the link or climb
// out, and open the real directories.
func TestOpenBeneathRefusesLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "a/b"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(outside, "x"), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "a/link")))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a/file"), nil, 0o644))
	cases := []struct {
		dir string
		ok  bool
	}{
		{"a", true},
		{"a/b", true},
		{"a/link", false},
		{"a/link/x", false},
		{"a/file", false},
		{"a/../..", false},
		{"../outside", false},
	}
	for _, walk := range []bool{false, true} {
		for _, tc := range cases {
			d, err := openRoot(root)
			require.NoError(t, err)
			d.noOpen2 = walk
			_, err = d.fd(tc.dir)
			if tc.ok {
				require.NoError(t, err, "walk=%v %s", walk, tc.dir)
			} else {
				require.Error(t, err, "walk=%v %s", walk, tc.dir)
			}
			// Writing through the link must fail too.
			require.Error(t, d.mkdir("a/link/new", 0o755))
			d.close()
		}
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Len(t, entries, 1, "something was created outside the root")
}
