package main

import (
	"cmp"
	"flag"
	"fmt"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// specArgs are the spec files that cdi and serve write: a standalone spec,
// an existing spec to merge into, or (serve only) both.
type specArgs struct {
	output, mergeInto, kind string
}

func (a *specArgs) register(flags *flag.FlagSet) {
	flags.StringVar(&a.output, "output", "", "write a standalone CDI spec to this file")
	flags.StringVar(&a.mergeInto, "merge-into", "", "edit this existing CDI spec in place: add the mounts, drop any /sys/devices mount")
	flags.StringVar(&a.kind, "kind", "", "the standalone spec's kind (default "+cdispec.DefaultKind+")")
}

// check refuses a kind without --output and a bad kind, and defaults it.
func (a *specArgs) check(e *env, cmd string) (int, bool) {
	if a.kind != "" && a.output == "" {
		return usageError(e, cmd, "--kind applies to --output; --merge-into keeps the spec's own kind"), false
	}
	a.kind = cmp.Or(a.kind, cdispec.DefaultKind)
	if err := cdispec.CheckKind(a.kind); err != nil {
		return usageError(e, cmd, "--kind: %v", err), false
	}
	return 0, true
}

func runCDI(e *env, args []string) int {
	flags := newFlags(e, "cdi", "--root DIR (--output FILE [--kind KIND] | --merge-into FILE) [--container-root DIR] [--also-at PATH]... [--fail-open]")
	var a mountArgs
	a.register(flags)
	var sa specArgs
	sa.register(flags)
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if (sa.output == "") == (sa.mergeInto == "") {
		return usageError(e, "cdi", "give --output FILE or --merge-into FILE, one of them")
	}
	if code, ok := sa.check(e, "cdi"); !ok {
		return code
	}
	sv, code, ok := a.resolve(e, "cdi")
	if !ok {
		return code
	}
	if sa.output != "" {
		return writeStandalone(e, sa.output, sa.kind, sv)
	}
	return mergeSpec(e, sa.mergeInto, sv)
}

func writeStandalone(e *env, output, kind string, sv served) int {
	s, wrote, err := cdispec.WriteStandalone(output, kind, sv.mounts, sv.env, sv.rendered)
	if err != nil {
		return fail(e, "cdi: %v", err)
	}
	served := s.Devices[0].ContainerEdits.Mounts
	fmt.Fprintf(e.stdout, "%s %s: cdiVersion %s, device %s=%s, %d mounts\n", verb(wrote), output, s.Version, kind, cdispec.DeviceName, len(served))
	for _, m := range served {
		fmt.Fprintf(e.stdout, "  %s -> %s\n", m.HostPath, m.ContainerPath)
	}
	printEnv(e, sv.env)
	return exitOK
}

// printEnv lists the variables a spec sets for served containers.
func printEnv(e *env, vars []string) {
	for _, v := range vars {
		fmt.Fprintf(e.stdout, "  env %s\n", v)
	}
}

func mergeSpec(e *env, file string, sv served) int {
	s, r, wrote, err := cdispec.MergeInto(file, sv.mounts, sv.env, sv.rendered)
	if err != nil {
		return fail(e, "cdi: --merge-into %s: %v; left as it was", file, err)
	}
	if !wrote {
		fmt.Fprintf(e.stdout, "unchanged %s: kind %s, cdiVersion %s; nothing to change\n", file, s.Kind, s.Version)
		return exitOK
	}
	fmt.Fprintf(e.stdout, "wrote %s: kind %s, cdiVersion %s; removed %d mounts, added %d to the top-level containerEdits\n", file, s.Kind, s.Version, len(r.Removed), len(r.Added))
	for _, m := range r.Removed {
		fmt.Fprintf(e.stdout, "  - %s -> %s\n", m.HostPath, m.ContainerPath)
	}
	for _, m := range r.Added {
		fmt.Fprintf(e.stdout, "  + %s -> %s\n", m.HostPath, m.ContainerPath)
	}
	printEnv(e, r.Env)
	return exitOK
}

func verb(wrote bool) string {
	if wrote {
		return "wrote"
	}
	return "unchanged"
}
