package reliability

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

// entryRead is what a scan read through one entry of the links directory:
// the files go-nvlib reads of every entry (vendor) and of NVIDIA ones.
type entryRead struct {
	Vendor   string `json:"vendor"`
	Class    string `json:"class"`
	Resource string `json:"resource"`
}

// scanResult is one pass over the links directory, as a reader that lists
// it and then reads vendor, class and resource of every entry sees it.
type scanResult struct {
	Entries map[string]entryRead `json:"entries"`
	Files   int                  `json:"files"`
	// Vanished counts entries that were listed and then removed before all
	// their files were read: a flip took the device away. Not torn.
	Vanished int `json:"vanished"`
	// Torn describes entries that still exist but did not resolve, and
	// files that read empty, partial or malformed.
	Torn []string `json:"torn"`
}

// scannedFiles are read in this order from every entry.
func scannedFiles() []string { return []string{"vendor", "class", "resource"} }

// scanLinks lists fsys (the links directory) and reads every entry's files.
func scanLinks(fsys fs.FS) scanResult {
	res := scanResult{Entries: map[string]entryRead{}}
	names, err := fs.ReadDir(fsys, ".")
	if err != nil {
		res.Torn = append(res.Torn, "readdir: "+err.Error())
		return res
	}
	for _, d := range names {
		name := d.Name()
		if !pciaddr.IsBDF(name) || strings.ToLower(name) != name {
			res.Torn = append(res.Torn, fmt.Sprintf("%s: not a lower-case BDF", name))
			continue
		}
		var e entryRead
		whole := true
		for _, f := range scannedFiles() {
			data, err := fs.ReadFile(fsys, name+"/"+f)
			if err != nil {
				if _, lerr := fs.Lstat(fsys, name); errors.Is(lerr, fs.ErrNotExist) {
					res.Vanished++
				} else {
					res.Torn = append(res.Torn, fmt.Sprintf("%s/%s: entry exists but does not resolve: %v", name, f, err))
				}
				whole = false
				break
			}
			res.Files++
			if err := checkAttr(f, string(data)); err != nil {
				res.Torn = append(res.Torn, fmt.Sprintf("%s/%s: %v", name, f, err))
				whole = false
				break
			}
			switch f {
			case "vendor":
				e.Vendor = string(data)
			case "class":
				e.Class = string(data)
			default:
				e.Resource = string(data)
			}
		}
		if whole {
			res.Entries[name] = e
		}
	}
	return res
}

// checkAttr tells a whole sysfs attribute from an empty, partial or
// malformed one, by the exact format the kernel (and the planner) writes.
func checkAttr(name, s string) error {
	switch name {
	case "vendor":
		return checkHexLine(s, 4)
	case "class":
		return checkHexLine(s, 6)
	case "resource":
		lines := strings.SplitAfter(s, "\n")
		if lines[len(lines)-1] != "" {
			return fmt.Errorf("read %d bytes that do not end in a newline: partial", len(s))
		}
		lines = lines[:len(lines)-1]
		if len(lines) != 13 && len(lines) != 17 {
			return fmt.Errorf("%d lines; want 13 (device) or 17 (bridge)", len(lines))
		}
		for i, l := range lines {
			fields := strings.Split(strings.TrimSuffix(l, "\n"), " ")
			if len(fields) != 3 {
				return fmt.Errorf("line %d has %d fields, want 3", i, len(fields))
			}
			for _, f := range fields {
				if err := checkHexLine(f+"\n", 16); err != nil {
					return fmt.Errorf("line %d: %w", i, err)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("no format known for %s", name)
}

// checkHexLine accepts exactly "0x" and digits lower-case hex digits and a newline.
func checkHexLine(s string, digits int) error {
	if len(s) == 0 {
		return errors.New("empty")
	}
	if len(s) != digits+3 || !strings.HasPrefix(s, "0x") || s[len(s)-1] != '\n' {
		return fmt.Errorf("%q is not 0x and %d hex digits and a newline", s, digits)
	}
	for _, c := range s[2 : len(s)-1] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return fmt.Errorf("%q is not lower-case hex", s)
		}
	}
	return nil
}

// TestScanLinksDetectsTornEntries is the negative control of the flip test:
// its zero only means something if the scanner reports each kind of tear.
func TestScanLinksDetectsTornEntries(t *testing.T) {
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
			res := scanLinks(fsys)
			require.Equal(t, tc.vanished, res.Vanished)
			if tc.vanished > 0 {
				require.Empty(t, res.Torn)
				require.NotContains(t, res.Entries, tc.removeOnRead)
				return
			}
			if tc.torn == "" {
				require.Empty(t, res.Torn)
				require.Equal(t, entryRead{Vendor: "0x10de\n", Class: "0x030200\n", Resource: resource}, res.Entries["0000:07:00.0"])
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
