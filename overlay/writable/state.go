package writable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// StateFile is where a writable tree's state is kept by default, in the
// root's state directory beside the writer's manifest: a render never
// lists it. serve keeps it in the served root, on disk, and the tree it
// renders from it in memory.
const StateFile = writer.StateDir + "/writable.json"

// MaxStateFile bounds the state file read: a function's state is a few
// dozen bytes, and a tree has at most a few thousand functions.
const MaxStateFile = 4 << 20

// stateFile is the state file's form: the written state by address.
type stateFile struct {
	Functions map[string]plan.FunctionState `json:"functions"`
}

// ParseState reads a state file's content; file names it in the error.
func ParseState(file string, data []byte) (plan.WrittenState, error) {
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

// FormatState is the state file's content for ws.
func FormatState(ws plan.WrittenState) []byte {
	sf := stateFile{Functions: map[string]plan.FunctionState{}}
	for a, st := range ws {
		sf.Functions[a.String()] = st
	}
	// A map of strings to a struct of strings and ints always marshals.
	data, _ := json.MarshalIndent(sf, "", "  ")
	return append(data, '\n')
}

// Prune keeps the state of the functions base (the profile's plan) still
// has, as the same vendor and device, and of the virtual functions their
// state still enables: a re-render with a new profile drops the rest.
func Prune(base *plan.Plan, ws plan.WrittenState) plan.WrittenState {
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
	// Kept virtual functions go to a map of their own: added to out while
	// out is ranged over, one could be taken for a physical function, which
	// base does not have.
	vfs := plan.WrittenState{}
	for a, st := range ws {
		if _, ok := base.Functions[a]; ok {
			continue
		}
		// A virtual function: kept while its physical function enables it.
		for pa, pst := range out {
			if i := slices.Index(base.Functions[pa].VFs, a); i >= 0 && i < pst.NumVFs {
				vfs[a] = st
			}
		}
	}
	maps.Copy(out, vfs)
	return out
}

// Identify records each function's vendor and device (p's) with its
// state, so that a profile that puts another device at its address drops
// it (Prune).
func Identify(ws plan.WrittenState, p *plan.Plan) {
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
