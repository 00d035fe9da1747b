package serve

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"sync"
	"syscall"

	"github.com/google/renameio/v2"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writable"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// writableTree is the writable mode's tree on disk and what answers writes
// to it (the FUSE view's fusetree.Controller): the planner of the last
// render, the state writes left, and the plan showing both. It serialises
// writes and renders, so every write sees the tree the one before it left.
//
// A write plans from the planner alone: the machine the last render
// normalised and the host facts it read. It reads no profile and calls
// nothing of the render's options: serve's Sync collects a render's
// warnings through its Warn into a slice that its log reads unlocked.
type writableTree struct {
	mu    sync.Mutex // held across a write or a render
	root  string
	state string // the state file
	// planner and wo are the last render's: what a write plans from, and
	// the writer options it writes with.
	planner *overlay.Planner
	wo      writer.Options
	written plan.WrittenState
	plan    *plan.Plan
	// fresh is true until the first render, which compares the tree on disk
	// byte for byte: writes do not sync the tree (the state file is what
	// must survive), so a tree left by a crash is checked, not trusted.
	fresh bool
}

// openWritableTree reads the state a tree at root was left in (none at
// first), from stateFile, or root's writable.StateFile when it is empty.
func openWritableTree(root, stateFile string) (*writableTree, error) {
	if stateFile == "" {
		stateFile = path.Join(root, writable.StateFile)
	}
	ws, err := readState(stateFile)
	if err != nil {
		return nil, err
	}
	return &writableTree{root: root, state: stateFile, written: ws, fresh: true}, nil
}

// Plan is the plan the tree shows now; nil before the first render.
func (c *writableTree) Plan() *plan.Plan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plan
}

// Written is a copy of the state writes left.
func (c *writableTree) Written() plan.WrittenState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.written)
}

// Render renders opts (its Root must be the tree's) with the written
// state, and returns the plan, what the writer did, and the paths whose
// entries changed. State for a function the profile no longer has (at its
// address, with its vendor and device) is dropped, and so is a virtual
// function whose physical function no longer enables it. The planner it
// makes is what later writes plan from.
func (c *writableTree) Render(opts overlay.Options) (*plan.Plan, writer.Stats, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if opts.Root != c.root {
		return nil, writer.Stats{}, nil, fmt.Errorf("render into %s: the writable tree is %s", opts.Root, c.root)
	}
	opts.Writable = true
	pl, err := overlay.NewPlanner(opts)
	if err != nil {
		return nil, writer.Stats{}, nil, err
	}
	base, err := pl.Plan(nil)
	if err != nil {
		return nil, writer.Stats{}, nil, err
	}
	ws := writable.Prune(base, c.written)
	p := base
	if len(ws) > 0 {
		if p, err = pl.Plan(ws); err != nil {
			return nil, writer.Stats{}, nil, err
		}
	}
	if !maps.Equal(ws, c.written) {
		if err := writeState(c.state, ws, p); err != nil {
			return nil, writer.Stats{}, nil, err
		}
		c.written = ws
	}
	wo := opts.Writer
	if c.fresh {
		wo.CompareContent = true
	}
	st, err := writer.Apply(c.root, p, wo)
	if err != nil {
		return p, st, nil, fmt.Errorf("render into %s: %w", c.root, err)
	}
	changed := writable.Changed(c.plan, p)
	c.planner, c.wo, c.plan, c.fresh = pl, opts.Writer, p, false
	return p, st, changed, nil
}

// Writable reports whether rel is a writable attribute of the tree.
func (c *writableTree) Writable(rel string) bool {
	// The FUSE view asks at every open: the name alone turns nearly every
	// file away without the lock, which a write holds for milliseconds.
	if !writable.AttributeName(rel) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return false
	}
	_, ok := writable.Classify(c.plan, rel)
	return ok
}

// Write is one write(2) of data to rel: the kernel's answer
// (writable.Apply), the state saved, then the tree planned from the last
// render's planner and written, all before it returns. It returns the
// errno the writer sees and the paths whose entries changed. EACCES
// answers a write to anything else, as sysfs does a read-only attribute;
// EIO a state or tree that cannot be written, which leaves the state as it
// was.
func (c *writableTree) Write(rel string, data []byte) ([]string, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return nil, syscall.EACCES
	}
	a, ok := writable.Classify(c.plan, rel)
	if !ok {
		return nil, syscall.EACCES
	}
	ws, errno := writable.Apply(c.plan, c.written, a, data)
	if errno != 0 || maps.Equal(ws, c.written) {
		return nil, errno
	}
	p, err := c.planner.Plan(ws)
	if err != nil {
		// A state the planner refuses (virtual functions that would
		// collide with another function, say): the kernel would fail to
		// add them too.
		return nil, syscall.ENOSPC
	}
	if err := writeState(c.state, ws, p); err != nil {
		return nil, syscall.EIO
	}
	// Not synced: the state file is, and the first render after a start
	// compares the tree with the plan byte for byte. The tree holds the
	// plan before this write, so only what differs from it is read.
	wo := c.wo
	wo.SkipSync, wo.Holds = true, c.plan
	if _, err := writer.Apply(c.root, p, wo); err != nil {
		return nil, syscall.EIO
	}
	changed := writable.Changed(c.plan, p)
	c.written, c.plan = ws, p
	return changed, 0
}

func readState(file string) (plan.WrittenState, error) {
	data, err := profile.ReadRegularFile(file, writable.MaxStateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return plan.WrittenState{}, nil
	}
	if err != nil {
		return nil, err
	}
	return writable.ParseState(file, data)
}

// writeState replaces the state file atomically and durably: a kill at any
// moment leaves the old state or the new one. Each function's state
// records p's vendor and device (writable.Identify).
func writeState(file string, ws plan.WrittenState, p *plan.Plan) error {
	writable.Identify(ws, p)
	if err := os.MkdirAll(path.Dir(file), 0o755); err != nil {
		return fmt.Errorf("writable state %s: %w", file, err)
	}
	if err := renameio.WriteFile(file, writable.FormatState(ws), 0o644); err != nil {
		return fmt.Errorf("writable state %s: %w", file, err)
	}
	return nil
}
