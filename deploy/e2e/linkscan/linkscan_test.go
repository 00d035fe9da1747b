package linkscan

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLinksDetectsTornEntries is the negative control of the flip test:
// its zero only means something if the scanner reports each kind of tear.
func TestLinksDetectsTornEntries(t *testing.T) {
	resource := strings.Repeat("0x0000000000000000 0x0000000000000000 0x0000000000000000\n", 13)
	cases := []struct {
		name     string
		plant    func(t *testing.T, links, devs string)
		torn     string
		vanished int
		// removeOnRead removes this entry just before its vendor is read,
		// as a flip does between a reader's readdir and its reads.
		removeOnRead string
	}{
		{"whole entry", func(t *testing.T, links, devs string) {}, "", 0, ""},
		{"dangling entry", func(t *testing.T, links, devs string) {
			require.NoError(t, os.Symlink("../devs/0000:99:00.0", filepath.Join(links, "0000:99:00.0")))
		}, "0000:99:00.0/vendor: entry exists but does not resolve", 0, ""},
		{"empty file", func(t *testing.T, links, devs string) {
			require.NoError(t, os.WriteFile(filepath.Join(devs, "0000:07:00.0", "class"), nil, 0o644))
		}, "0000:07:00.0/class: empty", 0, ""},
		{"half-written resource", func(t *testing.T, links, devs string) {
			require.NoError(t, os.WriteFile(filepath.Join(devs, "0000:07:00.0", "resource"), []byte(resource[:100]), 0o644))
		}, "0000:07:00.0/resource: read 100 bytes", 0, ""},
		{"entry removed after readdir", func(t *testing.T, links, devs string) {}, "", 1, "0000:07:00.0"},
		{"upper-case name", func(t *testing.T, links, devs string) {
			require.NoError(t, os.Symlink("../devs/0000:07:00.0", filepath.Join(links, "0000:0A:00.0")))
		}, "0000:0A:00.0: not a lower-case BDF", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			links, devs := filepath.Join(dir, "links"), filepath.Join(dir, "devs")
			gpu := filepath.Join(devs, "0000:07:00.0")
			require.NoError(t, os.MkdirAll(gpu, 0o755))
			require.NoError(t, os.MkdirAll(links, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(gpu, "vendor"), []byte("0x10de\n"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(gpu, "class"), []byte("0x030200\n"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(gpu, "resource"), []byte(resource), 0o644))
			require.NoError(t, os.Symlink("../devs/0000:07:00.0", filepath.Join(links, "0000:07:00.0")))
			tc.plant(t, links, devs)

			var fsys fs.FS = os.DirFS(links)
			if tc.removeOnRead != "" {
				fsys = removingFS{FS: fsys, dir: links, entry: tc.removeOnRead}
			}
			res := Links(fsys)
			require.Equal(t, tc.vanished, res.Vanished)
			if tc.vanished > 0 {
				require.Empty(t, res.Torn)
				require.NotContains(t, res.Entries, tc.removeOnRead)
				return
			}
			if tc.torn == "" {
				require.Empty(t, res.Torn)
				require.Equal(t, Entry{Vendor: "0x10de\n", Class: "0x030200\n", Resource: resource}, res.Entries["0000:07:00.0"])
				return
			}
			require.Len(t, res.Torn, 1)
			require.Contains(t, res.Torn[0], tc.torn)
		})
	}
}

// removingFS removes one entry of the links directory when its vendor is
// opened, like a flip that lands between a reader's readdir and its reads.
type removingFS struct {
	fs.FS
	dir, entry string
}

func (r removingFS) Open(name string) (fs.File, error) {
	if name == r.entry+"/vendor" {
		if err := os.Remove(filepath.Join(r.dir, r.entry)); err != nil {
			return nil, err
		}
	}
	return r.FS.Open(name)
}

func (r removingFS) Lstat(name string) (fs.FileInfo, error) { return fs.Lstat(r.FS, name) }

func (r removingFS) ReadLink(name string) (string, error) { return fs.ReadLink(r.FS, name) }
