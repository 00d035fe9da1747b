// Command nvml-mock-sysfs renders mock NVIDIA GPUs into a PCI sysfs overlay
// that containers mount at /sys/bus/pci/devices, and checks that the real
// consumers (deviceattribute, go-nvlib, lspci) resolve it.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
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
	// stdin is what the runtime writes a hook (proc-hook's OCI state).
	stdin io.Reader
	// executable names this binary's file, for render to install.
	executable func() (string, error)
	// lookupEnv reads the environment: verify and compat find nvml-mock's
	// profile and shim variables in it.
	lookupEnv func(key string) (string, bool)
	// skipSync renders without the writer's syncfs (writer.Options.SkipSync)
	// for tests that do not test durability, as syncfs on a busy machine
	// takes seconds. main never sets it: the product always syncs.
	skipSync bool
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
		{"slices", "print the ResourceSlices the NVIDIA DRA driver publishes on a node served a profile", runSlices},
		{"publish", "keep published the slices of nodes that run nothing (KWOK's), per the fleet map: the publisher Deployment's entrypoint", runPublish},
		{cdispec.ProcHookCommand, "bind-mount the rendered /proc files in a container: an OCI createContainer hook", runProcHook},
	}
}

func main() {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin, executable: os.Executable, lookupEnv: os.LookupEnv}
	os.Exit(run(e, os.Args[1:]))
}

func run(e *env, args []string) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(e.stdout)
		return exitOK
	case "--version", "-version", "version":
		return printVersion(e)
	case "help":
		// help CMD is CMD -h.
		if len(args) == 1 {
			usage(e.stdout)
			return exitOK
		}
		if len(args) > 2 {
			return usageError(e, "help", "want one command, got %q", strings.Join(args[1:], " "))
		}
		args = []string{args[1], "-h"}
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(e, args[1:])
		}
	}
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs: unknown command %q; run 'nvml-mock-sysfs -h' for the commands\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: nvml-mock-sysfs <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'nvml-mock-sysfs help <command>' or 'nvml-mock-sysfs <command> -h' for a command's flags,\n'nvml-mock-sysfs --version' for the version.\n")
}

// printVersion prints the module version and the VCS revision the binary
// was built from, as the Go tool recorded them.
func printVersion(e *env) int {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fail(e, "version: this binary carries no build information")
	}
	fmt.Fprintln(e.stdout, versionLine(bi))
	return exitOK
}

func versionLine(bi *debug.BuildInfo) string {
	version, revision, modified := bi.Main.Version, "unknown (built without VCS stamping: make build in a git checkout stamps it)", ""
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			revision = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			modified = " (modified)"
		}
	}
	version = cmp.Or(version, "(devel)")
	return fmt.Sprintf("nvml-mock-sysfs %s %s, revision %s%s, %s", bi.Main.Path, version, revision, modified, bi.GoVersion)
}

// newFlags makes a flag set that reports, rather than exits, on bad flags.
// help, when set, follows the flags in -h's output.
func newFlags(e *env, name, synopsis string, help ...string) *flag.FlagSet {
	flags := flag.NewFlagSet(name, flag.ContinueOnError)
	// parse reports a bad flag in one line; the flag package would print
	// its message and then the whole usage.
	flags.SetOutput(io.Discard)
	flags.Usage = func() {
		w := e.stdout
		fmt.Fprintf(w, "Usage: nvml-mock-sysfs %s %s\n\nFlags:\n", name, synopsis)
		printFlags(w, flags)
		for _, h := range help {
			fmt.Fprintf(w, "\n%s", h)
		}
	}
	return flags
}

// printFlags lists the flags as --name, the way the usage lines and
// docs/reference/commands.md spell them (flag.PrintDefaults spells them -name).
func printFlags(w io.Writer, flags *flag.FlagSet) {
	flags.VisitAll(func(f *flag.Flag) {
		typ, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" && def != "[]" {
			text += fmt.Sprintf(" (default %s)", def)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, text)
	})
}

// parse parses the flags of a command that takes no arguments; it returns
// an exit code when the command must stop.
func parse(e *env, flags *flag.FlagSet, args []string) (int, bool) {
	_, code, ok := parseArgs(e, flags, args, false)
	return code, ok
}

// parseArgs parses flags and returns the arguments among them. With
// interleaved, flags may also follow the arguments, as 'import nvidia-smi
// FILE --hierarchy hgx' reads naturally; without, the first argument ends
// the flags and any argument is a usage error. It returns an exit code
// when the command must stop.
func parseArgs(e *env, flags *flag.FlagSet, args []string, interleaved bool) ([]string, int, bool) {
	var rest []string
	for {
		// The flag package calls Usage on every bad flag too; help is
		// printed only when asked for.
		help := flags.Usage
		flags.Usage = func() {}
		err := flags.Parse(args)
		flags.Usage = help
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, exitOK, false
			}
			return nil, usageError(e, flags.Name(), "%s", dashDash(err.Error())), false
		}
		args = flags.Args()
		switch {
		case len(args) == 0:
			return rest, 0, true
		case !interleaved:
			return nil, usageError(e, flags.Name(), "unexpected arguments: %s", strings.Join(args, " ")), false
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// dashDash spells the flag package's -name as --name in its messages
// ("flag provided but not defined: -x").
func dashDash(msg string) string {
	var b strings.Builder
	for i, r := range msg {
		if r == '-' && (i == 0 || msg[i-1] == ' ') && i+1 < len(msg) && msg[i+1] != '-' && msg[i+1] != ' ' {
			b.WriteByte('-')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fail prints one line and returns the failure exit code.
func fail(e *env, format string, args ...any) int {
	msg := fmt.Sprintf(format, args...) + flagHint(args)
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs: %s\n", oneLine(msg))
	return exitFailure
}

// flagHint names the flag behind a library error's remedy: the libraries
// speak of their options, and only the command line knows its flags.
func flagHint(args []any) string {
	for _, a := range args {
		err, ok := a.(error)
		var host *plan.HostDevicesError
		if ok && errors.As(err, &host) {
			return " (drop --host-devices merge)"
		}
	}
	return ""
}

// usageError prints one line, prefixed with the command and ending with
// where to read its usage, and returns the usage exit code.
func usageError(e *env, cmd, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "nvml-mock-sysfs %s: %s; run 'nvml-mock-sysfs %s -h' for usage\n", cmd, oneLine(fmt.Sprintf(format, args...)), cmd)
	return exitUsage
}

// failLoad reports a profile that cannot be loaded: a name that is neither
// a built-in nor a file is a usage error, anything else a failure.
func failLoad(e *env, cmd string, err error) int {
	var unknown *shipped.UnknownError
	if errors.As(err, &unknown) {
		return usageError(e, cmd, "%v", err)
	}
	return fail(e, "%v", err)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
