package consumermatrix_test

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// The matrix's columns: one real program each, and compat beside them.
const (
	colGFD        = "GFD gpu.mode, gpu.count"
	colGFDMachine = "GFD gpu.machine"
	colGFDVFIO    = "GFD vfio strategy"
	colDRA        = "pcieRoot (deviceattribute on NVML's bus ids)"
	colNFD        = "nfd-worker PCI labels"
	colNFDVendor  = "nfd-worker, GPU Operator's config"
	colGHW        = "ghw.PCI()"
	colNVML       = "NVML GPUs = sysfs GPUs"
	colCompat     = "compat agrees"
)

func columns() []string {
	return []string{colGFD, colGFDMachine, colGFDVFIO, colDRA, colNFD, colNFDVendor, colGHW, colNVML, colCompat}
}

// servedOrder is the order of a profile's rows.
func servedOrder() []string { return []string{servedTree, servedNone, servedEscaped, servedMerged} }

// matrix collects what each program reported, by profile, served state
// and column, for the table the suite prints.
type matrix struct {
	mu   sync.Mutex
	rows map[[2]string]*row
	runs atomic.Int64
}

func newMatrix() *matrix { return &matrix{rows: map[[2]string]*row{}} }

// row is one profile served one way.
type row struct {
	mu    sync.Mutex
	cells map[string]*cell
}

// cell is what one program reported, and whether that is what it must;
// or, notRun, why it was not judged.
type cell struct {
	texts  []string
	failed bool
	notRun string
}

func (m *matrix) row(profile, served string) *row {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{profile, served}
	if m.rows[k] == nil {
		m.rows[k] = &row{cells: map[string]*cell{}}
	}
	return m.rows[k]
}

// check appends to a cell and, unless ok, marks it failed and fails the
// test with why.
func (r *row) check(t *testing.T, column, text string, ok bool, why string) {
	r.mu.Lock()
	c := r.cells[column]
	if c == nil {
		c = &cell{}
		r.cells[column] = c
	}
	if text != "" {
		c.texts = append(c.texts, text)
	}
	c.failed = c.failed || !ok
	r.mu.Unlock()
	if !ok {
		t.Helper()
		t.Errorf("%s: %s: %s", column, strings.Join(c.texts, "; "), why)
	}
}

// notRun makes a cell say why it was not judged, after
// programs.NotRunPrefix (the line make test's closing line counts), in
// place of a mark; a check of the same cell still fails it.
func (r *row) notRun(t *testing.T, column, why string) {
	t.Helper()
	if !strings.HasPrefix(why, programs.NotRunPrefix) {
		t.Errorf("%s: %q: a cell not run says why after %q", column, why, programs.NotRunPrefix)
	}
	t.Log(why)
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cells[column]
	if c == nil {
		c = &cell{}
		r.cells[column] = c
	}
	c.notRun = why
}

// write prints the matrix as a Markdown table: each cell is what the
// program reported, ✓ where that is what it must report served that way
// (also for the negative controls), ✗ where not, – where not run, and
// why where not judged (notRun).
func (m *matrix) write(w io.Writer, profiles []suiteProfile) {
	fmt.Fprintf(w, "\n| profile | served | %s |\n|---|---|%s\n", strings.Join(columns(), " | "), strings.Repeat("---|", len(columns())))
	for _, p := range profiles {
		for _, served := range servedOrder() {
			m.mu.Lock()
			r := m.rows[[2]string{p.Name, served}]
			m.mu.Unlock()
			if r == nil {
				continue
			}
			cells := []string{p.Name, served}
			for _, col := range columns() {
				c := r.cells[col]
				switch {
				case c == nil:
					cells = append(cells, "–")
				case c.failed:
					cells = append(cells, "✗ "+strings.Join(c.texts, "; "))
				case c.notRun != "":
					cells = append(cells, strings.Join(append([]string{c.notRun}, c.texts...), "; "))
				default:
					cells = append(cells, "✓ "+strings.Join(c.texts, "; "))
				}
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		}
	}
}
