package main

import (
	"encoding/json"
	"fmt"
	"path"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

// slicesHelp names the driver the NVIDIA slices predict
// (resourceslices.NVIDIAGPUVersion) and the driver versions the plans are
// proven equal to from their recorded runs' directories, the one homes of
// which they are.
func slicesHelp() string {
	runs := resourceslices.RecordedRuns()
	return fmt.Sprintf(slicesHelpText, path.Base(runs[resourceslices.NVIDIAGPUDriver]), path.Base(runs[resourceslices.DRANetDriver]), resourceslices.NVIDIAGPUVersion)
}

const slicesHelpText = `The slices are those two DRA drivers publish on a node served the profile,
proven equal to their real runs on the tree render makes of it, recorded
as %s
and %s
(docs/evidence/resourceslices.md says what differs):

  gpu.nvidia.com  the NVIDIA DRA driver's gpu-kubelet-plugin, as
                  %s
                  publishes them: a device per GPU nvml-mock's NVML lists
                  for the profile, named, with the attributes (numaNode
                  where the GPU has a NUMA node) and memory capacity the
                  driver publishes;
  dra.net         dranet's, on a profile with HCAs: a device per HCA, with
                  its PCI identity, pcieRoot and NUMA node. A node's own
                  NICs and links, which dranet also publishes, are the
                  node's, not the profile's: none here.

A profile that leaves a GPU's name, brand, architecture, compute
capability or memory, or the driver or CUDA version, to nvml-mock's
defaults gets a warning for each such field, naming it and the default
(an A100's), which the slices then carry as if they were the board's.

Each slice has the generateName the driver's gives it: create them
(kubectl create -f), the API server completes the name.

With --fleet, the profile is the one the map gives --node-name (its own
entry, else the first label rule all of whose labels --node-labels gives,
else the default).
`

func runSlices(e *env, args []string) int {
	flags := newFlags(e, "slices", "(--profile NAME|FILE | --fleet FILE [--node-labels KEY=VALUE,...]) --node-name NAME [--format yaml|json]", slicesHelp())
	var profileArg, fleetFile, nodeName, nodeLabels, format string
	flags.StringVar(&profileArg, "profile", "", "a built-in profile name or a profile file")
	flags.StringVar(&fleetFile, "fleet", "", "a fleet map: the profile it gives --node-name, in place of --profile")
	flags.StringVar(&nodeName, "node-name", "", "the node the slices are published on (required)")
	flags.StringVar(&nodeLabels, "node-labels", "", "the node's labels, for the fleet map's label rules")
	flags.StringVar(&format, "format", "yaml", "yaml or json")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	switch {
	case format != "yaml" && format != "json":
		return usageError(e, "slices", "--format %q: want yaml or json", format)
	case profileArg != "" && fleetFile != "":
		return usageError(e, "slices", "--fleet and --profile: give one; the fleet map chooses the node's profile")
	case profileArg == "" && fleetFile == "":
		return usageError(e, "slices", "give --profile NAME|FILE or --fleet FILE")
	case nodeName == "":
		return usageError(e, "slices", "give --node-name NAME, the node the slices are published on")
	case fleetFile == "" && nodeLabels != "":
		return usageError(e, "slices", "--node-labels applies to --fleet")
	}
	labelSet, err := labels.ConvertSelectorToLabelsMap(nodeLabels)
	if err != nil {
		return usageError(e, "slices", "--node-labels %q: %v", nodeLabels, err)
	}
	if fleetFile != "" {
		m, err := fleet.Load(fleetFile)
		if err != nil {
			return fail(e, "%v", err)
		}
		choice, err := m.Resolve(nodeName, labelSet)
		if err != nil {
			return fail(e, "%v", err)
		}
		profileArg = choice.Profile
	}
	source, data, err := resourceslices.ReadProfile(profileArg)
	if err != nil {
		return failLoad(e, "slices", err)
	}
	p, err := resourceslices.Parse(source, data)
	if err != nil {
		return fail(e, "%v", err)
	}
	items, err := resourceslices.Planner{}.ForNode(p, nodeName)
	if err != nil {
		return fail(e, "%v", err)
	}
	for _, w := range p.MockDefaults() {
		fmt.Fprintf(e.stderr, "nvml-mock-sysfs: slices: warning: %s\n", w)
	}
	list := resourcev1.ResourceSliceList{
		TypeMeta: metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "ResourceSliceList"},
		Items:    items,
	}
	if list.Items == nil {
		list.Items = []resourcev1.ResourceSlice{}
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err == nil && format == "yaml" {
		out, err = yaml.JSONToYAML(out)
	} else {
		out = append(out, '\n')
	}
	if err != nil {
		return fail(e, "slices: %v", err)
	}
	if _, err := e.stdout.Write(out); err != nil {
		return fail(e, "slices: %v", err)
	}
	return exitOK
}
