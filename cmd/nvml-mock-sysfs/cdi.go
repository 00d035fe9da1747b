package main

import (
	"fmt"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
)

func runCDI(e *env, args []string) int {
	fs := newFlags(e, "cdi", "--root DIR (--output FILE [--kind KIND] | --merge-into FILE) [--container-root DIR] [--also-at PATH]... [--fail-open]")
	var a mountArgs
	a.register(fs)
	var output, mergeInto, kind string
	fs.StringVar(&output, "output", "", "write a standalone CDI spec to this file")
	fs.StringVar(&mergeInto, "merge-into", "", "edit this existing CDI spec in place: add the mounts, drop any /sys/devices mount")
	fs.StringVar(&kind, "kind", "", "the standalone spec's kind (default "+deploy.DefaultKind+")")
	if code, ok := parse(e, fs, args); !ok {
		return code
	}
	switch {
	case (output == "") == (mergeInto == ""):
		return usageError(e, "cdi", "give --output FILE or --merge-into FILE, one of them")
	case mergeInto != "" && kind != "":
		return usageError(e, "cdi", "--kind applies to --output; --merge-into keeps the spec's own kind")
	}
	if kind == "" {
		kind = deploy.DefaultKind
	}
	if output != "" {
		if err := deploy.CheckKind(kind); err != nil {
			return usageError(e, "cdi", "--kind: %v", err)
		}
	}
	mounts, rendered, code, ok := a.resolve(e, "cdi")
	if !ok {
		return code
	}
	if output != "" {
		return writeStandalone(e, output, kind, mounts, rendered)
	}
	return mergeSpec(e, mergeInto, mounts, rendered)
}

func writeStandalone(e *env, output, kind string, mounts []deploy.Mount, rendered bool) int {
	served := mounts
	if !rendered {
		served = nil
	}
	s, err := deploy.NewSpec(kind, served)
	if err != nil {
		return fail(e, "cdi: %v", err)
	}
	wrote, err := deploy.WriteSpec(output, s)
	if err != nil {
		return fail(e, "cdi: %v", err)
	}
	fmt.Fprintf(e.stdout, "%s %s: cdiVersion %s, device %s=%s, %d mounts\n", verb(wrote), output, s.Version, kind, deploy.DeviceName, len(served))
	printMounts(e, served)
	return exitOK
}

func mergeSpec(e *env, file string, mounts []deploy.Mount, rendered bool) int {
	s, err := deploy.ReadSpec(file)
	if err != nil {
		return fail(e, "cdi: --merge-into %s: %v; left as it was", file, err)
	}
	r := deploy.Merge(s, mounts, rendered)
	wrote, err := deploy.WriteSpec(file, s)
	if err != nil {
		return fail(e, "cdi: --merge-into: %v; left as it was", err)
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
	return exitOK
}

func verb(wrote bool) string {
	if wrote {
		return "wrote"
	}
	return "unchanged"
}

func printMounts(e *env, mounts []deploy.Mount) {
	for _, m := range mounts {
		fmt.Fprintf(e.stdout, "  %s -> %s\n", m.Source, m.Destination)
	}
}
