package nriplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"k8s.io/apimachinery/pkg/labels"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// Defaults of Options.
const (
	DefaultSocket = api.DefaultSocketPath
	DefaultName   = "nvml-mock-sysfs"
	// DefaultIndex orders the plugin after the device-injector's 10 and
	// other mocks' lower indexes: NRI shows a plugin the mounts the ones
	// before it added, so this one sees another mock's view and does not
	// stack a second one on it.
	DefaultIndex = "90"
	// DefaultRetry is the wait between attempts to reach the runtime's
	// socket while it is away (a containerd restart).
	DefaultRetry = 500 * time.Millisecond
)

// Edits returns the edits to serve now, or why it cannot serve now: the
// tree is not complete (judged by its completion marker, not by a
// directory existing); the edits' mounts are then still those it would
// serve, against which a container's own mounts are judged. serve's
// Server.Edits is the one source.
type Edits func() (specs.ContainerEdits, error)

// Options configure a plugin. Every field but Edits has its zero value as
// the default.
type Options struct {
	Socket string // the runtime's NRI socket (default DefaultSocket)
	Name   string // the plugin's name (default DefaultName)
	Index  string // its index, two digits (default DefaultIndex)
	Policy Policy
	Edits  Edits
	// WritableEdits are the edits of a container the policy gives the
	// writable view (Verdict.Writable): serve --writable's, while Edits
	// are then its read-only tree. Nil: every served container gets Edits.
	WritableEdits Edits
	// Beneath says what a served container that mounts the node's / or
	// /sys elsewhere gets beneath that mount (cdispec.Beneath), read at
	// each creation of such a container, so that it follows a re-profile.
	// Nil: nothing beneath.
	Beneath func() cdispec.Beneath
	// Retry is the wait between attempts to reach the socket (default
	// DefaultRetry).
	Retry  time.Duration
	Logger *slog.Logger
}

// Counts are what the plugin did: counters since serve started, and
// Unserved, the containers it knows run without the tree now.
type Counts struct {
	Registered    bool   // connected to the runtime and synchronized now
	Registrations int    // registrations the runtime synchronized
	Err           string // the last failure to reach the runtime
	Served        int    // containers given the edits
	// ServedWritable are those of Served given the writable view.
	ServedWritable int
	// Unrendered are containers the policy serves that started without the
	// tree because it was not complete; Refused, containers whose creation
	// was refused (an ask while the tree was not complete, bad input).
	Unrendered, Refused int
	// Conflicts are containers that already had another view of
	// /sys/devices or /sys/bus/pci/devices, left as they were.
	Conflicts int
	// Missed are containers the policy serves found, when the plugin
	// (re)registered, without the tree: created while it was away.
	Missed int
	// Unserved are the running containers the policy serves that run
	// without the tree (unrendered or missed), by "namespace/pod/container".
	Unserved []string
}

// Plugin is serve's NRI plugin.
type Plugin struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	counts   Counts
	unserved map[string]string // container ID -> namespace/pod/container
}

// New checks the options and fills in the defaults.
func New(o Options) (*Plugin, error) {
	if o.Edits == nil {
		return nil, errors.New("nri plugin: no source of edits")
	}
	if err := o.Policy.Check(); err != nil {
		return nil, fmt.Errorf("nri plugin policy: %w", err)
	}
	o.Socket = cmp.Or(o.Socket, DefaultSocket)
	o.Name = cmp.Or(o.Name, DefaultName)
	o.Index = cmp.Or(o.Index, DefaultIndex)
	if len(o.Index) != 2 || strings.Trim(o.Index, "0123456789") != "" {
		return nil, fmt.Errorf("nri plugin index %q: want two digits, as NRI orders plugins", o.Index)
	}
	if o.Retry <= 0 {
		o.Retry = DefaultRetry
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	// The policy's defaults, parsed once here rather than at each of the
	// node's creations, which the plugin holds up.
	if o.Policy.OwnPods == nil {
		o.Policy.OwnPods, _ = labels.Parse(DefaultOwnPods)
	}
	if o.Policy.ExcludeNamespaces == nil {
		o.Policy.ExcludeNamespaces = strings.Split(DefaultExcludeNamespaces, ",")
	}
	return &Plugin{opts: o, log: o.Logger, unserved: map[string]string{}}, nil
}

// Counts returns a copy of the counts.
func (p *Plugin) Counts() Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counts
	c.Unserved = slices.Sorted(maps.Values(p.unserved))
	return c
}

// Ready says why the plugin is not registered with the runtime now, or
// nil when it is: serve is not ready while it is not.
func (p *Plugin) Ready() error {
	c := p.Counts()
	if !c.Registered {
		return fmt.Errorf("NRI plugin not registered with %s: %s", p.opts.Socket, cmp.Or(c.Err, "not yet"))
	}
	return nil
}

// Run registers with the runtime and serves its requests until ctx ends.
// When the runtime goes away (a containerd restart) it tries again every
// Retry until it is back, and registers anew: the runtime then sends the
// containers it has, and those created meanwhile without the tree are
// named in the log and counted (Missed).
func (p *Plugin) Run(ctx context.Context) {
	for ctx.Err() == nil {
		closed := make(chan struct{})
		s, err := stub.New(p, stub.WithSocketPath(p.opts.Socket), stub.WithPluginName(p.opts.Name),
			stub.WithPluginIdx(p.opts.Index), stub.WithLogger(nriLogger{p.log}),
			stub.WithOnClose(func() { close(closed) }))
		if err == nil {
			err = s.Start(ctx)
		}
		if err != nil {
			p.failed(err)
			select {
			case <-ctx.Done():
			case <-time.After(p.opts.Retry):
			}
			continue
		}
		select {
		case <-ctx.Done():
			s.Stop()
			p.setUnregistered()
			return
		case <-closed:
			p.setUnregistered()
			p.log.Warn("the runtime closed the NRI connection; registering again when it is back", "socket", p.opts.Socket)
		}
	}
}

// failed records a failure to reach the runtime, logged once per distinct
// error, so a runtime away for minutes says so once.
func (p *Plugin) failed(err error) {
	p.mu.Lock()
	same := p.counts.Err == err.Error()
	p.counts.Err = err.Error()
	p.mu.Unlock()
	if !same {
		p.log.Warn("cannot register with the runtime's NRI socket; trying again", "socket", p.opts.Socket, "err", err, "every", p.opts.Retry.String())
	}
}

func (p *Plugin) setUnregistered() {
	p.mu.Lock()
	p.counts.Registered = false
	p.mu.Unlock()
}

// Synchronize takes the pods and containers the runtime has when the
// plugin registers: those the policy serves that run without our mounts
// were created while the plugin was away (or before the tree was
// complete). They are named once each and counted; a restart serves them.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	defer func() {
		p.mu.Lock()
		p.counts.Registered, p.counts.Err = true, ""
		p.counts.Registrations++
		p.mu.Unlock()
		p.log.Info("registered as the runtime's NRI plugin", "socket", p.opts.Socket, "plugin", p.opts.Index+"-"+p.opts.Name,
			"pods", len(pods), "containers", len(containers))
	}()
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	// Containers removed while the plugin was away run without the tree
	// no more.
	p.mu.Lock()
	for id := range p.unserved {
		if !slices.ContainsFunc(containers, func(c *api.Container) bool { return c.GetId() == id }) {
			delete(p.unserved, id)
		}
	}
	p.mu.Unlock()
	edits, _ := p.opts.Edits()
	for _, ctr := range containers {
		pod := byID[ctr.GetPodSandboxId()]
		if pod == nil || ctr.GetState() == api.ContainerState_CONTAINER_STOPPED {
			continue
		}
		v, err := p.opts.Policy.Decide(pod, ctr)
		if err != nil || !v.Serve || hasOurs(ctr, edits) {
			continue
		}
		p.mu.Lock()
		_, known := p.unserved[ctr.GetId()]
		if !known {
			p.counts.Missed++
			p.unserved[ctr.GetId()] = containerName(pod, ctr)
		}
		p.mu.Unlock()
		if !known {
			p.log.Warn("container runs without the tree: created while the plugin was away or the tree was not complete; restart it to serve it",
				"pod", podName(pod), "container", ctr.GetName(), "why", v.Why)
		}
	}
	return nil, nil
}

// CreateContainer gives a served container the edits. An ask while the
// tree is not complete, or bad input, refuses the container with one line
// (the kubelet retries); a container served node-wide or by selector
// starts without the tree then, since a node's pods must never wait on a
// mock.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	v, err := p.opts.Policy.Decide(pod, ctr)
	if err != nil {
		p.count(func(c *Counts) { c.Refused++ })
		p.log.Error("refused a container: bad annotation", "container", ctr.GetName(), "err", err)
		return nil, nil, fmt.Errorf("nvml-mock-sysfs: %w", err)
	}
	if !v.Serve {
		p.log.Debug("not serving", "pod", podName(pod), "container", ctr.GetName(), "why", v.Why)
		return nil, nil, nil
	}
	source := p.opts.Edits
	if v.Writable && p.opts.WritableEdits != nil {
		source = p.opts.WritableEdits
	}
	edits, err := source()
	if other := otherView(ctr, edits); other != nil {
		p.count(func(c *Counts) { c.Conflicts++ })
		p.log.Warn("container already mounts another view of the PCI sysfs; not stacking ours on it",
			"pod", podName(pod), "container", ctr.GetName(), "destination", other.GetDestination(), "source", other.GetSource(), "type", other.GetType())
		return nil, nil, nil
	}
	if err != nil {
		if v.Asked {
			p.count(func(c *Counts) { c.Refused++ })
			p.log.Warn("refused a container that asked for the tree: it is not complete; the kubelet retries", "pod", podName(pod), "container", ctr.GetName(), "why", v.Why, "err", err)
			return nil, nil, fmt.Errorf("nvml-mock-sysfs: pod %s container %s asked for the mock sysfs (%s), but %v; the kubelet retries", podName(pod), ctr.GetName(), v.Why, err)
		}
		p.mu.Lock()
		p.counts.Unrendered++
		p.unserved[ctr.GetId()] = containerName(pod, ctr)
		p.mu.Unlock()
		p.log.Warn("container starts without the tree: it is not complete", "pod", podName(pod), "container", ctr.GetName(), "why", v.Why, "err", err)
		return nil, nil, nil
	}
	if hasOurDevice(ctr, p.opts.Policy.device()) {
		// The runtime mounts the device's edits itself; a shared mount
		// above them would carry those to the node as well.
		p.log.Debug("the runtime injects our CDI device itself", "pod", podName(pod), "container", ctr.GetName())
		return p.slaved(&api.ContainerAdjustment{}, pod, ctr, edits), nil, nil
	}
	p.count(func(c *Counts) {
		c.Served++
		if v.Writable && p.opts.WritableEdits != nil {
			c.ServedWritable++
		}
	})
	p.log.Debug("serving", "pod", podName(pod), "container", ctr.GetName(), "why", v.Why, "writable", v.Writable && p.opts.WritableEdits != nil)
	edits = p.withBeneath(withoutHeld(edits, ctr), ctr)
	return p.slaved(Adjustment(edits), pod, ctr, edits), nil, nil
}

// slaved adds to adjust the container's shared mounts at or above the
// destinations of edits, re-added rslave (Slaved decides which). NRI lets
// a plugin replace a mount the CRI gave the container: the removal takes
// it out of the request, and the runtime's generator removes the mount at
// a destination before adding one there.
func (p *Plugin) slaved(adjust *api.ContainerAdjustment, pod *api.PodSandbox, ctr *api.Container, edits specs.ContainerEdits) *api.ContainerAdjustment {
	var ours []string
	for _, m := range edits.Mounts {
		ours = append(ours, m.ContainerPath)
	}
	for _, m := range Slaved(ctr.GetMounts(), ours) {
		p.log.Info("re-mounting the container's shared mount as rslave, so that ours beneath it do not reach the node",
			"pod", podName(pod), "container", ctr.GetName(), "destination", m.GetDestination(), "source", m.GetSource())
		adjust.RemoveMount(m.GetDestination())
		adjust.AddMount(m)
	}
	return adjust
}

// withBeneath adds to a served container's edits the mounts beneath its
// binds of the node's / or /sys (cdispec.Beneath.Mounts decides them).
func (p *Plugin) withBeneath(e specs.ContainerEdits, ctr *api.Container) specs.ContainerEdits {
	// Only a bind of the node's / or /sys has anything beneath it
	// (cdispec.Beneath.Mounts): the facts, a read of the tree's and the
	// node's directories, are read for such a container alone, not at
	// each of the node's creations.
	if p.opts.Beneath == nil || !slices.ContainsFunc(ctr.GetMounts(), bindsNodeRootOrSysfs) {
		return e
	}
	var own []cdispec.Mount
	for _, m := range ctr.GetMounts() {
		opts := m.GetOptions()
		// A mount of type bind is a bind, whatever its options say.
		if m.GetType() == "bind" && !slices.Contains(opts, "bind") && !slices.Contains(opts, "rbind") {
			opts = append(slices.Clone(opts), "bind")
		}
		own = append(own, cdispec.Mount{Source: m.GetSource(), Destination: m.GetDestination(), Options: opts})
	}
	var served []string
	for _, m := range e.Mounts {
		served = append(served, m.ContainerPath)
	}
	for _, m := range p.opts.Beneath().Mounts(own, served) {
		e.Mounts = append(e.Mounts, &specs.Mount{HostPath: m.Source, ContainerPath: m.Destination, Options: m.Options})
	}
	return e
}

// bindsNodeRootOrSysfs reports whether a mount's source is the node's /
// or /sys, beneath which alone cdispec.Beneath.Mounts adds anything (it
// decides which of those binds count).
func bindsNodeRootOrSysfs(m *api.Mount) bool {
	src := filepath.Clean(m.GetSource())
	return src == "/" || src == "/sys"
}

// withoutHeld leaves out the mounts the container already has as they are
// (a plugin before this one mounted our overlay where we would, as
// nvml-mock's does configured to share it): NRI refuses two plugins'
// mounts at one destination.
func withoutHeld(e specs.ContainerEdits, ctr *api.Container) specs.ContainerEdits {
	e.Mounts = slices.DeleteFunc(slices.Clone(e.Mounts), func(o *specs.Mount) bool {
		return slices.ContainsFunc(ctr.GetMounts(), func(m *api.Mount) bool {
			return filepath.Clean(m.GetDestination()) == o.ContainerPath && filepath.Clean(m.GetSource()) == o.HostPath
		})
	})
	return e
}

// RemoveContainer forgets a container that ran without the tree.
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.mu.Lock()
	delete(p.unserved, ctr.GetId())
	p.mu.Unlock()
	return nil
}

func (p *Plugin) count(f func(*Counts)) {
	p.mu.Lock()
	f(&p.counts)
	p.mu.Unlock()
}

// Adjustment is the CDI device's edits as an NRI adjustment: the same
// mounts (the runtime orders them by depth, so they land on top of a
// container's own /sys), the same variables and the same OCI hooks (the
// createContainer hook of cdispec.ProcHook). A hook of a name NRI does
// not carry is left out (the CDI library refuses such a spec anyway).
func Adjustment(e specs.ContainerEdits) *api.ContainerAdjustment {
	adjust := &api.ContainerAdjustment{}
	for _, m := range e.Mounts {
		adjust.AddMount(&api.Mount{Destination: m.ContainerPath, Source: m.HostPath, Type: m.Type, Options: slices.Clone(m.Options)})
	}
	for _, v := range e.Env {
		name, value, _ := strings.Cut(v, "=")
		adjust.AddEnv(name, value)
	}
	if len(e.Hooks) > 0 {
		adjust.AddHooks(hooks(e.Hooks))
	}
	return adjust
}

// hooks are CDI hooks as NRI's, by their OCI name.
func hooks(hs []*specs.Hook) *api.Hooks {
	out := &api.Hooks{}
	byName := map[string]*[]*api.Hook{
		cdi.PrestartHook: &out.Prestart, cdi.CreateRuntimeHook: &out.CreateRuntime, cdi.CreateContainerHook: &out.CreateContainer,
		cdi.StartContainerHook: &out.StartContainer, cdi.PoststartHook: &out.Poststart, cdi.PoststopHook: &out.Poststop,
	}
	for _, h := range hs {
		list, ok := byName[h.HookName]
		if !ok {
			continue
		}
		nh := &api.Hook{Path: h.Path, Args: slices.Clone(h.Args), Env: slices.Clone(h.Env)}
		if h.Timeout != nil {
			nh.Timeout = api.Int(*h.Timeout)
		}
		*list = append(*list, nh)
	}
	return out
}

// sysDevices is the whole devices directory an older mock mounted.
const sysDevices = "/sys/devices"

// otherView is a mount the container already has at /sys/devices or at
// one of our destinations under /sys whose source is not the node's
// sysfs: another mock's view, on which ours would be a second one.
func otherView(ctr *api.Container, e specs.ContainerEdits) *api.Mount {
	for _, m := range ctr.GetMounts() {
		dst := filepath.Clean(m.GetDestination())
		ours := slices.ContainsFunc(e.Mounts, func(o *specs.Mount) bool { return o.ContainerPath == dst })
		if dst != sysDevices && !(ours && strings.HasPrefix(dst, "/sys/")) {
			continue
		}
		if hostSysfs(m) || sameSource(m, e) {
			continue
		}
		return m
	}
	return nil
}

// hostSysfs reports whether a mount is the node's own sysfs: a sysfs
// mount, or a bind of a path under the node's /sys.
func hostSysfs(m *api.Mount) bool {
	src := filepath.Clean(m.GetSource())
	return m.GetType() == "sysfs" || src == "/sys" || strings.HasPrefix(src, "/sys/")
}

// sameSource reports whether a mount is one of ours already (a pod that
// mounts our overlay by hostPath, as the docs once told).
func sameSource(m *api.Mount, e specs.ContainerEdits) bool {
	return slices.ContainsFunc(e.Mounts, func(o *specs.Mount) bool { return filepath.Clean(m.GetSource()) == o.HostPath })
}

// hasOurs reports whether a container has one of our mounts, as a served
// one has.
func hasOurs(ctr *api.Container, e specs.ContainerEdits) bool {
	return len(withoutHeld(e, ctr).Mounts) < len(e.Mounts)
}

// hasOurDevice reports whether the container's CRI request names our CDI
// device (a device plugin's allocation): the runtime injects it.
func hasOurDevice(ctr *api.Container, device string) bool {
	return slices.ContainsFunc(ctr.GetCDIDevices(), func(d *api.CDIDevice) bool { return d.GetName() == device })
}

func containerName(pod *api.PodSandbox, ctr *api.Container) string {
	return podName(pod) + "/" + ctr.GetName()
}

// nriLogger passes the stub's log to serve's, at debug for its chatter.
type nriLogger struct{ log *slog.Logger }

func (l nriLogger) Debugf(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, "nri: "+fmt.Sprintf(format, args...))
}
func (l nriLogger) Infof(ctx context.Context, format string, args ...any) {
	l.log.DebugContext(ctx, "nri: "+fmt.Sprintf(format, args...))
}
func (l nriLogger) Warnf(ctx context.Context, format string, args ...any) {
	l.log.WarnContext(ctx, "nri: "+fmt.Sprintf(format, args...))
}
func (l nriLogger) Errorf(ctx context.Context, format string, args ...any) {
	l.log.ErrorContext(ctx, "nri: "+fmt.Sprintf(format, args...))
}
