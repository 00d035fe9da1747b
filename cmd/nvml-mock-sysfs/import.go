package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/importer"
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

func runImport(e *env, args []string) int {
	fs := newFlags(e, "import", "nvidia-smi [--root-complexes per-gpu|per-domain] [--root-complex pciDDDD:BB[=NUMA]]... [--hierarchy flat|hgx|dgx] [--numa-node N] FILE.xml", importHelp)
	var rcMode, hierarchy string
	var explicit rootComplexFlags
	opts := importer.DefaultOptions()
	fs.StringVar(&rcMode, "root-complexes", string(importer.PerGPU), "how to infer root complexes: per-gpu or per-domain")
	fs.Var(&explicit, "root-complex", "a host bridge of the real node, pciDDDD:BB or pciDDDD:BB=NUMA; repeat for each")
	fs.StringVar(&hierarchy, "hierarchy", "", "bridges above each GPU: flat, hgx or dgx (default: flat for a GPU on bus 00, else the board's)")
	fs.IntVar(&opts.NUMANode, "numa-node", -1, "NUMA node of the root complexes; -1 is no affinity")
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help"):
		fs.Usage()
		return exitOK
	case len(args) == 0:
		return usageError(e, "import", "want the capture's format, nvidia-smi, and a file")
	case args[0] != "nvidia-smi":
		return usageError(e, "import", "%q is not a capture format: want nvidia-smi", args[0])
	}
	files, code, ok := parseInterleaved(e, fs, args[1:])
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageError(e, "import", "want exactly one capture file, got %d", len(files))
	}
	opts.RootComplexes = importer.RootComplexMode(rcMode)
	if !slices.Contains(importer.RootComplexModes(), opts.RootComplexes) {
		return usageError(e, "import", "--root-complexes %q: want one of %v", rcMode, importer.RootComplexModes())
	}
	opts.Explicit = explicit
	opts.Hierarchy = boards.Hierarchy(hierarchy)
	if hierarchy != "" && !opts.Hierarchy.Valid() {
		return usageError(e, "import", "--hierarchy %q: want one of %v", hierarchy, boards.Hierarchies())
	}
	if opts.NUMANode < -1 || opts.NUMANode > 1023 {
		return usageError(e, "import", "--numa-node %d: want -1 or 0..1023", opts.NUMANode)
	}
	in, name := os.Stdin, "(stdin)"
	if files[0] != "-" {
		f, err := os.Open(files[0])
		if err != nil {
			return fail(e, "import: %v", err)
		}
		defer f.Close()
		in, name = f, files[0]
	}
	c, err := importer.ParseNvidiaSMI(in, name)
	if err != nil {
		return fail(e, "%v", err)
	}
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

// parseInterleaved parses flags that may come before or after the file
// names, as 'import nvidia-smi FILE --hierarchy hgx' reads naturally.
func parseInterleaved(e *env, fs *flag.FlagSet, args []string) ([]string, int, bool) {
	var rest []string
	for {
		if code, ok := parseFlagsOnly(e, fs, args); !ok {
			return nil, code, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, 0, true
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// rootComplexFlags collects repeated --root-complex values.
type rootComplexFlags []importer.RootComplexSpec

func (r *rootComplexFlags) String() string {
	var s []string
	for _, x := range *r {
		s = append(s, x.ID.String())
	}
	return strings.Join(s, ",")
}

func (r *rootComplexFlags) Set(v string) error {
	spec, err := importer.ParseRootComplexSpec(v)
	if err != nil {
		return err
	}
	*r = append(*r, spec)
	return nil
}
