// Command testsummary prints make test's closing line: how many tests
// passed, failed and were skipped, and which were skipped, so a run that
// quietly skipped coverage (no root, no ../shared) says so in its last line.
// gotestsum runs it after the tests (--post-run-command) and hands it the
// counts and the file of test2json events it wrote.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
)

// event is the part of a test2json event (go doc test2json) read here.
type event struct {
	Action  string
	Package string
	Test    string
}

func main() {
	count := func(name string) int {
		n, err := strconv.Atoi(os.Getenv(name))
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsummary: %s=%q: run me from gotestsum --post-run-command\n", name, os.Getenv(name))
			os.Exit(2)
		}
		return n
	}
	total, failed, skipped := count("TESTS_TOTAL"), count("TESTS_FAILED"), count("TESTS_SKIPPED")
	names, err := skippedTests(os.Getenv("GOTESTSUM_JSONFILE"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: %v\n", err)
		os.Exit(1)
	}
	line := fmt.Sprintf("make test: %d passed, %d failed, %d skipped", total-failed-skipped, failed, skipped)
	if len(names) > 0 {
		line += ": " + strings.Join(names, ", ")
	}
	fmt.Println(line)
}

// skippedTests lists the skipped tests as package.Test/sub, in run order.
func skippedTests(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a build error's line, which gotestsum reports itself
		}
		if e.Action == "skip" && e.Test != "" {
			names = append(names, path.Base(e.Package)+"."+e.Test)
		}
	}
	return names, sc.Err()
}
