// Command testsummary prints make test's closing line from the files of
// test2json events gotestsum wrote, one a pass: how many tests passed,
// failed and were skipped, and which were skipped, so a run that quietly
// skipped coverage says so in its last line; then how many rows were not
// run because their program was not supplied (NVML_MOCK_SYSFS_PROGRAMS), by
// program, and which rows were not run for a reason of their own. Before it, for each package with a failed test that ran in a
// shuffled order, the command that replays that order. It exits 1 when a
// test failed.
//
//	go run .ci/testsummary.go bin/test-events-unit.json bin/test-events-wing.json
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// event is the part of a test2json event (go doc test2json) read here.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// notRun matches the line a suite logs for a row it did not run
// (docmatrix.Rows.NotRun, programs.NotRunPrefix), as t.Log prints it:
// "file.go:12: not run: WHY". A matrix that quotes the line in a cell (the
// sabotage suite logs the matrices of its runs) does not match.
var notRun = regexp.MustCompile(`^\s*\S+\.go:\d+: not run: (.+)$`)

// notSupplied matches the why of a row not run because its program was
// not supplied (programs.NotRun): "PROGRAM not supplied: ROW".
var notSupplied = regexp.MustCompile(`^(\S+) not supplied: `)

// shuffled matches the line a test binary run with -shuffle prints first.
var shuffled = regexp.MustCompile(`^-test\.shuffle (\d+)$`)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsummary EVENTS.json...")
		os.Exit(2)
	}
	s := summary{notSupplied: map[string]int{}, seen: map[string]bool{}, seeds: map[string]string{}, failedIn: map[string]bool{}}
	for _, file := range os.Args[1:] {
		if err := s.read(file); err != nil {
			fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
			os.Exit(2)
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(s.failedIn)) {
		if seed, ok := s.seeds[pkg]; ok {
			fmt.Printf("replay %s's order: go test -shuffle %s %s\n", path.Base(pkg), seed, pkg)
		}
	}
	fmt.Println(s.line())
	if s.failed > 0 {
		os.Exit(1)
	}
}

// summary is what the closing line says.
type summary struct {
	passed, failed int
	skipped        []string
	// notSupplied counts the rows not run by the program not supplied;
	// notRun names the tests of rows not run for another reason, one a
	// row.
	notSupplied map[string]int
	notRun      []string
	seen        map[string]bool // the not-run lines counted, by package
	// seeds is each shuffled package's seed; failedIn the packages with a
	// failed test.
	seeds    map[string]string
	failedIn map[string]bool
}

func (s summary) line() string {
	line := fmt.Sprintf("make test: %d passed, %d failed, %d skipped", s.passed, s.failed, len(s.skipped))
	if len(s.skipped) > 0 {
		line += ": " + strings.Join(s.skipped, ", ")
	}
	if len(s.notSupplied) > 0 {
		n := 0
		var by []string
		for _, p := range slices.Sorted(maps.Keys(s.notSupplied)) {
			n += s.notSupplied[p]
			by = append(by, fmt.Sprintf("%s %d", p, s.notSupplied[p]))
		}
		line += fmt.Sprintf("; %d rows not run, their programs not supplied (%s)", n, strings.Join(by, ", "))
	}
	if len(s.notRun) > 0 {
		line += fmt.Sprintf("; %d rows not run for a reason of their own, which their tests log: %s", len(s.notRun), strings.Join(s.notRun, ", "))
	}
	return line
}

// read adds the events of file: a test's last pass, fail or skip, each
// distinct not-run line of a test's output (by program, where its program
// was not supplied; by test otherwise), and a shuffled package's seed.
func (s *summary) read(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a build error's line, which gotestsum reports itself
		}
		if e.Test == "" {
			if m := shuffled.FindStringSubmatch(strings.TrimSpace(e.Output)); e.Action == "output" && m != nil {
				s.seeds[e.Package] = m[1]
			}
			continue // a package's own pass or fail
		}
		name := path.Base(e.Package) + "." + e.Test
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
			s.failedIn[e.Package] = true
		case "skip":
			s.skipped = append(s.skipped, name)
		case "output":
			m := notRun.FindStringSubmatch(strings.TrimRight(e.Output, "\n"))
			if m == nil || s.seen[e.Package+" "+m[0]] {
				continue
			}
			s.seen[e.Package+" "+m[0]] = true
			if p := notSupplied.FindStringSubmatch(m[1]); p != nil {
				s.notSupplied[p[1]]++
			} else {
				s.notRun = append(s.notRun, name)
			}
		}
	}
	return sc.Err()
}
