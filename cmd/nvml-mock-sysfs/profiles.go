package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func runProfiles(e *env, args []string) int {
	fs := newFlags(e, "profiles", "[--show NAME]")
	show := fs.String("show", "", "print a built-in profile as YAML")
	if code, ok := parse(e, fs, args); !ok {
		return code
	}
	if *show != "" {
		p, ok := builtin.Get(*show)
		if !ok {
			return usageError(e, "profiles", "--show %q: not a built-in profile (%s)", *show, strings.Join(builtin.Names(), ", "))
		}
		out, err := profile.Marshal(p, fmt.Sprintf("nvml-mock-sysfs built-in profile %q", *show))
		if err != nil {
			return fail(e, "%v", err)
		}
		_, _ = e.stdout.Write(out)
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NAME\tGPUS\tDESCRIPTION\n")
	for _, b := range builtin.All() {
		def := ""
		if b.Name == builtin.Default {
			def = " (default)"
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%s\n", b.Name, def, len(b.Profile().Devices), b.Description)
	}
	if err := tw.Flush(); err != nil {
		return fail(e, "%v", err)
	}
	return exitOK
}
