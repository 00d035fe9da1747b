// Package serve is the DaemonSet's loop: it renders the profile, writes the
// CDI spec that serves the overlay, and keeps both current while it runs.
//
// It renders through overlay.Render, exactly as the render command does, so
// every guarantee of docs/design/reliability.md holds; it writes the spec through
// cdispec.WriteStandalone and cdispec.MergeInto, exactly as the cdi command
// does. What it adds is when to do it: at start, when the profile's
// directory changes (a ConfigMap volume swaps its ..data symlink
// atomically, so the directory, not the file, is watched), when a spec file
// changes under it, and every Resync as a safety net. An unchanged profile
// writes nothing: the writer compares the plan with the disk and skips what
// matches, and an unchanged spec is not rewritten.
//
// A render that fails (a bad profile, say) changes nothing before it fails,
// so the last good tree and spec stay served; the server logs the error
// once, reports not-ready, and recovers by itself on the next good render.
// It never exits for it.
//
// With a fleet map (Options.Fleet) one install serves every node its own
// profile: each sync reads the map again and renders the profile it gives
// this node (package fleet), and the map's directory, the chosen profile's
// directory and the node's labels (Options.NodeLabels) are watched as a
// single profile's directory is. A node the map gives no profile is a
// failed sync like a bad profile: not ready, the reason on one line.
//
// One topic a file: serve.go the options and Run; loop.go when to sync;
// sync.go one sync (render, log, status); specs.go the CDI specs and the
// NRI plugin's edits; prochook.go the /proc hook's binary; health.go and
// metrics.go the endpoints' answers; watcher.go the directories watched; fleetmirror.go and nodelabels.go
// what a fleet map reads through the API; writable*.go the writable mode.
package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/apiwatch"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Defaults of Options.
const (
	// DefaultResync is the safety net's period. The kubelet itself swaps a
	// changed ConfigMap in after its sync period (a minute, jittered) plus
	// its ConfigMap cache's delay: 44 to 90 s on a real node.
	DefaultResync = time.Minute
	// DefaultDebounce gathers the burst of events one ConfigMap swap makes
	// (a new timestamped directory, ..data_tmp, the rename, the old
	// directory's removal) into one render.
	DefaultDebounce = 200 * time.Millisecond
	// DefaultStopTimeout is how long a stop waits for the render in flight,
	// below the manifest's terminationGracePeriodSeconds (5).
	DefaultStopTimeout = 3 * time.Second
	// DefaultStuckAfter fails /healthz when one sync has run this long: far
	// past the writer's default lock timeout (1m) and any real render.
	DefaultStuckAfter = 5 * time.Minute
)

// Options configure a server. The zero value of every field but Render's
// paths and the spec targets is the default.
type Options struct {
	// Render is what each render renders, as the render command takes it.
	// When Render.Profile names a file, its directory is watched. An empty
	// Render.Profile is shipped.Default, never (as for render) the root's
	// own effective profile: the root follows the options. Render.Warn is
	// the server's: it logs each unknown profile key with its render.
	Render overlay.Options
	// Fleet is a fleet map file (package fleet): each sync renders the
	// profile it gives NodeName, in place of Render.Profile, which must
	// then be empty. Its directory is watched, and so is the directory of
	// the profile file it chose last.
	Fleet string
	// NodeName is this node's name, the pod's spec.nodeName; required
	// with Fleet.
	NodeName string
	// NodeLabels reads the node's labels for a map with label rules; its
	// Changed triggers a sync as a file change does. Nil with Fleet is
	// the Node's own labels through Kubeconfig (NodeLabelWatch, which Run
	// starts and which connects only when a map with label rules asks).
	NodeLabels NodeLabels
	// Kubeconfig is how NodeLabelWatch and the fleet mirror reach the API
	// server (default: the pod's service account; kubeclient.Config).
	// Only with Fleet.
	Kubeconfig string
	// FleetConfigMap, NAMESPACE/NAME, keeps Fleet's directory holding
	// that ConfigMap's keys, read and watched through the API
	// (FleetMirror, which Run starts), so Fleet must name
	// DIR/fleet.ConfigMapKey.
	FleetConfigMap string
	// AlsoAt are extra targets of the links directory (cdi --also-at).
	AlsoAt []string
	// Writable serves the tree through a FUSE view at Render.Root that
	// answers writes as the kernel does (package writable): the tree is
	// rendered at WritableTree (default DefaultWritableTree), the state
	// writes leave is kept in Render.Root, and the spec carries
	// cdispec.WritableMounts. Stopping the server unmounts the view. The
	// NRI plugin gives the writable view only to the containers its
	// policy names (nriplugin.Verdict.Writable), the read-only tree to
	// the rest.
	Writable     bool
	WritableTree string
	// Output is the standalone spec to write, of Kind (default
	// cdispec.DefaultKind); MergeInto an existing spec to merge into. At
	// least one of them; both is fine.
	Output    string
	Kind      string
	MergeInto string

	// ProcHookBinary, when set, is a path on the node where Run installs
	// serve's own executable before it hands out edits, for the edits of
	// every channel (the CDI specs, the NRI plugin) to carry the
	// createContainer hook that runs it (cdispec.ProcHook) to serve the
	// tree's /proc files. Empty: no hook.
	ProcHookBinary string

	// Listen is the address of /healthz, /readyz and /metrics (default
	// endpoints.DefaultListen); "127.0.0.1:0" picks a free port, see
	// Server.Listen.
	Listen string
	// Resync is the period of the safety-net sync (default DefaultResync).
	Resync time.Duration
	// Debounce is how long a change event waits for the rest of its burst
	// (default DefaultDebounce).
	Debounce time.Duration
	// StopTimeout bounds the wait for the sync in flight once Run's
	// context ends (default DefaultStopTimeout). A render still running
	// then is abandoned, which the writer survives like a kill: the marker
	// stays withdrawn and the next render finishes the job.
	StopTimeout time.Duration
	// StuckAfter is how long one sync may run before /healthz fails
	// (default DefaultStuckAfter).
	StuckAfter time.Duration
	// NoWatch leaves change events out, NodeLabels' Changed among them:
	// only Resync syncs.
	NoWatch bool
	// NRI, when set, runs the node's NRI plugin (package nriplugin) beside
	// the loop: it gives the containers its policy serves the spec's very
	// edits as they are created (Edits and Beneath are serve's own;
	// Logger, if nil, is the server's). Not ready while it is not
	// registered.
	NRI *nriplugin.Options
	// Logger receives the structured log (default slog.Default()).
	Logger *slog.Logger
}

// Status is what the syncs so far did.
type Status struct {
	Syncs    int // syncs finished
	Failures int // of them, those that failed
	// Err is the last sync's error, empty when it succeeded.
	Err string
	// Profile and Digest name the last good render: its source and the
	// plan digest its completion marker carries.
	Profile string
	Digest  string
	// Rule is the fleet map's rule that chose Profile (nodes[worker-a],
	// labels[0] {...}, default); empty without a map.
	Rule string
	// Stats and Duration are the last sync's render: what it wrote and
	// how long the sync took.
	Stats    writer.Stats
	Duration time.Duration
	// SpecWrites counts spec files written because their bytes changed.
	SpecWrites int
}

// Server runs the loop and serves the health endpoints.
type Server struct {
	opts   Options
	mounts []cdispec.Mount
	// readOnly is the read-only tree's mount set, of the same root: with
	// Writable, what the NRI plugin gives every container its policy does
	// not give the writable view; else mounts itself.
	readOnly []cdispec.Mount
	log      *slog.Logger
	// endpoints is the listener of /healthz, /readyz and /metrics.
	endpoints endpoints.Listener

	mu      sync.Mutex
	status  Status
	syncing time.Time // start of the sync in flight; zero when idle
	// chosenDir is the directory of the profile file the fleet map chose
	// last, for the watch to follow; empty for a built-in or no map.
	chosenDir string
	// writable is the writable mode's view, from its first render on; only
	// the loop touches it.
	writable *writableView
	// nri is the NRI plugin, with Options.NRI.
	nri *nriplugin.Plugin
	// labelWatch is the NodeLabelWatch New made, for Run to start; nil
	// when the caller gave NodeLabels or there is no fleet map.
	labelWatch *NodeLabelWatch
	// fleetConfigMap is Options.FleetConfigMap parsed.
	fleetConfigMap types.NamespacedName
}

// Validate refuses options that contradict each other, in one line that
// names serve's flags, as the command reports it: these are the checks
// that combine options; each option's own value is checked where it is
// used (New, the render).
func (o Options) Validate() error {
	switch {
	case o.Fleet != "" && o.Render.Profile != "":
		return errors.New("--fleet and --profile: give one; the fleet map chooses each node's profile")
	case o.Fleet != "" && o.NodeName == "":
		return errors.New("--fleet needs --node-name NAME, the pod's spec.nodeName (from the downward API)")
	case o.Fleet == "" && o.NodeName != "":
		return errors.New("--node-name applies to --fleet")
	case o.Fleet == "" && o.Kubeconfig != "":
		return errors.New("--kubeconfig applies to --fleet")
	case o.FleetConfigMap != "" && o.Fleet == "":
		return fmt.Errorf("--fleet-configmap needs --fleet DIR/%s, the map's file it keeps", fleet.ConfigMapKey)
	case o.FleetConfigMap != "" && filepath.Base(o.Fleet) != fleet.ConfigMapKey:
		return fmt.Errorf("--fleet %q: with --fleet-configmap, name DIR/%s, the ConfigMap's key", o.Fleet, fleet.ConfigMapKey)
	}
	if o.FleetConfigMap != "" {
		if _, err := apiwatch.ParseName(o.FleetConfigMap); err != nil {
			return fmt.Errorf("--fleet-configmap %q: %v", o.FleetConfigMap, err)
		}
	}
	switch {
	case o.Output == "" && o.MergeInto == "":
		return errors.New("give --output FILE, --merge-into FILE, or both")
	case o.WritableTree != "" && !o.Writable:
		return errors.New("--writable-tree applies to --writable")
	}
	if o.ProcHookBinary != "" {
		if err := plan.CheckAbsolutePath(o.ProcHookBinary); err != nil {
			return fmt.Errorf("--proc-hook-binary %q: %v", o.ProcHookBinary, err)
		}
	}
	return nil
}

// New checks the options (Validate, and each one's value) and fills in
// the defaults. Nothing connects to the API server before Run.
func New(o Options) (*Server, error) {
	o.Render.Root = cmp.Or(o.Render.Root, overlay.DefaultRoot)
	o.Render.ContainerRoot = cmp.Or(o.Render.ContainerRoot, plan.DefaultContainerRoot)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.Kind = cmp.Or(o.Kind, cdispec.DefaultKind)
	if err := cdispec.CheckKind(o.Kind); err != nil {
		return nil, err
	}
	// The mount set depends on the flags alone: work it out, and refuse
	// bad flags, once.
	readOnly, err := cdispec.Mounts(o.Render.Root, o.Render.ContainerRoot, o.AlsoAt)
	if err != nil {
		return nil, err
	}
	mounts := readOnly
	if o.Writable {
		if mounts, err = cdispec.WritableMounts(o.Render.Root, o.Render.ContainerRoot, o.AlsoAt, o.Render.HostSysfs, kernelRelease()); err != nil {
			return nil, err
		}
	}
	o.Listen = cmp.Or(o.Listen, endpoints.DefaultListen)
	if o.Resync <= 0 {
		o.Resync = DefaultResync
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	if o.StuckAfter <= 0 {
		o.StuckAfter = DefaultStuckAfter
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{opts: o, mounts: mounts, readOnly: readOnly, log: o.Logger, endpoints: endpoints.Listener{Addr: o.Listen}}
	if o.Fleet != "" && o.NodeLabels == nil {
		s.labelWatch = NewNodeLabelWatch(o.NodeName, o.Kubeconfig, o.Logger)
		s.opts.NodeLabels = s.labelWatch
	}
	if o.FleetConfigMap != "" {
		s.fleetConfigMap, _ = apiwatch.ParseName(o.FleetConfigMap) // Validate parsed it
	}
	if o.NRI != nil {
		no := *o.NRI
		// The writable view goes only to the containers the policy
		// gives it; every other served one gets the read-only tree, the
		// view mounted read-only: a write there is EROFS.
		no.Edits, no.Logger, no.Beneath = s.Edits, cmp.Or(no.Logger, o.Logger), s.beneath
		if o.Writable {
			no.Edits, no.WritableEdits = s.ReadOnlyEdits, s.Edits
		}
		no.Policy.Device = cmp.Or(no.Policy.Device, o.Kind+"="+cdispec.DeviceName)
		if s.nri, err = nriplugin.New(no); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Status returns a copy of the status.
func (s *Server) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// NRI is what the NRI plugin did, and false without one.
func (s *Server) NRI() (nriplugin.Counts, bool) {
	if s.nri == nil {
		return nriplugin.Counts{}, false
	}
	return s.nri.Counts(), true
}

// Run serves until ctx ends, then waits up to StopTimeout for the sync in
// flight and returns nil, leaving the tree and the specs in place: served
// containers keep using them. It returns an error only when the listener
// cannot be opened, the fleet mirror cannot be made, or the hook's binary
// cannot be installed.
func (s *Server) Run(ctx context.Context) error {
	if err := s.installProcHook(); err != nil {
		return err
	}
	if _, err := s.Listen(); err != nil {
		return err
	}
	if err := s.startAPIWatches(ctx); err != nil {
		return err
	}
	hs, addr, err := s.endpoints.Serve(s.Handler(), s.log)
	if err != nil {
		return err
	}
	source := []any{"profile", s.profileName()}
	if s.opts.Fleet != "" {
		source = []any{"fleet", s.opts.Fleet, "node", s.opts.NodeName}
	}
	s.log.Info("serving", append(source, "root", s.opts.Render.Root,
		"output", s.opts.Output, "merge_into", s.opts.MergeInto, "addr", addr.String(),
		"resync", s.opts.Resync.String(), "watch", !s.opts.NoWatch)...)

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.loop(ctx)
	}()
	nriDone := make(chan struct{})
	go func() {
		defer close(nriDone)
		if s.nri != nil {
			s.nri.Run(ctx)
		}
	}()
	<-ctx.Done()
	<-nriDone
	stopped := time.Now()
	select {
	case <-done:
		s.closeWritable()
	case <-time.After(s.opts.StopTimeout):
		// The writable view dies with the process; the next start
		// detaches it.
		s.log.Warn("stopping with a render in flight; the next start finishes it", "waited", s.opts.StopTimeout.String())
	}
	shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdown)
	if s.opts.Writable {
		s.log.Info("stopped; the writable view is unmounted, the state and the spec stay in place", "root", s.opts.Render.Root, "took", time.Since(stopped).String())
		return nil
	}
	s.log.Info("stopped; the tree and the spec stay in place", "root", s.opts.Render.Root, "took", time.Since(stopped).String())
	return nil
}

func (s *Server) profileName() string {
	if s.opts.Render.Profile == "" {
		return "built-in " + shipped.Default
	}
	return s.opts.Render.Profile
}
