package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// outputFormat is --format, which compat, verify, fidelity and mounts
// share: a table for people, or JSON for programs.
type outputFormat struct{ value string }

// register adds --format to a command's flags. It stays a plain string
// flag, checked after parsing, so that -h shows it as "--format string"
// and a bad value is reported in the command's own order of checks.
func (f *outputFormat) register(flags *flag.FlagSet) {
	flags.StringVar(&f.value, "format", "table", "table or json")
}

// check refuses a format other than table or json.
func (f *outputFormat) check(e *env, cmd string) (int, bool) {
	if f.value != "table" && f.value != "json" {
		return usageError(e, cmd, "--format %q: want table or json", f.value), false
	}
	return 0, true
}

// write prints v as indented JSON, or, for a table, calls table.
func (f *outputFormat) write(w io.Writer, v any, table func() error) error {
	if f.value == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return table()
}

// writeTable prints a header and its rows in aligned columns, as every
// table of this command is printed.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, cells := range append([][]string{header}, rows...) {
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}
