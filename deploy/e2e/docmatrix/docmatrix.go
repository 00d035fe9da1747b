// Package docmatrix keeps the matrices in docs/ true to the suites that
// produce them. A suite prints its matrix as a Markdown table; the page in
// docs/ holds a copy between two markers, and every full run of the suite
// compares its table with that copy's shape: the same header, the same
// rows (named by their leading key cells), and the same verdict in every
// other cell (✓, ✗ or –, whatever text follows, which may name the host's
// own devices or a timing). A drifted copy fails the run with a message
// saying how to rewrite it: run the suite with UpdateEnv=1 (make docs),
// which writes the fresh table between the markers instead.
//
// The consumer matrix (docs/evidence/consumers.md, deploy/e2e/consumermatrix), the runtime
// suite's (docs/evidence/runtime.md, deploy/e2e/containerdtest) and the Kubernetes suite's
// (docs/evidence/kubernetes.md, deploy/e2e/node) are each one Page.
package docmatrix

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// UpdateEnv names the variable that, set to 1, makes Sync write the fresh
// table into the page instead of comparing (make docs sets it).
const UpdateEnv = "NVML_MOCK_SYSFS_UPDATE_DOCS"

// Page is a page in docs/ that holds a suite's matrix.
type Page struct {
	// Path is the page's file: docs/evidence/consumers.md below the repository's
	// top, as the suite's test finds it (../../../docs/evidence/consumers.md).
	Path string
	// Suite names what writes the table, in the markers and messages:
	// "deploy/e2e/consumermatrix TestConsumers". A page may hold several
	// suites' tables: each is found by the begin marker naming its Suite.
	Suite string
	// Keys is how many leading cells name a row (profile, served): those
	// are compared as text, every other cell by its verdict.
	Keys int
}

// The markers around the generated table. The text after begin says
// which suite wrote it.
const (
	beginMarker = "<!-- BEGIN generated matrix: "
	endMarker   = "<!-- END generated matrix -->"
)

// Sync compares the table a run printed (Markdown; lines that are not
// table rows are ignored) with the page's copy, failing t with every
// difference and how to fix it; with UpdateEnv=1 it writes the table into
// the page instead. fresh names the file the run wrote its table to, for
// the message ("" when it wrote none).
func (p Page) Sync(t testing.TB, table, fresh string) {
	t.Helper()
	switch {
	case partial():
		t.Logf("some subtests only (-run with a /, or -skip): %s not compared", p.Path)
		return
	case os.Getenv(programs.SabotageEnv) != "", os.Getenv(programs.ExtraProfilesEnv) != "":
		t.Logf("this run's matrix is not the committed one (%s or %s set): %s not compared", programs.SabotageEnv, programs.ExtraProfilesEnv, p.Path)
		return
	}
	RequireJudged(t, p.Suite, table)
	data, err := os.ReadFile(p.Path)
	if err != nil {
		t.Fatalf("%s: %v (the page for %s's matrix)", p.Path, err, p.Suite)
	}
	before, committed, after, err := split(string(data), p.Suite)
	if err != nil {
		t.Fatalf("%s: %v", p.Path, err)
	}
	rows := TableRows(table)
	if os.Getenv(UpdateEnv) == "1" {
		text := before + beginMarker + p.Suite + " -->\n" + strings.Join(rows, "\n") + "\n" + endMarker + after
		if err := os.WriteFile(p.Path, []byte(text), 0o644); err != nil {
			t.Fatalf("update %s: %v", p.Path, err)
		}
		t.Logf("%s=1: wrote this run's matrix into %s", UpdateEnv, p.Path)
		return
	}
	if diffs := p.Diff(TableRows(committed), rows); len(diffs) > 0 {
		from := "this run's table"
		if fresh != "" {
			from = fresh
		}
		abs, _ := filepath.Abs(p.Path)
		t.Errorf("%s does not match this run of %s:\n  %s\nrewrite it from %s: make docs (or %s=1 with this run's command)", abs, p.Suite, strings.Join(diffs, "\n  "), from, UpdateEnv)
	}
}

// Committed returns the page's copy of the matrix: the table between its
// markers, those naming Suite where the page holds several.
func (p Page) Committed() (string, error) {
	data, err := os.ReadFile(p.Path)
	if err != nil {
		return "", err
	}
	_, table, _, err := split(string(data), p.Suite)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p.Path, err)
	}
	return table, nil
}

// partial reports whether this run selects some subtests only (-run with
// a /, or -skip): its table has fewer rows on purpose.
func partial() bool {
	run, skip := flag.Lookup("test.run"), flag.Lookup("test.skip")
	return (run != nil && strings.Contains(run.Value.String(), "/")) || (skip != nil && skip.Value.String() != "")
}

// split cuts a page into the text before suite's table, the table and
// the text after (which begins with a newline, if any). A page may hold
// several suites' tables, each between markers naming its suite; suite ""
// takes the page's one table.
func split(page, suite string) (before, table, after string, err error) {
	begin := beginMarker + suite
	if suite == "" {
		if n := strings.Count(page, beginMarker); n > 1 {
			return "", "", "", fmt.Errorf("%d generated matrices: name the suite whose table to take", n)
		}
	} else {
		begin += " -->"
		if n := strings.Count(page, begin); n > 1 {
			return "", "", "", fmt.Errorf("%d lines %q: want one", n, begin)
		}
	}
	b := strings.Index(page, begin)
	e := -1
	if b >= 0 {
		e = strings.Index(page[b:], endMarker)
	}
	if e < 0 {
		return "", "", "", fmt.Errorf("no generated matrix: want a line starting %q and, after it, %q", begin, endMarker)
	}
	e += b
	body := page[b:e]
	nl := strings.IndexByte(body, '\n')
	if nl < 0 {
		return "", "", "", fmt.Errorf("the line %q has nothing after it", begin)
	}
	return page[:b], body[nl+1:], page[e+len(endMarker):], nil
}

// TableRows returns the lines of text that are Markdown table rows,
// trimmed, the header and its separator included.
func TableRows(text string) []string {
	var rows []string
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "|") {
			rows = append(rows, line)
		}
	}
	return rows
}

// cells splits a table row into its trimmed cells.
func cells(row string) []string {
	parts := strings.Split(strings.Trim(row, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// verdicts are the marks a cell's verdict starts with.
var verdicts = []string{"✓", "✗", "–"}

// shape is a row as compared: its key cells, then each other cell's
// verdict, or the whole cell where it has none.
func (p Page) shape(row string) string {
	c := cells(row)
	for i := p.Keys; i < len(c); i++ {
		for _, v := range verdicts {
			if strings.HasPrefix(c[i], v) {
				c[i] = v
			}
		}
	}
	return strings.Join(c, " | ")
}

// notRun starts a cell whose row was not run, saying why.
const notRun = programs.NotRunPrefix

// sameShape reports whether a run's row shape matches the page's: cell by
// cell, a cell not run matching whatever the page says, since the page
// holds a run with every program supplied.
func sameShape(want, got string) bool {
	w, g := strings.Split(want, " | "), strings.Split(got, " | ")
	if len(w) != len(g) {
		return false
	}
	for i := range w {
		if w[i] != g[i] && !strings.HasPrefix(g[i], notRun) {
			return false
		}
	}
	return true
}

// Diff lists how the rows of a run (got) differ in shape from the page's
// (want): rows missing or added, and rows whose verdicts changed. The
// header is compared as text.
func (p Page) Diff(want, got []string) []string {
	key := p.key
	var diffs []string
	if len(want) == 0 || len(got) == 0 {
		if len(want) != len(got) {
			return []string{fmt.Sprintf("the page has %d table lines, the run %d", len(want), len(got))}
		}
		return nil
	}
	if want[0] != got[0] {
		diffs = append(diffs, fmt.Sprintf("header: page %q, run %q", want[0], got[0]))
	}
	wantRows, gotRows := map[string]string{}, map[string]string{}
	var order []string
	for _, row := range want[min(2, len(want)):] {
		wantRows[key(row)] = p.shape(row)
		order = append(order, key(row))
	}
	for _, row := range got[min(2, len(got)):] {
		gotRows[key(row)] = p.shape(row)
		if _, ok := wantRows[key(row)]; !ok {
			diffs = append(diffs, "row the page lacks: "+row)
		}
	}
	for _, k := range order {
		switch g, ok := gotRows[k]; {
		case !ok:
			diffs = append(diffs, "row the run lacks: "+k)
		case !sameShape(wantRows[k], g):
			diffs = append(diffs, fmt.Sprintf("row %s: page %q, run %q", k, wantRows[k], g))
		}
	}
	if len(diffs) == 0 && !slices.Equal(order, p.keys(got)) {
		diffs = append(diffs, "the rows are in another order")
	}
	return diffs
}

// key is a row's key cells.
func (p Page) key(row string) string {
	c := cells(row)
	return strings.Join(c[:min(p.Keys, len(c))], " | ")
}

// keys lists the key of every row after the header and separator.
func (p Page) keys(rows []string) []string {
	var keys []string
	for _, row := range rows[min(2, len(rows)):] {
		keys = append(keys, p.key(row))
	}
	return keys
}

// Rows collects a suite's matrix, one row per subtest whose verdict is
// known only as it ends: Expect registers the row, and the subtest's end
// marks it ✓ (passed), ✗ (failed) or – (skipped). Subtests may run in
// parallel.
type Rows struct {
	mu     sync.Mutex
	rows   []string
	notRun map[testing.TB]string
}

// NotRun makes the row of the subtest t, registered with Expect, say why
// in place of its verdict: its program was not supplied (programs.NotRun),
// or another reason after programs.NotRunPrefix, the line make test's
// closing line counts. A why that does not start so fails the row: a row
// is ✓, ✗ or not run, never a mark of its own. The subtest should return;
// it passes.
func (r *Rows) NotRun(t testing.TB, why string) {
	t.Helper()
	if !strings.HasPrefix(why, notRun) {
		t.Errorf("the row says %q: a row passes, fails, or is not run saying why after %q, which make test's closing line counts", why, notRun)
		return
	}
	t.Log(why)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.notRun == nil {
		r.notRun = map[testing.TB]string{}
	}
	r.notRun[t] = why
}

// Expect makes the subtest t the row of cells, the last being what it must
// show: "| cells... | ✓ want |" when it passes.
func (r *Rows) Expect(t testing.TB, cells ...string) {
	t.Cleanup(func() {
		mark := "✓"
		switch {
		case t.Skipped():
			mark = "–"
		case t.Failed():
			mark = "✗"
		}
		row := slices.Clone(cells)
		row[len(row)-1] = mark + " " + row[len(row)-1]
		r.mu.Lock()
		defer r.mu.Unlock()
		if why, ok := r.notRun[t]; ok && !t.Failed() {
			row[len(row)-1] = why
		}
		r.rows = append(r.rows, "| "+strings.Join(row, " | ")+" |")
	})
}

// Unreached adds each row of rows (its cells, the verdict's last) that no
// subtest registered with Expect, red: "✗ not reached: why" in place of
// its verdict. A suite that a failure stopped before its later rows calls
// it before it writes its matrix (in a Cleanup, which runs however the
// test ends), so that the matrix still has every cell, and the cells it
// never judged read as failed, not missing.
func (r *Rows) Unreached(why string, rows ...[]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cells := range rows {
		key := "| " + strings.Join(cells[:len(cells)-1], " | ") + " | "
		if slices.ContainsFunc(r.rows, func(row string) bool { return strings.HasPrefix(row, key) }) {
			continue
		}
		row := slices.Clone(cells)
		row[len(row)-1] = "✗ not reached: " + why
		r.rows = append(r.rows, "| "+strings.Join(row, " | ")+" |")
	}
}

// Table is the matrix as Markdown under the header's cells.
func (r *Rows) Table(header ...string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return "| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n" + strings.Join(r.rows, "\n") + "\n"
}

// Verdicts are the verdict cells of a suite's matrix, by name: a cell's
// row's other cells joined by " | " and, where a row has several
// verdicts, " / " and its column's header.
type Verdicts struct {
	Red, Green []string
	// NotSupplied are the cells not run because their program was not
	// supplied (programs.NotRun's "not run: <program> not supplied").
	NotSupplied []string
	// Unjudged are every other cell: not checked (–, alone or with why)
	// or not run for another reason.
	Unjudged []string
}

// RequireJudged fails t where the matrices in text, suite's, judged no
// row (no ✓ or ✗) unless every row was not run because its program was
// not supplied, the one reason a suite may judge nothing (make test counts
// those rows): a suite that ran no row, or only rows it could not judge,
// must not pass. A run of some subtests only (-run with a /, or -skip) is
// not checked.
func RequireJudged(t testing.TB, suite, text string) {
	t.Helper()
	if partial() {
		return
	}
	v := ReadVerdicts(text)
	if len(v.Red)+len(v.Green) > 0 || (len(v.NotSupplied) > 0 && len(v.Unjudged) == 0) {
		return
	}
	t.Errorf("%s judged no row: %d rows not run for want of a program, %d not judged, in:\n%s", suite, len(v.NotSupplied), len(v.Unjudged), text)
}

// ReadVerdicts reads the verdict cells of the Markdown tables in text.
func ReadVerdicts(text string) Verdicts {
	var v Verdicts
	var header []string
	for _, row := range TableRows(text) {
		c := cells(row)
		switch {
		case strings.HasPrefix(strings.ReplaceAll(row, " ", ""), "|---"):
			continue
		case !slices.ContainsFunc(c, isVerdict):
			header = c
			continue
		}
		key := slices.DeleteFunc(slices.Clone(c), isVerdict)
		several := len(c)-len(key) > 1
		for i, cell := range c {
			if !isVerdict(cell) {
				continue
			}
			name := strings.Join(key, " | ")
			if several && i < len(header) {
				name += " / " + header[i]
			}
			switch {
			case strings.HasPrefix(cell, "✗"):
				v.Red = append(v.Red, name)
			case strings.HasPrefix(cell, "✓"):
				v.Green = append(v.Green, name)
			case notSupplied(cell):
				v.NotSupplied = append(v.NotSupplied, name)
			default:
				v.Unjudged = append(v.Unjudged, name)
			}
		}
	}
	return v
}

// notSupplied reports whether a cell is a row not run because a program
// the suites take supplied was not (programs.NotRun).
func notSupplied(cell string) bool {
	return slices.ContainsFunc(programs.SuppliedNames(), func(name string) bool {
		return strings.HasPrefix(cell, programs.NotRun("", name))
	})
}

// isVerdict reports whether a cell is a verdict: a mark (verdicts; –, alone
// or before why, for a cell not checked) or a row not run.
func isVerdict(cell string) bool {
	return cell == "–" || strings.HasPrefix(cell, "– ") || strings.HasPrefix(cell, "✓") || strings.HasPrefix(cell, "✗") || strings.HasPrefix(cell, notRun)
}
