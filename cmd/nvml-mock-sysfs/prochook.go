package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/prochook"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// runProcHook is the OCI createContainer hook (deploy/prochook): the
// runtime writes the container's state to its standard input. It fails
// open: a runtime fails the container's creation when a hook exits
// non-zero, and the NRI plugin serves containers that never asked for the
// tree (every pod of the node, by default), so what the hook cannot do
// costs the container the rendered /proc files, never its start. It says
// what failed in one line on stderr, which the runtime shows nowhere once
// the hook exits 0, and appends that line to --failures, which serve
// counts.
func runProcHook(e *env, args []string) int {
	flags := newFlags(e, cdispec.ProcHookCommand, "[--root DIR] [--failures FILE] < OCI-STATE",
		"An OCI createContainer hook: the runtime runs it in the container's mount namespace,\n"+
			"before pivot_root, with the container's state on standard input. It bind-mounts each\n"+
			"entry of <root>/proc read-only over the container's /proc/<entry>, skips one the kernel\n"+
			"lacks, and mounts nothing when the root holds no complete render. It never fails the\n"+
			"container: what it cannot do it says in one line, appended to --failures too, and\n"+
			"exits 0. docs/design/prochook.md.\n")
	var root, failures string
	flags.StringVar(&root, "root", overlay.DefaultRoot, "the overlay directory on the host")
	flags.StringVar(&failures, "failures", "", "a file to append a line to for each container the hook could not serve (serve counts them)")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	// The runtime runs a hook in a directory of its choosing.
	if err := writer.CheckRoot(root); err != nil {
		return usageError(e, cdispec.ProcHookCommand, "--root: %v", err)
	}
	if failures != "" && !filepath.IsAbs(failures) {
		return usageError(e, cdispec.ProcHookCommand, "--failures: %q is not an absolute path", failures)
	}
	res, err := serveProc(e, root)
	if err != nil {
		line := fmt.Sprintf("%s: %v; the container starts with the node's /proc", cdispec.ProcHookCommand, err)
		if res.Container != "" {
			line = fmt.Sprintf("%s: container %s: %v; the container starts with the node's /proc", cdispec.ProcHookCommand, res.Container, err)
		}
		fail(e, "%s", line)
		if failures != "" {
			if err := appendLine(failures, line); err != nil {
				fail(e, "%s: --failures %s: %v", cdispec.ProcHookCommand, failures, err)
			}
		}
		return exitOK
	}
	for _, line := range res.Summary(root) {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs %s: %s\n", cdispec.ProcHookCommand, line)
	}
	return exitOK
}

// serveProc reads the runtime's state and mounts the rendered /proc files.
func serveProc(e *env, root string) (prochook.Result, error) {
	state, err := prochook.ReadState(e.stdin)
	if err != nil {
		return prochook.Result{}, err
	}
	return prochook.Run(root, state, prochook.Options{})
}

// appendLine appends one line to file in one write, so lines of hooks
// running at once never interleave.
func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(oneLine(line) + "\n")
	return errors.Join(err, f.Close())
}
