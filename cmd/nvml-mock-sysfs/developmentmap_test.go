package main

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// developmentPage opens with the house's map, a row per package.
const (
	developmentPage = "docs/development.md"
	mapHeading      = "## The house's map\n"
)

// goPackageDirs lists, slash-separated from the top of fsys, every
// directory the go command takes for a package when it matches ./...
// from the product's root and from the wing's (deploy/e2e, a module of
// its own, so both modules are one walk): a directory holding a .go file.
// It skips what the go command skips: testdata, and directories and files
// whose names begin with "." or "_". No file here has a build constraint
// that hides a package (only testdata's do), so the names alone decide;
// reading the tree keeps the test free of a call to the go toolchain.
func goPackageDirs(fsys fs.FS) ([]string, error) {
	seen := map[string]bool{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		ignored := strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
		if d.IsDir() {
			if p != "." && (ignored || name == "testdata") {
				return fs.SkipDir
			}
			return nil
		}
		if !ignored && strings.HasSuffix(name, ".go") {
			seen[path.Dir(p)] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var dirs []string
	for dir := range seen {
		dirs = append(dirs, dir)
	}
	slices.Sort(dirs)
	return dirs, nil
}

// mapRows returns the map's rows of a development page by the package
// each names (its first cell, in backquotes), and the packages named by
// more than one row.
func mapRows(page string) (rows map[string]string, twice []string, ok bool) {
	_, section, ok := strings.Cut(page, mapHeading)
	if !ok {
		return nil, nil, false
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows = map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		rest, isRow := strings.CutPrefix(line, "| `")
		if !isRow {
			continue
		}
		pkg, _, _ := strings.Cut(rest, "`")
		if _, dup := rows[pkg]; dup {
			twice = append(twice, pkg)
		}
		rows[pkg] = line
	}
	return rows, twice, true
}

// mapDrift says, as the lines to paste or delete, how a map's rows and the
// tree's packages differ: a row to add for each package the map misses
// (its text to write), each row whose package the tree does not hold.
func mapDrift(rows map[string]string, pkgs []string) (missing, extra []string) {
	for _, pkg := range pkgs {
		if _, ok := rows[pkg]; !ok {
			missing = append(missing, "| `"+pkg+"` | WHAT IT HOLDS |")
		}
	}
	for pkg, line := range rows {
		if !slices.Contains(pkgs, pkg) {
			extra = append(extra, line)
		}
	}
	slices.Sort(extra)
	return missing, extra
}

// The map that opens docs/development.md names every package of both
// modules, each once, and no other: a package added, moved or removed
// fails this until its row is, and the failure prints the rows to paste
// or drop.
func TestDevelopmentMapListsEveryPackage(t *testing.T) {
	t.Parallel()
	repo := overlaytest.Repo(t)
	pkgs, err := goPackageDirs(os.DirFS(repo))
	require.NoError(t, err)
	require.Contains(t, pkgs, "cmd/nvml-mock-sysfs", "the walk found this package")
	require.Contains(t, pkgs, "deploy/e2e/hosttest", "the walk found the wing's packages")

	page, err := os.ReadFile(filepath.Join(repo, developmentPage))
	require.NoError(t, err)
	rows, twice, ok := mapRows(string(page))
	require.True(t, ok, "%s: no %q section", developmentPage, strings.TrimSpace(mapHeading))
	require.Empty(t, twice, "%s: the map names these packages in more than one row; keep one", developmentPage)
	missing, extra := mapDrift(rows, pkgs)
	if len(missing) > 0 {
		t.Errorf("%s: the map misses these packages; add their rows:\n%s", developmentPage, strings.Join(missing, "\n"))
	}
	if len(extra) > 0 {
		t.Errorf("%s: the map names packages the tree does not hold; drop or rename these rows:\n%s", developmentPage, strings.Join(extra, "\n"))
	}
}

// The walk takes for a package what the go command does, and the map's
// rows are read from its own section alone.
func TestDevelopmentMapReadsTheTreeAsGoDoes(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"main.go":                    {},
		"a/a.go":                     {},
		"a/only_test.go":             {},
		"b/b_test.go":                {},
		"c/testdata/x/x.go":          {},
		"c/README.md":                {},
		".ci/summary.go":             {},
		"_out/y.go":                  {},
		"d/_hidden.go":               {},
		"d/.hidden.go":               {},
		"e2e/go.mod":                 {},
		"e2e/suite/suite_test.go":    {},
		"e2e/programs/testdata/p.go": {},
	}
	pkgs, err := goPackageDirs(fsys)
	require.NoError(t, err)
	require.Equal(t, []string{".", "a", "b", "e2e/suite"}, pkgs)

	page := "# Development\n\n" + mapHeading + "\n| package | what it holds |\n|---|---|\n" +
		"| `a` | one |\n| `gone` | moved away |\n| `a` | again |\n\n## Next\n\n| `b` | not the map's |\n"
	rows, twice, ok := mapRows(page)
	require.True(t, ok)
	require.Equal(t, []string{"a"}, twice)
	missing, extra := mapDrift(rows, []string{"a", "b"})
	require.Equal(t, []string{"| `b` | WHAT IT HOLDS |"}, missing)
	require.Equal(t, []string{"| `gone` | moved away |"}, extra)
}
