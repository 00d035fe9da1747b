// Command build-consumers builds every real consumer and runtime the
// end-to-end suites use, with one progress line per program, before the
// tests run: go test buffers a package's output until it ends, so a cold
// build inside a test would show nothing for many minutes. The tests then
// find every build in the cache.
//
//	go run ./compat/consumers/build-consumers [-third-party DIR] [-only NAME,...]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/consumers"
)

func main() {
	thirdParty := flag.String("third-party", "../shared/third-party", "the directory of the vendored source tarballs")
	only := flag.String("only", "", "build only these programs (comma-separated names); empty builds all")
	flag.Parse()
	repo, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "build-consumers:", err)
		os.Exit(1)
	}
	tp, err := filepath.Abs(*thirdParty)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build-consumers:", err)
		os.Exit(1)
	}
	if _, err := os.Stat(tp); err != nil {
		fmt.Fprintf(os.Stderr, "build-consumers: %s is absent, so the end-to-end suites will skip: %v\n", tp, err)
		return
	}
	c := consumers.Cache{Repo: repo, ThirdParty: tp}
	start := time.Now()
	programs := consumers.All()
	if *only != "" {
		names := strings.Split(*only, ",")
		programs = slices.DeleteFunc(programs, func(p consumers.Program) bool { return !slices.Contains(names, p.Name) })
		if len(programs) != len(names) {
			fmt.Fprintf(os.Stderr, "build-consumers: -only %s: a name is not one of the programs\n", *only)
			os.Exit(2)
		}
	}
	for i, p := range programs {
		fmt.Fprintf(os.Stderr, "consumers: [%d/%d] %s\n", i+1, len(programs), p.Name)
		if _, err := c.Build(p); err != nil {
			fmt.Fprintln(os.Stderr, "build-consumers:", err)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "consumers: %d programs ready in %s\n", len(programs), time.Since(start).Round(time.Second))
}
