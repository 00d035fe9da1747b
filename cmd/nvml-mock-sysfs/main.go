// Command nvml-mock-sysfs renders mock NVIDIA GPUs into a PCI sysfs overlay
// that containers mount at /sys/bus/pci/devices, and checks that the real
// consumers (deviceattribute, go-nvlib, lspci) resolve it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// env is what a command may touch of the process.
type env struct {
	stdout, stderr io.Writer
	// executable names this binary's file, for render to install.
	executable func() (string, error)
	// lookupEnv reads the environment: verify and compat find nvml-mock's
	// profile and shim variables in it.
	lookupEnv func(key string) (string, bool)
}

type command struct {
	name    string
	summary string
	run     func(e *env, args []string) int
}

func commands() []command {
	return []command{
		{"render", "render a profile into the overlay", runRender},
		{"compat", "run the real consumer libraries against a rendered tree", runCompat},
		{"profiles", "list the built-in profiles, or print one", runProfiles},
		{"serve", "render and write the CDI spec, and keep both current: the DaemonSet's entrypoint", runServe},
		{"cdi", "write a CDI spec that mounts the overlay, or merge its mounts into one", runCDI},
		{"mounts", "print the overlay's mounts, for an NRI plugin", runMounts},
		{"verify", "check, from inside a container, that the mock sysfs is served right", runVerify},
		{"import", "write a profile from a real node's nvidia-smi -q -x output", runImport},
		{"fidelity", "compare rendered GPU directories with what real nodes show", runFidelity},
	}
}

func main() {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, executable: os.Executable, lookupEnv: os.LookupEnv}
	os.Exit(run(e, os.Args[1:]))
}

func run(e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(e, args[1:])
		}
	}
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: nvml-mock-sysfs <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'nvml-mock-sysfs <command> -h' for a command's flags.\n")
}

// newFlags makes a flag set that reports, rather than exits, on bad flags.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: nvml-mock-sysfs %s %s\n\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags; it returns an exit code when the command must stop.
func parse(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "nvml-mock-sysfs %s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		return exitUsage, false
	}
	return 0, true
}

// fail prints one line and returns the failure exit code.
func fail(e *env, format string, args ...any) int {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs: %s\n", strings.Join(strings.Fields(msg), " "))
	return exitFailure
}

// usageError prints one line and returns the usage exit code.
func usageError(e *env, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs: %s\n", fmt.Sprintf(format, args...))
	return exitUsage
}
