package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// mountArgs are the flags that cdi and mounts share: both hand out the one
// mount set of cdispec.Mounts, behind the same gate.
type mountArgs struct {
	root, containerRoot string
	alsoAt              []string
	failOpen            bool
}

func (a *mountArgs) register(flags *flag.FlagSet) {
	flags.StringVar(&a.root, "root", overlay.DefaultRoot, "the overlay directory on the host")
	flags.StringVar(&a.containerRoot, "container-root", "", "where containers mount the overlay; must match the render's (default: the one the render recorded, else "+plan.DefaultContainerRoot+")")
	registerAlsoAt(flags, &a.alsoAt)
	flags.BoolVar(&a.failOpen, "fail-open", false, "when the root holds no complete render, leave the sysfs mounts out instead of failing")
}

// served is what cdi and mounts hand out: the mount set, the variables
// (cdispec.Env), and whether the gate let them through.
type served struct {
	mounts   []cdispec.Mount
	env      []string
	rendered bool
}

// resolve returns what to serve. On refusal it returns the exit code to
// stop with.
func (a *mountArgs) resolve(e *env, cmd string) (served, int, bool) {
	if err := writer.CheckRoot(a.root); err != nil {
		return served{}, usageError(e, cmd, "--root: %v", err), false
	}
	rootFS := os.DirFS(a.root)
	containerRoot, err := cdispec.ServedContainerRoot(rootFS, a.root, a.containerRoot)
	if err != nil {
		return served{}, containerRootError(e, cmd, a.containerRoot, err), false
	}
	mounts, err := cdispec.Mounts(a.root, containerRoot, a.alsoAt)
	if err != nil {
		return served{}, usageError(e, cmd, "%s", alsoAtError(err)), false
	}
	if err := cdispec.CheckRendered(rootFS, a.root); err != nil {
		if !a.failOpen {
			return served{}, fail(e, "%s: %v; run render first, or pass --fail-open to leave the sysfs mounts out", cmd, err), false
		}
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: %s: warning: %s; --fail-open: leaving the sysfs mounts out\n", cmd, oneLine(err.Error()))
		return served{mounts: mounts}, 0, true
	}
	return served{mounts: mounts, env: cdispec.Env(rootFS, containerRoot), rendered: true}, 0, true
}

// registerAlsoAt registers --also-at, which cdi, mounts and serve share.
func registerAlsoAt(flags *flag.FlagSet, alsoAt *[]string) {
	flags.Func("also-at", "also mount the links directory here, "+strconv.Itoa(sysfs.LinksDepth)+" levels deep like /host-sys/bus/pci/devices (repeatable)", func(s string) error {
		*alsoAt = append(*alsoAt, s)
		return nil
	})
}

// alsoAtError names --also-at in a refused links target's error.
func alsoAtError(err error) string {
	var t *cdispec.TargetError
	if errors.As(err, &t) {
		return fmt.Sprintf("--also-at %q: %v", t.Target, t.Err)
	}
	return err.Error()
}

// containerRootError reports a --container-root that disagrees with the
// render's (cdispec.ServedContainerRoot), and the two ways out.
func containerRootError(e *env, cmd, flagValue string, err error) int {
	return usageError(e, cmd, "--container-root %v; drop the flag, or render again with --container-root %s", err, flagValue)
}
