// Command build-programs builds every program the end-to-end suites build
// from a registry (the Go module proxy), with one progress line per
// program, before the tests run: go test buffers a package's output until
// it ends, so a cold build inside a test would show nothing for many
// minutes. The tests then find every build in the cache. It also says which
// supplied programs (NVML_MOCK_SYSFS_PROGRAMS) the suites will run, and
// which rows will say "not run" without them.
//
//	go -C deploy/e2e run ./programs/build-programs [-repo DIR] [-only NAME,...]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

func main() {
	only := flag.String("only", "", "build only these programs (comma-separated names); empty builds all")
	// The wing is its own module at deploy/e2e, where go -C runs this; the
	// recipes' files are named from the repository's root.
	repo := flag.String("repo", "../..", "the repository's root, whose files the recipes name")
	flag.Parse()
	abs, err := filepath.Abs(*repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build-programs:", err)
		os.Exit(1)
	}
	c := programs.Cache{Repo: abs}
	start := time.Now()
	all := programs.All()
	if *only != "" {
		names := strings.Split(*only, ",")
		all = slices.DeleteFunc(all, func(p programs.Program) bool { return !slices.Contains(names, p.Name) })
		if len(all) != len(names) {
			fmt.Fprintf(os.Stderr, "build-programs: -only %s: a name is not one of the programs\n", *only)
			os.Exit(2)
		}
	}
	for i, p := range all {
		fmt.Fprintf(os.Stderr, "programs: [%d/%d] %s\n", i+1, len(all), p.Name)
		if _, err := c.Build(p); err != nil {
			fmt.Fprintln(os.Stderr, "build-programs:", err)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "programs: %d built from the module proxy, ready in %s\n", len(all), time.Since(start).Round(time.Second))
	if *only == "" {
		supplied, err := programs.Supplied{}.Describe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "build-programs:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "programs:", supplied)
	}
}
