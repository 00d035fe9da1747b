// Package rendered shares rendered trees among the tests of one test
// binary. It is apart from overlaytest because it renders through the
// overlay package, whose own dependencies' tests use overlaytest.
package rendered

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Trees renders each tree once per test binary and gives every test that
// asks for it the same one. Most tests only read a rendered tree, and a
// render is the slow part of them: it creates a few thousand files and
// links, which on a busy ext4 costs seconds, and removing them again as
// much. A test that changes its tree renders its own (overlaytest.Render, or
// overlay.Render into t.TempDir()).
//
// A test package holds one in a package variable, the only state of its
// kind in the project (the no-globals rule is the product's), and removes
// the trees when its tests end:
//
//	var trees rendered.Trees
//
//	func TestMain(m *testing.M) {
//		code := overlaytest.Main(m)
//		trees.Close()
//		os.Exit(code)
//	}
//
// The zero value is ready to use.
type Trees struct {
	mu    sync.Mutex
	dir   string
	trees map[string]*sharedTree
}

type sharedTree struct {
	once sync.Once
	root string
	plan *plan.Plan
	err  error
}

// Close removes the trees; TestMain calls it once the
// tests have run.
func (c *Trees) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir != "" {
		if err := os.RemoveAll(c.dir); err != nil {
			fmt.Fprintf(os.Stderr, "remove the shared trees: %v\n", err)
		}
	}
}

// directory makes the directory of the shared trees on the first call.
func (c *Trees) directory() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "overlaytest-trees-")
		if err != nil {
			return "", fmt.Errorf("a directory for the shared trees: %w", err)
		}
		c.dir = dir
	}
	return c.dir, nil
}

// Render returns the root and plan of opts rendered by the real render
// path (overlay.Render), rendering it on the first call. The tree and plan
// are shared: the caller must not change either. opts.Root is the
// cache's, and the render skips syncfs: a shared tree is not a test of
// durability. The key is every other option, so a relative profile path
// means the same file in every test of the binary.
func (c *Trees) Render(tb testing.TB, opts overlay.Options) (string, *plan.Plan) {
	tb.Helper()
	if opts.Root != "" || opts.Warn != nil || opts.Writer != (writer.Options{}) {
		tb.Fatalf("a shared render chooses its own root and writer options and warns no one test: Root %q, Warn set %t, Writer %+v", opts.Root, opts.Warn != nil, opts.Writer)
	}
	key := fmt.Sprintf("%#v", opts)
	dir, err := c.directory()
	if err != nil {
		tb.Fatal(err)
	}
	c.mu.Lock()
	if c.trees == nil {
		c.trees = map[string]*sharedTree{}
	}
	tr := c.trees[key]
	if tr == nil {
		tr = &sharedTree{root: filepath.Join(dir, fmt.Sprint(len(c.trees)))}
		c.trees[key] = tr
	}
	c.mu.Unlock()
	tr.once.Do(func() {
		opts.Root = tr.root
		opts.Writer = writer.Options{SkipSync: true}
		tr.plan, _, tr.err = overlay.Render(opts)
	})
	if tr.err != nil {
		tb.Fatalf("shared render of %s: %v", key, tr.err)
	}
	return tr.root, tr.plan
}
