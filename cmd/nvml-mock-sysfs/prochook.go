package main

import (
	"fmt"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/prochook"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// runProcHook is the OCI createContainer hook (deploy/prochook): the
// runtime writes the container's state to its standard input.
func runProcHook(e *env, args []string) int {
	flags := newFlags(e, cdispec.ProcHookCommand, "[--root DIR] < OCI-STATE",
		"An OCI createContainer hook: the runtime runs it in the container's mount namespace,\n"+
			"before pivot_root, with the container's state on standard input. It bind-mounts each\n"+
			"entry of <root>/proc read-only over the container's /proc/<entry>, skips one the kernel\n"+
			"lacks, and mounts nothing when the root holds no complete render. docs/design/prochook.md.\n")
	var root string
	flags.StringVar(&root, "root", overlay.DefaultRoot, "the overlay directory on the host")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	// The runtime runs a hook in a directory of its choosing.
	if err := writer.CheckRoot(root); err != nil {
		return usageError(e, cdispec.ProcHookCommand, "--root: %v", err)
	}
	state, err := prochook.ReadState(e.stdin)
	if err != nil {
		return fail(e, "%s: %v", cdispec.ProcHookCommand, err)
	}
	res, err := prochook.Run(root, state, prochook.Options{})
	switch {
	case err != nil && res.Container == "":
		return fail(e, "%s: %v", cdispec.ProcHookCommand, err)
	case err != nil:
		return fail(e, "%s: container %s: %v", cdispec.ProcHookCommand, res.Container, err)
	}
	for _, line := range res.Summary(root) {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs %s: %s\n", cdispec.ProcHookCommand, line)
	}
	return exitOK
}
