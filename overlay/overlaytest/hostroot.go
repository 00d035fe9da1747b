package overlaytest

import (
	"fmt"
	"os"
	"slices"
)

// KeepHostRoot runs a test binary's tests (m.Run) and returns their code,
// or 1 when the host's root directory gained an entry meanwhile, naming
// it. A mkdir for a mountpoint in a private mount namespace still writes
// the host's disk (the empty /host-sys that Served once left behind); no
// test may create anything outside its temporary directories. Main does
// this for its callers; a TestMain that does not use Main calls it itself.
func KeepHostRoot(run func() int) int {
	before, err := rootEntries()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := run()
	after, err := rootEntries()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if added := newEntries(before, after); len(added) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %q in the host's root directory: nothing may be created outside a temporary directory\n", added)
		return 1
	}
	return code
}

// rootEntries lists the names in the host's root directory.
func rootEntries() ([]string, error) {
	entries, err := os.ReadDir("/")
	if err != nil {
		return nil, fmt.Errorf("list the host's root directory: %w", err)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

// newEntries returns the names in after that before lacks.
func newEntries(before, after []string) []string {
	var added []string
	for _, name := range after {
		if !slices.Contains(before, name) {
			added = append(added, name)
		}
	}
	return added
}
