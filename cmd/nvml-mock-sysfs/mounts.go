package main

import (
	"fmt"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
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
		mounts = []deploy.Mount{}
	}
	// The list stays mounts alone (its JSON is a contract); the variables
	// the CDI spec sets go to standard error, for whoever applies the list.
	for _, v := range sv.env {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: mounts: the CDI spec also sets %s; set it in the container too\n", v)
	}
	err := format.write(e.stdout, mounts, func() error {
		var rows [][]string
		for _, m := range mounts {
			rows = append(rows, []string{m.Source, m.Destination, strings.Join(m.Options, ",")})
		}
		return writeTable(e.stdout, []string{"SOURCE", "DESTINATION", "OPTIONS"}, rows)
	})
	if err != nil {
		return fail(e, "mounts: %v", err)
	}
	return exitOK
}
