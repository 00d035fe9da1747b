package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/serve"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// serveHelp says what serve does with the profile and its warnings.
const serveHelp = `serve renders --profile (default the built-in ` + shipped.Default + `) at every sync;
unlike render, it never re-uses the root's own effective profile: the root
follows the flags. Warnings about the profile go to the log, at warn level
when the render changed the tree; --strict makes them a failed render,
which leaves the last good tree served and /readyz failing.

With --fleet, each sync reads the fleet map and renders the profile it
gives --node-name (the node's own entry, else the first label rule whose
labels the node carries, else the default), in place of --profile. A node
the map gives no profile is not ready, and /readyz says why. Label rules
read the Node's labels from the API server, through --kubeconfig or the
pod's service account, which then needs get, list and watch on nodes;
they are read only for a node the map does not name, so serve with a map
without label rules never talks to the API server.

With --fleet-configmap NAMESPACE/NAME too, serve reads the fleet ConfigMap
through the API and keeps its keys as files in --fleet's directory (which
must name DIR/fleet.yaml), so an edit reaches the node in the time an event
takes, not after the kubelet's ConfigMap sync of a mounted volume; the
service account then needs get, list and watch on that ConfigMap. It
removes only the files it wrote, listed in DIR/` + serve.MirrorManifest + `.

With --writable, serve renders the tree at --writable-tree (default
` + serve.DefaultWritableTree + `, in memory on most hosts) and serves it at --root
through FUSE, answering writes to driver_override, sriov_numvfs, a mock
driver's bind and unbind and drivers_probe as the kernel does, before the
write returns; every other write fails. Writes are kept in
--root's .nvml-mock-sysfs/writable.json and survive a restart and a
re-render that keeps the device. The CDI spec adds /sys/bus/pci/drivers,
/sys/bus/pci/drivers_probe and, read-only, the node's own drivers and
devices. It needs root and /dev/fuse; stopping serve unmounts the view, and
containers started on it must restart.

With --nri, serve is also the node's NRI plugin: registered with the
runtime's --nri-socket, it gives each container it serves, as it is
created, the CDI device's very mounts and variables; no device plugin,
annotation or hostPath is needed. --nri-inject says which: node (every
container but --nri-exclude-namespaces'), selected (the pods of
--nri-namespaces whose labels --nri-pod-selector matches) or annotated.
In every mode a pod asks with the annotation
` + nriplugin.CDIContainerAnnotation + `<container> (or ` + nriplugin.CDIPodAnnotation + `)
naming the device, or ` + nriplugin.InjectAnnotation + `: "true", and
opts out with "false" there or with ` + nriplugin.NVMLMockInjectAnnotation + `: "false";
--nri-own-pods are never served. A container that asked is refused while
the tree is not complete (the kubelet retries); any other starts without
it, and /metrics counts it. serve registers again by itself when the
runtime restarts.

With --writable too, a served container gets the writable view only if
its pod asks with ` + nriplugin.WritableAnnotation + `: "true",
names the CDI device by annotation, or is one of --nri-writable-pods
([NAMESPACE:]SELECTOR, repeatable; such a pod is served in every mode,
unless it opts out); every other one gets the read-only tree, the view
mounted read-only, where a write fails with "Read-only file system".
` + nriplugin.WritableAnnotation + `: "false" keeps a pod to it.

A served container that mounts the node's / or /sys elsewhere (the NVIDIA
DRA driver's /host-root, nfd-worker's /host-sys) gets from the NRI plugin
the module view beneath it (<dest>/sys/module, <dest>/module) and the
tree's iommu groups where it has them.

With --proc-hook-binary PATH, serve installs its own executable at PATH
on the node (atomically, only when it differs) before it serves, and the
edits of every channel carry a createContainer hook that runs
"PATH proc-hook --root ROOT --failures FILE" in each served container
(FILE beside PATH; the hook fails open, and serve counts its failures).

`

func runServe(e *env, args []string) int {
	flags := newFlags(e, "serve", "[--profile NAME|FILE | --fleet FILE [--fleet-configmap NAMESPACE/NAME] --node-name NAME [--kubeconfig FILE]] [--root DIR] (--output FILE [--kind KIND] | --merge-into FILE)... [--container-root DIR] [--also-at PATH]... [--hierarchy flat|hgx|dgx] [--host-devices none|merge] [--host-sysfs /sys] [--lock-timeout DURATION] [--no-binary] [--compare-content] [--strict] [--force] [--listen ADDR] [--resync DURATION] [--stop-timeout DURATION] [--no-watch] [--writable [--writable-tree DIR]] [--proc-hook-binary PATH] [--nri [--nri-socket PATH] [--nri-index NN] [--nri-inject node|selected|annotated] [--nri-exclude-namespaces NS,...] [--nri-namespaces NS,...] [--nri-pod-selector SELECTOR] [--nri-own-pods SELECTOR] [--nri-writable-pods [NAMESPACE:]SELECTOR]...] [--log-format text|json] [--log-level debug|info|warn|error]", serveHelp+renderHelp)
	var ra renderArgs
	flags.StringVar(&ra.o.Profile, "profile", shipped.Default, "a built-in profile name or a profile file, rendered at every sync")
	var o serve.Options
	flags.StringVar(&o.Fleet, "fleet", "", "a fleet map: render the profile it gives --node-name, in place of --profile")
	flags.StringVar(&o.FleetConfigMap, "fleet-configmap", "", "keep --fleet's directory holding this ConfigMap's keys, read and watched through the API, NAMESPACE/NAME")
	flags.StringVar(&o.NodeName, "node-name", "", "this node's name, the pod's spec.nodeName (required with --fleet)")
	flags.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig to read the node's labels (the fleet map's label rules) and --fleet-configmap with (default: the pod's service account)")
	ra.register(flags)
	var sa specArgs
	sa.register(flags)
	registerAlsoAt(flags, &o.AlsoAt)
	flags.StringVar(&o.Listen, "listen", endpoints.DefaultListen, "address of "+endpoints.HealthzPath+" and "+endpoints.ReadyzPath)
	flags.DurationVar(&o.Resync, "resync", serve.DefaultResync, "sync this often even without a change event, as a safety net")
	flags.DurationVar(&o.StopTimeout, "stop-timeout", serve.DefaultStopTimeout, "on SIGTERM, wait this long for the render in flight")
	flags.BoolVar(&o.NoWatch, "no-watch", false, "do not watch the profile's and the specs' directories; only resync")
	flags.BoolVar(&o.Writable, "writable", false, "serve --root through FUSE, answering writes to driver_override, bind, unbind, drivers_probe and sriov_numvfs as the kernel does")
	flags.StringVar(&o.WritableTree, "writable-tree", serve.DefaultWritableTree, "with --writable, where to render the tree the view serves")
	flags.StringVar(&o.ProcHookBinary, "proc-hook-binary", "", "install this binary at PATH on the node, and give served containers the createContainer hook that runs it to serve the tree's /proc files")
	var na nriArgs
	na.register(flags)
	var logFormat string
	var logLevel slog.Level
	flags.StringVar(&logFormat, "log-format", "text", "text or json")
	flags.TextVar(&logLevel, "log-level", slog.LevelInfo, "debug (also logs unchanged resyncs), info, warn or error")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	// Explicit, not merely set: --profile and --writable-tree have
	// defaults that the options leave at zero unless given (--fleet
	// replaces the profile), while either given where it does not apply
	// is a contradiction.
	given := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["fleet"] && o.Fleet == "" {
		return usageError(e, "serve", "--fleet: empty; want a fleet map file")
	}
	o.Output, o.Kind, o.MergeInto = sa.output, sa.kind, sa.mergeInto
	if given["profile"] || o.Fleet == "" {
		o.Render.Profile = ra.o.Profile
	}
	if !given["writable-tree"] {
		o.WritableTree = ""
	}
	if err := o.Validate(); err != nil {
		return usageError(e, "serve", "%v", err)
	}
	if given["fleet-configmap"] && o.FleetConfigMap == "" {
		// Empty is no mirror to Options; given, it is a name missing.
		return usageError(e, "serve", "--fleet-configmap \"\": want NAMESPACE/NAME")
	}
	var err error
	if o.NRI, err = na.options(given, o.Writable); err != nil {
		return usageError(e, "serve", "%v", err)
	}
	if code, ok := sa.check(e, "serve"); !ok {
		return code
	}
	if o.Logger, err = newLogger(e, logFormat, logLevel); err != nil {
		return usageError(e, "serve", "%v", err)
	}
	if code, ok := serveRender(e, &ra, &o); !ok {
		return code
	}
	s, err := serve.New(o)
	if err != nil {
		return usageError(e, "serve", "%s", alsoAtError(err))
	}
	// Run would open the listener first thing too; opening it here lets
	// the message name the flag.
	if _, err := s.Listen(); err != nil {
		return fail(e, "serve: --listen %s: %v", o.Listen, err)
	}
	// SIGTERM is how the kubelet stops the pod; SIGINT is a terminal's ^C.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := s.Run(ctx); err != nil {
		return fail(e, "serve: %v", err)
	}
	return exitOK
}

// serveRender fills o.Render from the render flags. A profile name that is
// neither a built-in nor a file is a typo that no resync mends: a usage
// error, as for render. Any other bad profile is the loop's to report,
// and to recover from; so is a bad fleet map, which its ConfigMap's next
// update may mend.
func serveRender(e *env, ra *renderArgs, o *serve.Options) (int, bool) {
	profile := o.Render.Profile
	var code int
	var ok bool
	if o.Render, code, ok = ra.options(e, "serve"); !ok {
		return code, false
	}
	o.Render.Profile = profile
	if o.Fleet == "" {
		if _, _, err := shipped.Load(o.Render.Profile); err != nil {
			var unknown *shipped.UnknownError
			if errors.As(err, &unknown) {
				return usageError(e, "serve", "%v", err), false
			}
		}
	}
	return ra.withBinary(e, "serve", &o.Render)
}

// nriArgs are serve's --nri flags.
type nriArgs struct {
	on                                 bool
	socket, index, inject              string
	exclude, namespaces, pods, ownPods string
	writers                            []string
}

func (a *nriArgs) register(flags *flag.FlagSet) {
	flags.BoolVar(&a.on, "nri", false, "be the node's NRI plugin: serve containers as they are created, with the CDI device's edits")
	flags.StringVar(&a.socket, "nri-socket", nriplugin.DefaultSocket, "the runtime's NRI socket")
	flags.StringVar(&a.index, "nri-index", nriplugin.DefaultIndex, "the plugin's index: NRI calls plugins in its order, and shows each the mounts the ones before it added")
	flags.StringVar(&a.inject, "nri-inject", string(nriplugin.InjectNode), "which containers are served without asking: node, selected or annotated")
	flags.StringVar(&a.exclude, "nri-exclude-namespaces", nriplugin.DefaultExcludeNamespaces, "with --nri-inject node, namespaces not served unless a pod asks (comma-separated; empty for none)")
	flags.StringVar(&a.namespaces, "nri-namespaces", "", "with --nri-inject selected, the namespaces served (comma-separated; empty for any)")
	flags.StringVar(&a.pods, "nri-pod-selector", "", "with --nri-inject selected, a label selector of the pods served, as kubectl -l takes it")
	flags.StringVar(&a.ownPods, "nri-own-pods", nriplugin.DefaultOwnPods, "a label selector of serve's own pods, never served")
	flags.Func("nri-writable-pods", "with --writable, pods given the writable view without asking, [NAMESPACE:]SELECTOR, served in every mode (repeatable)", func(s string) error {
		a.writers = append(a.writers, s)
		return nil
	})
}

// options are the plugin's options, or nil without --nri; an error names
// the flag and its value. writable is --writable.
func (a *nriArgs) options(given map[string]bool, writable bool) (*nriplugin.Options, error) {
	if given["nri-writable-pods"] && !writable {
		return nil, fmt.Errorf("--nri-writable-pods applies to --writable")
	}
	if !a.on {
		for _, f := range []string{"nri-socket", "nri-index", "nri-inject", "nri-exclude-namespaces", "nri-namespaces", "nri-pod-selector", "nri-own-pods", "nri-writable-pods"} {
			if given[f] {
				return nil, fmt.Errorf("--%s applies to --nri", f)
			}
		}
		return nil, nil
	}
	o := &nriplugin.Options{Socket: a.socket, Index: a.index}
	p := &o.Policy
	switch p.Inject = nriplugin.Inject(a.inject); p.Inject {
	case nriplugin.InjectNode, nriplugin.InjectSelected, nriplugin.InjectAnnotated:
	default:
		return nil, fmt.Errorf("--nri-inject %q: want node, selected or annotated", a.inject)
	}
	if p.Inject != nriplugin.InjectNode && given["nri-exclude-namespaces"] {
		return nil, fmt.Errorf("--nri-exclude-namespaces applies to --nri-inject node")
	}
	if p.Inject != nriplugin.InjectSelected && (given["nri-namespaces"] || given["nri-pod-selector"]) {
		return nil, fmt.Errorf("--nri-namespaces and --nri-pod-selector apply to --nri-inject selected")
	}
	p.ExcludeNamespaces = commaList(a.exclude)
	p.Namespaces = commaList(a.namespaces)
	var err error
	if a.pods != "" {
		if p.PodSelector, err = labels.Parse(a.pods); err != nil {
			return nil, fmt.Errorf("--nri-pod-selector %q: %v", a.pods, err)
		}
	}
	if p.Inject == nriplugin.InjectSelected && len(p.Namespaces) == 0 && p.PodSelector == nil {
		return nil, fmt.Errorf("--nri-inject selected: give --nri-namespaces, --nri-pod-selector, or both")
	}
	if p.OwnPods, err = labels.Parse(a.ownPods); err != nil {
		return nil, fmt.Errorf("--nri-own-pods %q: %v", a.ownPods, err)
	}
	if err := (nriplugin.Policy{OwnPods: p.OwnPods}).Check(); err != nil {
		return nil, fmt.Errorf("--nri-own-pods %q: %v", a.ownPods, err)
	}
	for _, s := range a.writers {
		w, err := nriplugin.ParseWriter(s)
		if err != nil {
			return nil, fmt.Errorf("--nri-writable-pods: %v", err)
		}
		p.Writers = append(p.Writers, w)
	}
	return o, nil
}

// commaList splits a comma-separated flag; empty is an empty list, not nil.
func commaList(s string) []string {
	out := []string{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// newLogger is the log of serve and publish: --log-format's handler, at
// --log-level, on stderr.
func newLogger(e *env, format string, level slog.Level) (*slog.Logger, error) {
	ho := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
