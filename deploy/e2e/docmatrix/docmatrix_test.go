package docmatrix

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const committed = `| profile | served | GFD | ghw |
|---|---|---|---|
| t4 | tree | ✓ compute, count 4 | ✓ GPUs 4/4, node's 0/6 |
| t4 | no tree | ✓ unknown | – |
`

func page(t *testing.T, table string) Page {
	path := filepath.Join(t.TempDir(), "consumers.md")
	text := "# Consumers\n\nProse.\n\n" + beginMarker + "test -->\n" + table + endMarker + "\n\nMore prose.\n"
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return Page{Path: path, Suite: "test", Keys: 2}
}

func TestDiff(t *testing.T) {
	p := Page{Keys: 2}
	want := TableRows(committed)
	for name, tc := range map[string]struct {
		run  string
		diff []string
	}{
		"the same":                {run: committed},
		"other texts, other host": {run: strings.ReplaceAll(committed, "node's 0/6", "node's 0/9")},
		"a verdict turned": {run: strings.Replace(committed, "✓ unknown", "✗ compute", 1),
			diff: []string{`row t4 | no tree: page "t4 | no tree | ✓ | –", run "t4 | no tree | ✗ | –"`}},
		"a row lost": {run: strings.Split(committed, "| t4 | no tree")[0],
			diff: []string{"row the run lacks: t4 | no tree"}},
		"a row added": {run: committed + "| a100 | tree | ✓ compute | ✓ |\n",
			diff: []string{"row the page lacks: | a100 | tree | ✓ compute | ✓ |"}},
		"a column added": {run: strings.Replace(committed, "| ghw |", "| ghw | NFD |", 1),
			diff: []string{`header: page "| profile | served | GFD | ghw |", run "| profile | served | GFD | ghw | NFD |"`}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.diff, p.Diff(want, TableRows(tc.run)))
		})
	}
}

func TestSync(t *testing.T) {
	p := page(t, committed)
	p.Sync(t, "\n"+strings.ReplaceAll(committed, "4/4", "4 of 4")+"\n14 profiles, 221 program runs in 1m32s\n", "bin/consumer-matrix.md")

	// A drifted page fails the run (negative control).
	drifted := page(t, strings.Replace(committed, "✓ unknown", "✗ unknown", 1))
	var ft failRecorder
	drifted.Sync(&ft, committed, "bin/consumer-matrix.md")
	require.True(t, ft.failed)
	require.Contains(t, ft.msg, "make docs")
	require.Contains(t, ft.msg, "bin/consumer-matrix.md")

	// UpdateEnv rewrites the table between the markers and keeps the prose.
	t.Setenv(UpdateEnv, "1")
	drifted.Sync(t, committed+"\ntrailer\n", "")
	b, err := os.ReadFile(drifted.Path)
	require.NoError(t, err)
	require.Equal(t, "# Consumers\n\nProse.\n\n"+beginMarker+"test -->\n"+committed+endMarker+"\n\nMore prose.\n", string(b))
}

// TestSyncSeveral: a page holding two suites' tables, each found by the
// marker naming its suite: a run compares and rewrites its own table
// alone, and a Page without Suite is refused rather than given the first.
func TestSyncSeveral(t *testing.T) {
	other := strings.Replace(committed, "✓ unknown", "✗ unknown", 1)
	path := filepath.Join(t.TempDir(), "hook.md")
	text := "# Hook\n\n" + beginMarker + "first -->\n" + committed + endMarker + "\n\nBetween.\n\n" + beginMarker + "second -->\n" + other + endMarker + "\n"
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	first, second := Page{Path: path, Suite: "first", Keys: 2}, Page{Path: path, Suite: "second", Keys: 2}
	for p, want := range map[Page]string{first: committed, second: other} {
		got, err := p.Committed()
		require.NoError(t, err)
		require.Equal(t, want, got, p.Suite)
	}
	first.Sync(t, committed, "")
	second.Sync(t, other, "")
	var ft failRecorder
	second.Sync(&ft, committed, "") // the first's table is not the second's
	require.True(t, ft.failed)
	_, err := Page{Path: path}.Committed()
	require.ErrorContains(t, err, "2 generated matrices")
	_, err = Page{Path: path, Suite: "third"}.Committed()
	require.ErrorContains(t, err, "no generated matrix")

	t.Setenv(UpdateEnv, "1")
	second.Sync(t, committed, "")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, strings.Replace(text, other, committed, 1), string(b))
}

// failRecorder is a testing.TB that records a failure instead of failing.
type failRecorder struct {
	testing.TB
	failed bool
	msg    string
}

func (f *failRecorder) Helper() {}
func (f *failRecorder) Errorf(format string, args ...any) {
	f.failed = true
	f.msg = strings.TrimSpace(strings.Join([]string{f.msg, fmt.Sprintf(format, args...)}, "\n"))
}

func TestReadVerdicts(t *testing.T) {
	v := ReadVerdicts(`a suite's text
| profile | served | GFD | pcieRoot |
|---|---|---|---|
| p | tree | ✓ compute | ✗ 0/8 |
| p | no tree | – | not run: gpu-kubelet-plugin not supplied: x |
| q | tree | – not judged: no NUMA node | not run: the driver stops: y |

| route | it gets |
|---|---|
| ctr run | ✗ verify passes |
| CRI | ✓ verify fails |
`)
	require.Equal(t, []string{"p | tree / pcieRoot", "ctr run"}, v.Red)
	require.Equal(t, []string{"p | tree / GFD", "CRI"}, v.Green)
	require.Equal(t, []string{"p | no tree / pcieRoot"}, v.NotSupplied)
	require.Equal(t, []string{"p | no tree / GFD", "q | tree / GFD", "q | tree / pcieRoot"}, v.Unjudged, "–, with or without why, and not run for another reason than a program not supplied")
}

// TestRowsNotRun: a row not run says why after "not run: ", the line make
// test's closing line counts; a why of its own ("– not judged") fails the
// row (negative control), which shows ✗.
func TestRowsNotRun(t *testing.T) {
	var r Rows
	counted, own := &rowRecorder{}, &rowRecorder{}
	r.Expect(counted, "a", "it works")
	r.NotRun(counted, "not run: dranet not supplied: a")
	r.Expect(own, "b", "it works")
	r.NotRun(own, "– not judged: no NUMA node")
	counted.end()
	own.end()
	require.False(t, counted.failed)
	require.True(t, own.failed)
	require.Contains(t, own.msg, `the row says "– not judged: no NUMA node"`)
	require.Equal(t, "| row | result |\n|---|---|\n| a | not run: dranet not supplied: a |\n| b | ✗ it works |\n", r.Table("row", "result"))
}

// TestRowsUnreached: a row no subtest registered is written red, saying
// why; a row that ran keeps its verdict; and the verdicts read the
// unreached row as red.
func TestRowsUnreached(t *testing.T) {
	var r Rows
	ran := &rowRecorder{}
	r.Expect(ran, "a", "x", "it works")
	ran.end()
	r.Unreached("the suite stopped at a", []string{"a", "x", "it works"}, []string{"b", "y", "it works too"})
	table := r.Table("step", "served", "result")
	require.Equal(t, "| step | served | result |\n|---|---|---|\n| a | x | ✓ it works |\n| b | y | ✗ not reached: the suite stopped at a |\n", table)
	v := ReadVerdicts(table)
	require.Equal(t, []string{"b | y"}, v.Red)
	require.Equal(t, []string{"a | x"}, v.Green)
}

// TestRequireJudged: a matrix with a ✓ or ✗ passes, and one whose every
// row was not run for want of a program; one with no row, or whose rows
// were only not run for another reason or not checked, fails.
func TestRequireJudged(t *testing.T) {
	const header = "| profile | check |\n|---|---|\n"
	for text, judged := range map[string]bool{
		header + "| p | ✓ seen |\n| q | not run: the driver stops: x |\n": true,
		header + "| p | ✗ seen |\n":                                       true,
		header + "| p | not run: dranet not supplied: p |\n":              true,
		"TestX: a title and no table\n":                                   false,
		header:                                                            false,
		header + "| p | not run: the driver stops: x |\n":                 false,
		header + "| p | – |\n| q | not run: dranet not supplied: q |\n":   false,
	} {
		var ft failRecorder
		RequireJudged(&ft, "TestX", text)
		require.Equal(t, !judged, ft.failed, text)
		if !judged {
			require.Contains(t, ft.msg, "TestX judged no row")
		}
	}
}

// rowRecorder is a subtest for Rows: it records a failure and runs its
// cleanups when end is called.
type rowRecorder struct {
	failRecorder
	cleanups []func()
}

func (r *rowRecorder) Log(...any)       {}
func (r *rowRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *rowRecorder) Failed() bool     { return r.failed }
func (r *rowRecorder) Skipped() bool    { return false }
func (r *rowRecorder) end() {
	for _, f := range slices.Backward(r.cleanups) {
		f()
	}
}
