package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/apiwatch"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/publisher"
)

const publishHelp = `publish keeps, for every Node --node-selector names (KWOK's fake nodes, say),
the ResourceSlices 'nvml-mock-sysfs slices' prints for it published: the
ones the real drivers publish on a node served the profile the fleet map
gives it (the node's own entry, else the first label rule all of whose
labels it carries, else the default). Such a node runs nothing: no kubelet
plugin, no serve.

The map is the ConfigMap --fleet-configmap names, as the chart writes it:
the map under fleet.yaml, and the profiles it names by file name as keys
beside it (or built-ins). It and the Nodes are read through the API and
watched: a change reaches the slices in about the time an event takes.

The NVIDIA driver's slices are those of the driver 'slices --help' names
(its August 2026 head: numaNode on each GPU with a NUMA node). A profile
that leaves an NVML fact to nvml-mock's A100 defaults is logged at warn
level once, naming the field, the default and the first node given it.
Publishing is the drivers' own ResourceSlice controller, owned by the Node:
deleting the Node withdraws its slices even while publish is down; a node
that leaves the selector, or that the map gives no profile, has them
deleted by publish. A map that is refused leaves the last good one's slices
published, and /readyz failing with the reason. Stopping publish leaves the
slices published.

It touches only simulated nodes and its own slices. A selected Node that
KWOK does not manage (no annotation ` + publisher.KWOKNodeAnnotation + `=` + publisher.KWOKNodeValue + `) is refused,
in one warning line, and gets nothing: a real node's drivers publish its
slices. Every slice publish writes carries the label
` + publisher.OwnLabel + `=` + publisher.OwnValue + `, and it
lists, updates and deletes only the slices that do: another's slice, on any
node, stays as it is.

RBAC: list and watch on nodes, get, list and watch on the ConfigMap, and
list, watch, create, update and delete on resourceslices.resource.k8s.io
(the chart adds an admission policy that keeps its account to slices so
labelled, on KWOK's nodes: docs/user/publisher.md).
`

func runPublish(e *env, args []string) int {
	flags := newFlags(e, "publish", "--node-selector SELECTOR --fleet-configmap NAMESPACE/NAME [--kubeconfig FILE] [--listen ADDR] [--log-format text|json] [--log-level debug|info|warn|error]", publishHelp)
	var selector, fleetConfigMap, logFormat string
	var o publisher.Options
	var logLevel slog.Level
	flags.StringVar(&selector, "node-selector", "", "a label selector of the Nodes to publish for, as kubectl -l takes it, such as type=kwok (required)")
	flags.StringVar(&fleetConfigMap, "fleet-configmap", "", "the fleet map's ConfigMap, NAMESPACE/NAME (required)")
	flags.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: the pod's service account)")
	flags.StringVar(&o.Listen, "listen", endpoints.DefaultListen, "address of "+endpoints.HealthzPath+" and "+endpoints.ReadyzPath)
	flags.StringVar(&logFormat, "log-format", "text", "text or json")
	flags.TextVar(&logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	var err error
	switch o.Nodes, err = labels.Parse(selector); {
	case selector == "":
		return usageError(e, "publish", "give --node-selector SELECTOR, such as type=kwok: the nodes that run no driver")
	case err != nil:
		return usageError(e, "publish", "--node-selector %q: %v", selector, err)
	case o.Nodes.Empty():
		return usageError(e, "publish", "--node-selector %q: selects every node, real ones too", selector)
	}
	if o.Fleet, err = apiwatch.ParseName(fleetConfigMap); err != nil {
		return usageError(e, "publish", "--fleet-configmap %q: %v", fleetConfigMap, err)
	}
	if o.Logger, err = newLogger(e, logFormat, logLevel); err != nil {
		return usageError(e, "publish", "%v", err)
	}
	p, err := publisher.New(o)
	if err != nil {
		return fail(e, "%v", err)
	}
	if _, err := p.Listen(); err != nil {
		return fail(e, "publish: --listen %s: %v", o.Listen, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := p.Run(ctx); err != nil {
		return fail(e, "publish: %v", err)
	}
	return exitOK
}
