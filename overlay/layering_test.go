package overlay_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPartsDoNotImportOverlay: this package ties its parts (profile, plan,
// writer, writable, ...) together, so none of them imports it. A part that
// needed it (overlay/writable's controller once did, for Plan) belongs
// beside its user, and a part that imported it could not be used by it.
// overlaytest is the tests' kit, not a part: its shared trees render
// through overlay.Render, the one real render path, as the product does.
func TestPartsDoNotImportOverlay(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	module, _, _ := strings.Cut(strings.TrimPrefix(string(mod), "module "), "\n")
	self := module + "/overlay"
	fset := token.NewFileSet()
	var files int
	err = filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && p == "overlaytest" {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || filepath.Dir(p) == "." || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			require.NotEqual(t, self, path, "%s imports its parent, overlay", p)
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 10, "the parts' files were walked")
}
