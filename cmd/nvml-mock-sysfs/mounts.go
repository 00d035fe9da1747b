package main

import (
	"fmt"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// runMounts prints the mount set for an NRI plugin (or a person) to apply:
// the same list the CDI spec carries.
func runMounts(e *env, args []string) int {
	flags := newFlags(e, "mounts", "--root DIR [--container-root DIR] [--also-at PATH]... [--fail-open] [--format table|json]")
	var a mountArgs
	a.register(flags)
	var format outputFormat
	format.register(flags)
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if code, ok := format.check(e, "mounts"); !ok {
		return code
	}
	sv, code, ok := a.resolve(e, "mounts")
	if !ok {
		return code
	}
	mounts := sv.mounts
	if !sv.rendered {
		mounts = []cdispec.Mount{}
	}
	err := format.write(e.stdout, mounts, func() error {
		var rows [][]string
		for _, m := range mounts {
			rows = append(rows, []string{m.Source, m.Destination, strings.Join(m.Options, ",")})
		}
		if err := writeTable(e.stdout, []string{"SOURCE", "DESTINATION", "OPTIONS"}, rows); err != nil {
			return err
		}
		// The JSON list stays mounts alone (plugins parse it, often with
		// stderr folded in); the table, for a person, names the variables
		// the CDI spec also sets, which whoever applies the list must set.
		for _, v := range sv.env {
			if _, err := fmt.Fprintf(e.stdout, "and in the container's environment: %s (the CDI spec sets it)\n", v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fail(e, "mounts: %v", err)
	}
	return exitOK
}
