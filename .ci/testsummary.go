// Command testsummary prints make test's closing line from the file of
// test2json events gotestsum wrote: how many tests passed, failed and were
// skipped, and which were skipped, so a run that quietly skipped coverage
// says so in its last line; then how many rows were not run because their
// program was not supplied (NVML_MOCK_SYSFS_PROGRAMS), by program. It exits
// 1 when a test failed.
//
//	go run .ci/testsummary.go bin/test-events.json
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
// (programs.NotRun), as t.Log prints it: "file.go:12: not run: PROGRAM not
// supplied: ROW". A matrix that quotes the line in a cell (the sabotage
// suite logs the matrices of its runs) does not match.
var notRun = regexp.MustCompile(`^\s*\S+\.go:\d+: not run: (\S+) not supplied: (.+)$`)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: testsummary EVENTS.json")
		os.Exit(2)
	}
	s, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(2)
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
	// notRun counts the rows not run by the program not supplied.
	notRun map[string]int
}

func (s summary) line() string {
	line := fmt.Sprintf("make test: %d passed, %d failed, %d skipped", s.passed, s.failed, len(s.skipped))
	if len(s.skipped) > 0 {
		line += ": " + strings.Join(s.skipped, ", ")
	}
	if len(s.notRun) > 0 {
		n := 0
		var by []string
		for _, p := range slices.Sorted(maps.Keys(s.notRun)) {
			n += s.notRun[p]
			by = append(by, fmt.Sprintf("%s %d", p, s.notRun[p]))
		}
		line += fmt.Sprintf("; %d rows not run, their programs not supplied (%s)", n, strings.Join(by, ", "))
	}
	return line
}

// read counts the events of file: a test's last pass, fail or skip, and
// each distinct not-run line of a test's output.
func read(file string) (summary, error) {
	f, err := os.Open(file)
	if err != nil {
		return summary{}, err
	}
	defer f.Close()
	s := summary{notRun: map[string]int{}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue // a build error's line, which gotestsum reports itself, or a package's
		}
		name := path.Base(e.Package) + "." + e.Test
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
		case "skip":
			s.skipped = append(s.skipped, name)
		case "output":
			if m := notRun.FindStringSubmatch(strings.TrimRight(e.Output, "\n")); m != nil {
				key := e.Package + " " + m[0]
				if !seen[key] {
					seen[key] = true
					s.notRun[m[1]]++
				}
			}
		}
	}
	return s, sc.Err()
}
