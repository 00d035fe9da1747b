// Package publisher keeps published, for every Node a label selector
// names (KWOK's fake nodes, which run nothing), the ResourceSlices the
// drivers publish on a node served the profile the fleet map gives it:
// resourceslices.ForNode's, the one home of what they hold.
//
// The map is read through the API, from the chart's fleet ConfigMap (the
// map under fleet.ConfigMapKey, the profiles it names by file name beside
// it), and the Nodes too, each by a client-go informer: an edit of the map
// or a node's labels reaches the slices in the time an event takes, not a
// kubelet's ConfigMap sync.
//
// Publishing is the real drivers' own code: for each node and driver, the
// ResourceSlice controller of k8s.io/dynamic-resource-allocation that a
// kubelet plugin runs (kubeletplugin.Helper.PublishResources), owned by the
// Node. So the slices' names, their owner reference (the Node: deleting it
// withdraws them through the garbage collector even while the publisher is
// down), the update in place and the pool generation (bumped only when a
// change takes more than one write, as the controller decides) are the
// driver's. The publisher adds what a kubelet would do: a node that leaves
// the selector, or is deleted, has its slices deleted.
//
// It touches only simulated nodes and its own slices. A selected Node that
// is not KWOK's (KWOK's annotation, KWOKNodeAnnotation) is refused, in one
// log line, whatever the selector says: a real node's kubelet plugins
// publish its slices, in the same pool. Every slice it writes carries its
// mark (OwnLabel), and it lists, updates and deletes only slices that do
// (ownClient, for the controllers too): another's slice, of a real driver
// on a real node or of anyone on a fake one, stays as it is.
package publisher

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/apiwatch"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/kubeclient"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

// Options configure a Publisher. Nodes and Fleet are required.
type Options struct {
	// Client reaches the API server; nil is Kubeconfig's, with rate
	// limits for a fleet (kubeclient.Fleet).
	Client kubernetes.Interface
	// Kubeconfig is the API server's kubeconfig when Client is nil
	// (default: the pod's service account).
	Kubeconfig string
	// Nodes selects the Nodes to publish for, such as type=kwok. Never
	// labels.Everything() by mistake: real nodes run their drivers.
	Nodes labels.Selector
	// Fleet is the fleet ConfigMap's namespace and name.
	Fleet types.NamespacedName
	// Listen is the address of /healthz and /readyz (default
	// endpoints.DefaultListen, serve's too); "127.0.0.1:0" picks a free
	// port.
	Listen string
	// Logger receives the structured log (default slog.Default()).
	Logger *slog.Logger
}

// Publisher keeps the slices published; Run runs it.
type Publisher struct {
	o   Options
	log *slog.Logger
	// endpoints is the listener of /healthz and /readyz.
	endpoints endpoints.Listener
	// kick wakes the planner; dirty and all say what to plan again.
	kick chan struct{}

	nodeInformer, fleetInformer cache.SharedIndexInformer

	mu     sync.Mutex
	synced bool
	dirty  map[string]bool
	all    bool
	// fleetMap and fleetData are the last map that parsed, and its
	// ConfigMap's data; fleetErr why the current ConfigMap is not used.
	fleetMap  *fleet.Map
	fleetData map[string]string
	fleetErr  error
	nodes     map[string]*nodeRecord
	// leaving are the publishers of nodes withdrawn, until their slices
	// are deleted: a node's next publisher waits for its last one.
	leaving map[string]*nodePublisher
	// warned are the profiles (by source and digest) whose NVML facts
	// left to nvml-mock's defaults were logged: once a profile, not once
	// a node and a plan, which a fleet of KWOK nodes would repeat by the
	// thousand.
	warned map[string]bool
	actors sync.WaitGroup
}

// nodeRecord is what the publisher last made of a selected node.
type nodeRecord struct {
	uid types.UID
	// published is what was last handed to the node's publisher; nil when
	// nothing was.
	published map[string]*resourceslice.DriverResources
	// why the node's slices are not its profile's (they stay as they were);
	// note what the log last said of it, so it says a thing once.
	err  error
	note string
	node *nodePublisher
}

// New checks the options and makes a publisher; Run starts it.
func New(o Options) (*Publisher, error) {
	switch {
	case o.Nodes == nil || o.Nodes.Empty():
		return nil, errors.New("publisher: no node selector: every node would carry slices, real ones too")
	case o.Fleet.Namespace == "" || o.Fleet.Name == "":
		return nil, fmt.Errorf("publisher: fleet ConfigMap %q: want a namespace and a name", o.Fleet.String())
	}
	if o.Client == nil {
		var err error
		if o.Client, err = kubeclient.Fleet(o.Kubeconfig); err != nil {
			// As publish said it when it made the client itself.
			return nil, fmt.Errorf("publish: %w", err)
		}
	}
	if o.Listen == "" {
		o.Listen = endpoints.DefaultListen
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	p := &Publisher{o: o, log: o.Logger, endpoints: endpoints.Listener{Addr: o.Listen}, kick: make(chan struct{}, 1), dirty: map[string]bool{}, nodes: map[string]*nodeRecord{}, leaving: map[string]*nodePublisher{}, warned: map[string]bool{}}
	p.nodeInformer = apiwatch.Informer(o.Client, o.Client.CoreV1().Nodes(), &corev1.Node{}, func(lo *metav1.ListOptions) {
		lo.LabelSelector = o.Nodes.String()
	})
	p.fleetInformer = apiwatch.ConfigMap(o.Client, o.Fleet)
	nodeChanged := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if n, ok := obj.(*corev1.Node); ok {
			p.mark(n.Name, false)
		}
	}
	fleetChanged := func(any) { p.mark("", true) }
	if _, err := p.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: nodeChanged, UpdateFunc: func(_, n any) { nodeChanged(n) }, DeleteFunc: nodeChanged,
	}); err != nil {
		return nil, err
	}
	if _, err := p.fleetInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: fleetChanged, UpdateFunc: func(_, n any) { fleetChanged(n) }, DeleteFunc: fleetChanged,
	}); err != nil {
		return nil, err
	}
	return p, nil
}

// mark asks the planner to plan node (all: every node and the map) again.
func (p *Publisher) mark(node string, all bool) {
	p.mu.Lock()
	if all {
		p.all = true
	} else {
		p.dirty[node] = true
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Listen opens the health endpoints' listener, which Run serves; Run opens
// it itself when not called.
func (p *Publisher) Listen() (net.Addr, error) { return p.endpoints.Listen() }

// Run publishes until ctx ends. The slices stay published when it returns:
// a restart or an upgrade must not take them from the scheduler.
func (p *Publisher) Run(ctx context.Context) error {
	hs, addr, err := p.endpoints.Serve(p.Handler(), p.log)
	if err != nil {
		return err
	}
	defer hs.Close()
	p.log.Info("publishing", "nodes", p.o.Nodes.String(), "fleet_configmap", p.o.Fleet.String(), "addr", addr.String())
	go p.nodeInformer.RunWithContext(ctx)
	go p.fleetInformer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), p.nodeInformer.HasSynced, p.fleetInformer.HasSynced) {
		return nil
	}
	p.mu.Lock()
	p.synced = true
	p.mu.Unlock()
	p.mark("", true)
	for {
		select {
		case <-ctx.Done():
			p.actors.Wait()
			p.log.Info("stopped; the slices stay published")
			return nil
		case <-p.kick:
			p.plan(ctx)
		}
	}
}

// plan plans again what was marked: the map and every node, or the nodes
// that changed.
func (p *Publisher) plan(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, n := range p.leaving {
		select {
		case <-n.done:
			delete(p.leaving, name)
		default:
		}
	}
	names := slices.Collect(maps.Keys(p.dirty))
	clear(p.dirty)
	if p.all {
		p.all = false
		p.readFleet()
		names = append(p.nodeInformer.GetStore().ListKeys(), slices.Collect(maps.Keys(p.nodes))...)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		p.planNode(ctx, name)
	}
}

// fleetFile names the map in refusals and anchors the profiles it names
// by file name: the ConfigMap's path in the API, as no file system has it.
func (p *Publisher) fleetFile() string {
	return fmt.Sprintf("/namespaces/%s/configmaps/%s/%s", p.o.Fleet.Namespace, p.o.Fleet.Name, fleet.ConfigMapKey)
}

// readFleet reads the map from the ConfigMap. A map that is missing or
// refused leaves the last good one in use, as serve keeps the last good
// tree: the refusal is logged once and /readyz fails with it.
func (p *Publisher) readFleet() {
	err := func() error {
		obj, ok, err := p.fleetInformer.GetStore().GetByKey(p.o.Fleet.String())
		if err != nil {
			return err
		}
		cm, _ := obj.(*corev1.ConfigMap)
		if !ok || cm == nil {
			return fmt.Errorf("ConfigMap %s: not found", p.o.Fleet)
		}
		text, ok := cm.Data[fleet.ConfigMapKey]
		if !ok {
			return fmt.Errorf("ConfigMap %s: no key %s, the fleet map", p.o.Fleet, fleet.ConfigMapKey)
		}
		m, err := fleet.Parse(p.fleetFile(), []byte(text))
		if err != nil {
			return err
		}
		p.fleetMap, p.fleetData = m, maps.Clone(cm.Data)
		p.log.Info("fleet map", "configmap", p.o.Fleet.String(), "nodes", len(m.Nodes), "labels", len(m.Labels), "default", m.Default)
		return nil
	}()
	if err != nil && (p.fleetErr == nil || p.fleetErr.Error() != err.Error()) {
		kept := "nothing is published until it parses"
		if p.fleetMap != nil {
			kept = "the last good map's slices stay published"
		}
		p.log.Error("fleet map refused; "+kept, "err", err)
	}
	p.fleetErr = err
}

// planNode makes node's slices the ones its profile gives, or withdraws
// them when the node is gone, no longer selected, or given no profile.
func (p *Publisher) planNode(ctx context.Context, name string) {
	rec := p.nodes[name]
	obj, exists, _ := p.nodeInformer.GetStore().GetByKey(name)
	node, _ := obj.(*corev1.Node)
	if !exists || node == nil || !p.o.Nodes.Matches(labels.Set(node.Labels)) {
		if rec != nil {
			why := "deleted"
			if exists {
				why = "no longer selected"
			}
			p.withdraw(name, rec, why)
			delete(p.nodes, name)
		}
		return
	}
	if rec == nil {
		rec = &nodeRecord{}
		p.nodes[name] = rec
	}
	if !isKWOKNode(node) {
		p.unpublished(name, rec, slog.LevelWarn, "refused: not a KWOK node, whatever the selector says",
			fmt.Sprintf("no annotation %s=%s: a real node's own drivers publish its slices", KWOKNodeAnnotation, KWOKNodeValue))
		return
	}
	if p.fleetMap == nil {
		return
	}
	choice, err := p.fleetMap.Resolve(name, node.Labels)
	var none *fleet.NoMatchError
	if errors.As(err, &none) {
		p.unpublished(name, rec, slog.LevelInfo, "not published: the fleet map gives the node no profile", err.Error())
		return
	}
	var want map[string]*resourceslice.DriverResources
	if err == nil {
		want, err = p.driverResources(choice, name)
	}
	if err != nil {
		if rec.err == nil || rec.err.Error() != err.Error() {
			p.log.Error("node's slices refused; its last slices stay published", "node", name, "err", err)
		}
		rec.err = err
		return
	}
	rec.err = nil
	if rec.node != nil && rec.uid == node.UID && apiequality.Semantic.DeepEqual(rec.published, want) {
		return
	}
	if rec.node == nil {
		rec.node = p.startNode(ctx, name)
	}
	rec.uid, rec.published = node.UID, want
	rec.node.post(node.UID, want)
	devices := 0
	for _, d := range want {
		for _, pool := range d.Pools {
			for _, s := range pool.Slices {
				devices += len(s.Devices)
			}
		}
	}
	rec.note = ""
	p.log.Info("published", "node", name, "profile", choice.Profile, "rule", choice.Rule, "drivers", slices.Sorted(maps.Keys(want)), "devices", devices)
}

// unpublished withdraws a selected node's slices, if it has any, or else
// says once, at level, that it has none and why.
func (p *Publisher) unpublished(name string, rec *nodeRecord, level slog.Level, msg, why string) {
	if rec.node != nil {
		p.withdraw(name, rec, why)
		p.nodes[name] = &nodeRecord{note: why}
		return
	}
	rec.err = nil
	if rec.note != why {
		p.log.Log(context.Background(), level, msg, "node", name, "why", why)
		rec.note = why
	}
}

// withdraw deletes a node's slices, saying why.
func (p *Publisher) withdraw(name string, rec *nodeRecord, why string) {
	if rec.node == nil {
		return
	}
	rec.node.post(rec.uid, nil)
	p.leaving[name] = rec.node
	p.log.Info("withdrawn", "node", name, "why", why)
}

// driverResources are the slices resourceslices.ForNode gives node for
// choice's profile, as the ResourceSlice controller takes them: by driver,
// then pool, in ForNode's order (a slice's index is its name's prefix).
// The generation is left to the controller, as the drivers leave it.
func (p *Publisher) driverResources(choice fleet.Choice, node string) (map[string]*resourceslice.DriverResources, error) {
	source, data, err := p.profile(choice)
	if err != nil {
		return nil, err
	}
	prof, err := resourceslices.Parse(source, data)
	if err != nil {
		return nil, err
	}
	if key := fmt.Sprintf("%s\x00%x", source, sha256.Sum256(data)); !p.warned[key] {
		p.warned[key] = true
		for _, w := range prof.MockDefaults() {
			p.log.Warn("the slices carry nvml-mock's A100 defaults as the board's", "node", node, "warning", w)
		}
	}
	planned, err := resourceslices.Planner{}.ForNode(prof, node)
	if err != nil {
		return nil, err
	}
	out := map[string]*resourceslice.DriverResources{}
	for _, s := range planned {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			return nil, fmt.Errorf("profile %s: driver %s: a slice not of node %s, which the publisher does not publish", source, s.Spec.Driver, node)
		}
		d := out[s.Spec.Driver]
		if d == nil {
			d = &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
			out[s.Spec.Driver] = d
		}
		pool := d.Pools[s.Spec.Pool.Name]
		pool.Slices = append(pool.Slices, sliceOf(s))
		d.Pools[s.Spec.Pool.Name] = pool
	}
	return out, nil
}

// sliceOf is the controller's form of a planned slice: its spec's
// per-slice fields.
func sliceOf(s resourcev1.ResourceSlice) resourceslice.Slice {
	return resourceslice.Slice{
		Devices:                s.Spec.Devices,
		SharedCounters:         s.Spec.SharedCounters,
		PerDeviceNodeSelection: s.Spec.PerDeviceNodeSelection,
	}
}

// profile reads choice's profile: a built-in, or a key of the fleet
// ConfigMap beside the map. A file elsewhere (an nvml-mock release's
// ConfigMap mounted into serve's pods) is nothing the publisher can read.
func (p *Publisher) profile(choice fleet.Choice) (source string, data []byte, err error) {
	if choice.Builtin {
		return resourceslices.ReadProfile(choice.Profile)
	}
	key, ok := p.fleetMap.Beside(choice)
	if !ok {
		return "", nil, fmt.Errorf("fleet map %s: %s: %s is no key of ConfigMap %s: the publisher reads profiles through the API, a built-in or a key beside %s", p.fleetMap.File, choice.Rule, choice.Profile, p.o.Fleet, fleet.ConfigMapKey)
	}
	text, ok := p.fleetData[key]
	if !ok {
		return "", nil, fmt.Errorf("fleet map %s: %s: ConfigMap %s has no key %s", p.fleetMap.File, choice.Rule, p.o.Fleet, key)
	}
	return choice.Profile, []byte(text), nil
}

// Ready says why the slices are not what the map gives, or nil when they
// are: the informers synced, the ConfigMap's map is the one in use, every
// selected node's profile gave its slices, and no node's publishing failed
// in the last minute (recentFailure).
func (p *Publisher) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.synced:
		return errors.New("the Nodes and the fleet ConfigMap are not listed yet")
	case p.fleetErr != nil:
		return p.fleetErr
	}
	now := time.Now()
	for _, name := range slices.Sorted(maps.Keys(p.nodes)) {
		rec := p.nodes[name]
		if rec.err != nil {
			return fmt.Errorf("node %s: %w", name, rec.err)
		}
		if rec.node != nil {
			if err := rec.node.failing(now); err != nil {
				return fmt.Errorf("node %s: %w", name, err)
			}
		}
	}
	return nil
}

// Handler serves /healthz (always ok: a refused map is not ready, not
// unhealthy) and /readyz: 200 and "ok", or 503 and the reason in one line.
func (p *Publisher) Handler() http.Handler { return endpoints.Handler(nil, p.Ready, nil) }
