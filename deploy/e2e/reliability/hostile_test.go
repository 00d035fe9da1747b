package reliability

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// hostileCase is one profile the renderer must refuse. The corpus files in
// testdata/hostile say what they expect in header comments:
//
//	# hostile: what the file tries
//	# field: the field the error must name
//	# value: the value it must quote
//	# want: any other text the error must hold (repeatable)
type hostileCase struct {
	path  string
	field string
	value string
	want  []string
}

func readHostileCorpus(t *testing.T) []hostileCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(overlaytest.Repo(t), "testdata", "hostile", "*.yaml"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 30)
	var cases []hostileCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		c := hostileCase{path: f}
		described := false
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			key, val, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "# "), ": ")
			if !ok || !strings.HasPrefix(sc.Text(), "# ") {
				continue
			}
			switch key {
			case "hostile":
				described = true
			case "field":
				c.field = val
			case "value":
				c.value = val
			case "want":
				c.want = append(c.want, val)
			}
		}
		require.True(t, described, "%s: no '# hostile:' line says what it tries", f)
		require.True(t, c.field != "" || len(c.want) > 0, "%s: expects nothing", f)
		cases = append(cases, c)
	}
	return cases
}

// generatedHostile makes the cases too big or too odd to commit: a file
// over the size limit, NUL bytes, bytes that are not UTF-8, more devices
// than the limit, a FIFO, a directory and a missing file.
func generatedHostile(t *testing.T) []hostileCase {
	t.Helper()
	dir := t.TempDir()
	gpu := "devices:\n  - pci:\n      bus_id: \"0000:18:00.0\"\n      device_id: 0x233010DE\n"
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o644))
		return p
	}
	var many strings.Builder
	many.WriteString("device_defaults:\n  pci:\n    device_id: 0x233010DE\ndevices:\n")
	for i := range profile.MaxDevices + 1 {
		fmt.Fprintf(&many, "  - pci: {bus_id: \"%04x:%02x:%02x.0\"}\n", i>>8, (i&0xff)>>5+1, i&0x1f)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))
	sub := filepath.Join(dir, "directory.yaml")
	require.NoError(t, os.Mkdir(sub, 0o755))
	return []hostileCase{
		{path: write("too-large.yaml", []byte(gpu+"# "+strings.Repeat("x", profile.MaxSize)+"\n")), want: []string{"larger than the 4 MiB limit"}},
		{path: write("nul-byte.yaml", []byte(gpu+"\x00\n")), want: []string{"NUL byte at offset"}},
		{path: write("not-utf8.yaml", []byte(gpu+"# caf\xe9\n")), want: []string{"not UTF-8"}},
		{path: write("too-many-devices.yaml", []byte(many.String())), field: "devices", value: strconv.Itoa(profile.MaxDevices + 1)},
		{path: fifo, want: []string{"not a regular file"}},
		{path: sub, want: []string{"not a regular file"}},
		{path: filepath.Join(dir, "missing.yaml"), want: []string{"no such file"}},
	}
}

// TestHostileProfilesAreRefused runs the real binary on every hostile
// profile against a rendered tree: exit status 1, exactly one line on
// stderr naming the file, the field and the value, nothing on stdout, and
// the tree untouched, down to inode numbers and modification times.
func TestHostileProfilesAreRefused(t *testing.T) {
	t.Parallel()
	bin := binaries.Binary(t)
	root := filepath.Join(t.TempDir(), "root")
	render(t, bin, root, "t4-vm")
	before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
	cases := append(readHostileCorpus(t), generatedHostile(t)...)
	for _, c := range cases {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			r := runBinary(t, bin, "render", "--root", root, "--profile", c.path)
			require.Equal(t, 1, r.code, "stderr: %s", r.stderr)
			require.Empty(t, r.stdout)
			require.True(t, strings.HasSuffix(r.stderr, "\n") && strings.Count(r.stderr, "\n") == 1, "want one line, got %q", r.stderr)
			require.Contains(t, r.stderr, "profile "+c.path)
			if c.field != "" {
				require.Contains(t, r.stderr, ": "+c.field+": ")
			}
			if c.value != "" {
				require.Contains(t, r.stderr, "value "+strconv.Quote(c.value))
			}
			for _, w := range c.want {
				require.Contains(t, r.stderr, w)
			}
			overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "the refused render changed the tree")
		})
	}
	t.Logf("FIGURES hostile: %d hostile profiles refused, each with one line, the tree unchanged", len(cases))
}

// TestRootFlagIsChecked refuses roots the writer must never use, before
// anything is created.
func TestRootFlagIsChecked(t *testing.T) {
	t.Parallel()
	bin := binaries.Binary(t)
	dir := t.TempDir()
	for _, root := range []string{"", "relative/root", "./root", "/", "//", dir + "/", dir + "/./root", dir + "/x/../root"} {
		t.Run(strconv.Quote(root), func(t *testing.T) {
			r := runBinary(t, bin, "render", "--root", root, "--profile", "t4-vm")
			require.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
			require.Contains(t, r.stderr, "--root")
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, entries)
		})
	}
}
