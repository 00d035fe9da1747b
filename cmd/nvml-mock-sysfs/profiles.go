package main

import (
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

func runProfiles(e *env, args []string) int {
	flags := newFlags(e, "profiles", "[--show NAME]")
	show := flags.String("show", "", "print a built-in profile as YAML")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if *show != "" {
		out, ok, err := shipped.File(*show)
		if !ok {
			return usageError(e, "profiles", "--show %q: not a built-in profile (%s)", *show, strings.Join(shipped.Names(), ", "))
		}
		if err != nil {
			return fail(e, "%v", err)
		}
		_, _ = e.stdout.Write(out)
		return exitOK
	}
	var rows [][]string
	for _, b := range shipped.All() {
		def := ""
		if b.Name == shipped.Default {
			def = " (default)"
		}
		rows = append(rows, []string{b.Name + def, strconv.Itoa(len(b.New().Devices)), b.Description})
	}
	if err := writeTable(e.stdout, []string{"NAME", "GPUS", "DESCRIPTION"}, rows); err != nil {
		return fail(e, "%v", err)
	}
	return exitOK
}
