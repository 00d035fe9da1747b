package writable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"sync"
	"syscall"

	"github.com/google/renameio/v2"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// StateFile is where the written state is kept by default, in the root's
// state directory beside the writer's manifest: a render never lists it.
// serve keeps it in the served root, on disk, and the tree it renders from
// it in memory.
const StateFile = writer.StateDir + "/writable.json"

// maxStateFile bounds the state file read: a function's state is a few
// dozen bytes, and a tree has at most a few thousand functions.
const maxStateFile = 4 << 20

// Controller is a writable tree: the render options, the written state and
// the plan showing both. It serialises writes and re-renders, so every
// write sees the tree the one before it left.
type Controller struct {
	mu    sync.Mutex // held across a write or a render
	state string     // the state file
	opts  overlay.Options
	ws    plan.WrittenState
	plan  *plan.Plan
	// fresh is true until the first render, which compares the tree on disk
	// byte for byte: writes do not sync the tree (the state file is what
	// must survive), so a tree left by a crash is checked, not trusted.
	fresh bool
}

// Open reads the state a tree at root was left in (none at first), from
// stateFile, or root's StateFile when it is empty.
func Open(root, stateFile string) (*Controller, error) {
	if stateFile == "" {
		stateFile = path.Join(root, StateFile)
	}
	ws, err := readState(stateFile)
	if err != nil {
		return nil, err
	}
	c := &Controller{state: stateFile, ws: ws, fresh: true}
	c.opts.Root = root
	return c, nil
}

// Plan is the plan the tree shows now; nil before the first render.
func (c *Controller) Plan() *plan.Plan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plan
}

// Written is a copy of the state writes left.
func (c *Controller) Written() plan.WrittenState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return clone(c.ws)
}

// Render renders opts (its Root must be the controller's) with the runtime
// state, and returns the plan, what the writer did, and the paths whose
// entries changed. State for a function the profile no longer has (at its
// address, with its vendor and device) is dropped, and so is a virtual
// function whose physical function no longer enables it.
func (c *Controller) Render(opts overlay.Options) (*plan.Plan, writer.Stats, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if opts.Root != c.opts.Root {
		return nil, writer.Stats{}, nil, fmt.Errorf("render into %s: the writable tree is %s", opts.Root, c.opts.Root)
	}
	opts.Writable, opts.Written = true, nil
	base, err := overlay.Plan(opts)
	if err != nil {
		return nil, writer.Stats{}, nil, err
	}
	ws := prune(base, c.ws)
	opts.Written = ws
	p := base
	if len(ws) > 0 {
		if p, err = overlay.Plan(opts); err != nil {
			return nil, writer.Stats{}, nil, err
		}
	}
	if !maps.Equal(ws, c.ws) {
		if err := writeState(c.state, ws, p); err != nil {
			return nil, writer.Stats{}, nil, err
		}
		c.ws = ws
	}
	wo := opts.Writer
	if c.fresh {
		wo.CompareContent = true
	}
	st, err := writer.Apply(opts.Root, p, wo)
	if err != nil {
		return p, st, nil, fmt.Errorf("render into %s: %w", opts.Root, err)
	}
	changed := Changed(c.plan, p)
	c.opts, c.plan, c.fresh = opts, p, false
	return p, st, changed, nil
}

// prune keeps the state of the functions base (the profile's plan) still
// has, as the same vendor and device, and of the virtual functions their
// state still enables.
func prune(base *plan.Plan, ws plan.WrittenState) plan.WrittenState {
	out := plan.WrittenState{}
	for a, st := range ws {
		f, ok := base.Functions[a]
		if !ok || st.ID != f.ID {
			continue
		}
		if st.NumVFs > f.TotalVFs {
			st.NumVFs = 0
		}
		out[a] = st
	}
	for a, st := range ws {
		if _, ok := base.Functions[a]; ok {
			continue
		}
		// A virtual function: kept while its physical function enables it.
		for pa, pst := range out {
			if i := slices.Index(base.Functions[pa].VFs, a); i >= 0 && i < pst.NumVFs {
				out[a] = st
			}
		}
	}
	return out
}

// Writable reports whether rel is a writable attribute of the tree.
func (c *Controller) Writable(rel string) bool {
	// The FUSE view asks at every open: the name alone turns nearly every
	// file away without the lock, which a write holds for milliseconds.
	if !attributeName(rel) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return false
	}
	_, ok := Classify(c.plan, rel)
	return ok
}

// Write is one write(2) of data to rel: the kernel's answer (Apply), the
// state saved, then the tree rendered again, all before it returns. It
// returns the errno the writer sees and the paths whose entries changed.
// EACCES answers a write to anything else, as sysfs does a read-only
// attribute; EIO a state or tree that cannot be written, which leaves the
// state as it was.
func (c *Controller) Write(rel string, data []byte) ([]string, syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return nil, syscall.EACCES
	}
	a, ok := Classify(c.plan, rel)
	if !ok {
		return nil, syscall.EACCES
	}
	ws, errno := Apply(c.plan, c.ws, a, data)
	if errno != 0 || maps.Equal(ws, c.ws) {
		return nil, errno
	}
	opts := c.opts
	opts.Written = ws
	p, err := overlay.Plan(opts)
	if err != nil {
		// A state the planner refuses (virtual functions that would
		// collide with another function, say): the kernel would fail to
		// add them too.
		return nil, syscall.ENOSPC
	}
	identify(ws, p)
	if err := writeState(c.state, ws, p); err != nil {
		return nil, syscall.EIO
	}
	// Not synced: the state file is, and the first render after a start
	// compares the tree with the plan byte for byte. The tree holds the
	// plan before this write, so only what differs from it is read.
	opts.Writer.SkipSync, opts.Writer.Holds = true, c.plan
	if _, err := writer.Apply(opts.Root, p, opts.Writer); err != nil {
		return nil, syscall.EIO
	}
	changed := Changed(c.plan, p)
	c.ws, c.plan = ws, p
	return changed, 0
}

// identify records each function's vendor and device with its state, so
// that a profile that puts another device at its address drops it.
func identify(ws plan.WrittenState, p *plan.Plan) {
	for a, st := range ws {
		if f, ok := p.Functions[a]; ok {
			st.ID = f.ID
			ws[a] = st
		}
	}
}

// Changed lists the paths whose entries differ between two plans: added,
// removed, or with another kind, mode, content or link text.
func Changed(old, new *plan.Plan) []string {
	if old == nil {
		return nil
	}
	was := make(map[string]*plan.Entry, len(old.Entries))
	for i := range old.Entries {
		was[old.Entries[i].Path] = &old.Entries[i]
	}
	var out []string
	for i := range new.Entries {
		e := &new.Entries[i]
		o, ok := was[e.Path]
		delete(was, e.Path)
		if !ok || !o.Equal(*e) {
			out = append(out, e.Path)
		}
	}
	for p := range was {
		out = append(out, p)
	}
	return out
}

// stateFile is the state file's form: the written state by address.
type stateFile struct {
	Functions map[string]plan.FunctionState `json:"functions"`
}

func readState(file string) (plan.WrittenState, error) {
	data, err := profile.ReadRegularFile(file, maxStateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return plan.WrittenState{}, nil
	}
	if err != nil {
		return nil, err
	}
	var sf stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sf); err != nil {
		return nil, fmt.Errorf("writable state %s: %w", file, err)
	}
	ws := plan.WrittenState{}
	for k, st := range sf.Functions {
		a, err := pciaddr.Parse(k)
		if err != nil {
			return nil, fmt.Errorf("writable state %s: functions: key %q: %w", file, k, err)
		}
		if st.NumVFs < 0 || st.VFIODev < 0 {
			return nil, fmt.Errorf("writable state %s: functions[%s]: a negative number", file, k)
		}
		ws[a] = st
	}
	return ws, nil
}

// writeState replaces the state file atomically and durably: a kill at any
// moment leaves the old state or the new one.
func writeState(file string, ws plan.WrittenState, p *plan.Plan) error {
	identify(ws, p)
	sf := stateFile{Functions: map[string]plan.FunctionState{}}
	for a, st := range ws {
		sf.Functions[a.String()] = st
	}
	data, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(path.Dir(file), 0o755); err != nil {
		return fmt.Errorf("writable state %s: %w", file, err)
	}
	if err := renameio.WriteFile(file, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writable state %s: %w", file, err)
	}
	return nil
}
