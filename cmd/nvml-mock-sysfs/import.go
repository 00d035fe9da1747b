package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/capture"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

const importHelp = `Writes an nvml-mock profile (YAML, on stdout) from a real node's
'nvidia-smi -q -x' output: each GPU's bus id, device and subsystem ids,
class, BAR1 size, link generation and width, and product name. FILE - reads
standard input. Rendering the profile gives back exactly those facts.

nvidia-smi shows neither the root complexes (host bridges) above the GPUs
nor their NUMA nodes, so:
  - with --root-complex, given once per host bridge of the real node (as
    'ls -d /sys/devices/pci*' lists them, optionally =NUMA), each GPU goes
    under the one whose bus range holds it;
  - otherwise --root-complexes infers them:
      per-gpu (default): each GPU bus gets its own host bridge just far
        enough above it for the hierarchy's bridges (3 buses for hgx, as
        pci0000:15 holds the H100 on bus 18; 5 for dgx; 1 for flat). A GPU
        too close to the one before it shares that one's host bridge.
      per-domain: one host bridge pciDDDD:00 per PCI domain.
  - a GPU on bus 00 (a cloud VM, like 00000000:00:1E.0) sits on the root bus
    of pciDDDD:00, and the profile then uses the flat hierarchy.
  - numa_node is --numa-node (default -1: no affinity, as VMs report).
The hierarchy is --hierarchy, else flat when a GPU is on bus 00, else the
board's (hgx for H100/H200, dgx for A100 SXM, flat for PCIe cards).
`

// importArgs are import's flags, before they are checked.
type importArgs struct {
	rcMode, hierarchy string
	explicit          rootComplexFlags
	numaNode          int
}

func (a *importArgs) register(flags *flag.FlagSet) {
	flags.StringVar(&a.rcMode, "root-complexes", string(capture.PerGPU), "how to infer root complexes: per-gpu or per-domain")
	flags.Var(&a.explicit, "root-complex", "a host bridge of the real node, pciDDDD:BB or pciDDDD:BB=NUMA; repeat for each")
	flags.StringVar(&a.hierarchy, "hierarchy", "", "bridges above each GPU: flat, hgx or dgx (default: flat for a GPU on bus 00, else the board's)")
	flags.IntVar(&a.numaNode, "numa-node", -1, "NUMA node of the root complexes; -1 is no affinity")
}

// options checks the flags and returns the importer's options; on refusal
// it returns the exit code to stop with.
func (a *importArgs) options(e *env) (capture.Options, int, bool) {
	opts := capture.DefaultOptions()
	opts.RootComplexes = capture.RootComplexMode(a.rcMode)
	if !slices.Contains(capture.RootComplexModes(), opts.RootComplexes) {
		return opts, usageError(e, "import", "--root-complexes %q: want one of %v", a.rcMode, capture.RootComplexModes()), false
	}
	opts.Explicit = a.explicit
	opts.Hierarchy = boards.Hierarchy(a.hierarchy)
	if a.hierarchy != "" && !opts.Hierarchy.Valid() {
		return opts, usageError(e, "import", "--hierarchy %q: want one of %v", a.hierarchy, boards.Hierarchies()), false
	}
	opts.NUMANode = a.numaNode
	if opts.NUMANode < -1 || opts.NUMANode > 1023 {
		return opts, usageError(e, "import", "--numa-node %d: want -1 or 0..1023", opts.NUMANode), false
	}
	return opts, 0, true
}

func runImport(e *env, args []string) int {
	flags := newFlags(e, "import", "nvidia-smi [--root-complexes per-gpu|per-domain] [--root-complex pciDDDD:BB[=NUMA]]... [--hierarchy flat|hgx|dgx] [--numa-node N] FILE.xml", importHelp)
	var a importArgs
	a.register(flags)
	// The capture's format comes first, before any flag.
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help"):
		flags.Usage()
		return exitOK
	case len(args) == 0:
		return usageError(e, "import", "want the capture's format, nvidia-smi, and a file")
	case args[0] != "nvidia-smi":
		return usageError(e, "import", "%q is not a capture format: want nvidia-smi", args[0])
	}
	files, code, ok := parseArgs(e, flags, args[1:], true)
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageError(e, "import", "want exactly one capture file, got %d", len(files))
	}
	opts, code, ok := a.options(e)
	if !ok {
		return code
	}
	c, code, ok := readCapture(e, files[0])
	if !ok {
		return code
	}
	return writeImported(e, c, opts)
}

// readCapture parses the nvidia-smi capture in file, or standard input
// for -.
func readCapture(e *env, file string) (*capture.Capture, int, bool) {
	in, name := os.Stdin, "(stdin)"
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fail(e, "import: %v", err), false
		}
		defer f.Close()
		in, name = f, file
	}
	c, err := capture.ParseNvidiaSMI(in, name)
	if err != nil {
		return nil, fail(e, "%v", err), false
	}
	return c, 0, true
}

// writeImported writes the profile of a capture to stdout and its notes
// to stderr.
func writeImported(e *env, c *capture.Capture, opts capture.Options) int {
	res, err := c.Profile(opts)
	if err != nil {
		return fail(e, "import: %v", err)
	}
	out, err := profile.Marshal(res.Profile, res.Header)
	if err != nil {
		return fail(e, "import: %v", err)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: import: note: %s\n", n)
	}
	if _, err := e.stdout.Write(out); err != nil {
		return fail(e, "import: %v", err)
	}
	return exitOK
}

// rootComplexFlags collects repeated --root-complex values.
type rootComplexFlags []capture.RootComplexSpec

func (r *rootComplexFlags) String() string {
	var s []string
	for _, x := range *r {
		s = append(s, x.ID.String())
	}
	return strings.Join(s, ",")
}

func (r *rootComplexFlags) Set(v string) error {
	spec, err := capture.ParseRootComplexSpec(v)
	if err != nil {
		return err
	}
	*r = append(*r, spec)
	return nil
}
