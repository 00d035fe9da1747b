package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
)

// runMounts prints the mount set for an NRI plugin (or a person) to apply:
// the same list the CDI spec carries.
func runMounts(e *env, args []string) int {
	fs := newFlags(e, "mounts", "--root DIR [--container-root DIR] [--also-at PATH]... [--fail-open] [--format table|json]")
	var a mountArgs
	a.register(fs)
	format := fs.String("format", "table", "table or json")
	if code, ok := parse(e, fs, args); !ok {
		return code
	}
	if *format != "table" && *format != "json" {
		return usageError(e, "mounts", "--format %q: want table or json", *format)
	}
	mounts, rendered, code, ok := a.resolve(e, "mounts")
	if !ok {
		return code
	}
	if !rendered {
		mounts = []deploy.Mount{}
	}
	if *format == "json" {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(mounts); err != nil {
			return fail(e, "mounts: %v", err)
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SOURCE\tDESTINATION\tOPTIONS\n")
	for _, m := range mounts {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Source, m.Destination, strings.Join(m.Options, ","))
	}
	if err := tw.Flush(); err != nil {
		return fail(e, "mounts: %v", err)
	}
	return exitOK
}
