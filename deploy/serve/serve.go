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
package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	specs "tags.cncf.io/container-device-interface/specs-go"

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
	// NodeLabels reads the node's labels for a map with label rules (nil
	// will do for a map without any: such a sync fails if the map gains
	// one). Its Changed triggers a sync as a file change does.
	NodeLabels NodeLabels
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
	// edits as they are created (Edits is serve's own; Logger, if nil, is
	// the server's). Not ready while it is not registered.
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
}

// New checks the options and fills in the defaults.
func New(o Options) (*Server, error) {
	o.Render.Root = cmp.Or(o.Render.Root, overlay.DefaultRoot)
	o.Render.ContainerRoot = cmp.Or(o.Render.ContainerRoot, plan.DefaultContainerRoot)
	if o.Output == "" && o.MergeInto == "" {
		return nil, errors.New("no CDI spec to write: give Output, MergeInto, or both")
	}
	if o.Fleet != "" {
		switch {
		case o.Render.Profile != "":
			return nil, fmt.Errorf("fleet map %s and profile %s: give one; the map chooses the profile", o.Fleet, o.Render.Profile)
		case o.NodeName == "":
			return nil, fmt.Errorf("fleet map %s: no node name: the map chooses by it", o.Fleet)
		}
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
	if o.NRI != nil {
		no := *o.NRI
		// The writable view goes only to the containers the policy
		// gives it; every other served one gets the read-only tree, the
		// view mounted read-only: a write there is EROFS.
		no.Edits, no.Logger = s.Edits, cmp.Or(no.Logger, o.Logger)
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

// Listen opens the health endpoints' listener, if Run has not, and returns
// its address: the port a probe, or a test that asked for port 0, uses.
func (s *Server) Listen() (net.Addr, error) { return s.endpoints.Listen() }

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
// cannot be opened.
func (s *Server) Run(ctx context.Context) error {
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

// loop syncs at start, on change events and every Resync, until ctx ends.
// Syncs run one at a time, here, so none ever overlaps another.
func (s *Server) loop(ctx context.Context) {
	w := s.watch()
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w != nil {
		defer w.close()
		events, watchErrs = w.fs.Events, w.fs.Errors
	}
	var labelsChanged <-chan struct{}
	if s.opts.NodeLabels != nil && !s.opts.NoWatch {
		labelsChanged = s.opts.NodeLabels.Changed()
	}
	syncNow := func(reason string) {
		s.Sync(ctx, reason)
		if w != nil {
			w.follow(s.chosenProfileDir())
		}
	}
	syncNow("start")
	resync := time.NewTicker(s.opts.Resync)
	defer resync.Stop()
	var debounce *time.Timer
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if !w.relevant(ev) {
				continue
			}
			s.log.Debug("change event", "name", ev.Name, "op", ev.Op.String())
			if debounce == nil {
				debounce = time.NewTimer(s.opts.Debounce)
				fire = debounce.C
			}
		case _, ok := <-labelsChanged:
			if !ok {
				labelsChanged = nil
				continue
			}
			s.log.Debug("node labels changed", "node", s.opts.NodeName)
			if debounce == nil {
				debounce = time.NewTimer(s.opts.Debounce)
				fire = debounce.C
			}
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			// An overflow loses events; the resync still comes.
			s.log.Warn("watch error; the resync still runs", "err", err)
		case <-fire:
			debounce, fire = nil, nil
			syncNow("change")
		case <-resync.C:
			if w != nil {
				w.add() // a directory that was missing may be there now
			}
			syncNow("resync")
		}
	}
}

// Sync renders and writes the specs once, unless ctx has ended. The loop
// calls it; a test may call it directly instead of Run.
func (s *Server) Sync(ctx context.Context, reason string) {
	if ctx.Err() != nil {
		return
	}
	start := time.Now()
	s.mu.Lock()
	s.syncing = start
	s.mu.Unlock()

	s.mu.Lock()
	prev := s.status
	s.mu.Unlock()
	ro := s.opts.Render
	var choice fleet.Choice
	var chose []any // the choice's log attributes
	var err error
	if s.opts.Fleet != "" {
		chose = []any{"node", s.opts.NodeName}
		if choice, err = s.choose(ctx); err == nil {
			ro.Profile = choice.Profile
			chose = append(chose, "rule", choice.Rule)
		}
	}
	ro.Profile = cmp.Or(ro.Profile, shipped.Default)
	var unknown []error
	ro.Warn = func(err error) { unknown = append(unknown, err) }
	var p *plan.Plan
	var st writer.Stats
	switch {
	case err == nil && s.opts.Writable:
		p, st, err = s.renderWritable(ro)
	case err == nil:
		p, st, err = overlay.Render(ro)
	}
	specWrites := 0
	if err == nil {
		s.logRender(ctx, reason, p, st, unknown, prev.Syncs == 0, time.Since(start), chose)
		specWrites, err = s.writeSpecs()
	}
	took := time.Since(start)

	// Logged before the status says so, so whoever sees /readyz change
	// finds the line that explains it already written.
	switch {
	case err != nil && err.Error() != prev.Err:
		// One line per distinct failure: a resync of the same bad profile
		// says nothing new.
		s.log.Error("render failed; still serving the last good tree and spec", slices.Concat([]any{"reason", reason, "err", err, "last_good", prev.Digest}, chose)...)
	case err == nil && prev.Err != "":
		s.log.Info("recovered", slices.Concat([]any{"reason", reason, "profile", p.Machine.Source, "digest", p.Digest()}, chose)...)
	}

	s.mu.Lock()
	s.syncing = time.Time{}
	if choice.Profile != "" {
		s.chosenDir = ""
		if !choice.Builtin {
			// Watched even when the file fails to render: fixing it
			// must re-render at once.
			s.chosenDir = dirOf(choice.Profile)
		}
	}
	s.status.Syncs++
	s.status.Duration = took
	s.status.SpecWrites += specWrites
	if err != nil {
		s.status.Failures++
		s.status.Err = err.Error()
	} else {
		s.status.Err = ""
		s.status.Profile = p.Machine.Source
		s.status.Digest = p.Digest()
		s.status.Rule = choice.Rule
		s.status.Stats = st
	}
	s.mu.Unlock()
}

// choose reads the fleet map and resolves this node's profile. It reads
// the node's labels only when the map has label rules and does not name
// the node: a node named in the map is served without the API server.
func (s *Server) choose(ctx context.Context) (fleet.Choice, error) {
	m, err := fleet.Load(s.opts.Fleet)
	if err != nil {
		return fleet.Choice{}, err
	}
	var labels map[string]string
	if _, named := m.Nodes[s.opts.NodeName]; !named && m.NeedsLabels() {
		if s.opts.NodeLabels == nil {
			return fleet.Choice{}, fmt.Errorf("fleet map %s: the map has label rules, but serve has no source of node labels", s.opts.Fleet)
		}
		if labels, err = s.opts.NodeLabels.Labels(ctx); err != nil {
			return fleet.Choice{}, fmt.Errorf("fleet map %s has label rules: %w", s.opts.Fleet, err)
		}
	}
	return m.Resolve(s.opts.NodeName, labels)
}

// chosenProfileDir is the directory of the profile file the fleet map
// chose last: the watch follows it.
func (s *Server) chosenProfileDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chosenDir
}

// logRender logs a render that succeeded: at info when it changed the
// tree (or is the first), at debug when it wrote nothing, so a quiet
// resync stays quiet. chose are the fleet map's choice (node, rule).
func (s *Server) logRender(ctx context.Context, reason string, p *plan.Plan, st writer.Stats, unknown []error, first bool, took time.Duration, chose []any) {
	level, msg := slog.LevelDebug, "unchanged"
	if st.Written() > 0 || st.DirsCreated > 0 || st.Removed > 0 || first {
		level, msg = slog.LevelInfo, "rendered"
	}
	s.log.Log(ctx, level, msg, slices.Concat([]any{"reason", reason, "profile", p.Machine.Source}, chose, []any{"gpus", len(p.Machine.GPUs()),
		"digest", p.Digest(), "files_written", st.FilesWritten, "links_written", st.LinksWritten,
		"dirs_created", st.DirsCreated, "removed", st.Removed, "files_unchanged", st.FilesUnchanged,
		"links_unchanged", st.LinksUnchanged, "took", took.String()})...)
	warn := slog.LevelDebug
	if level == slog.LevelInfo {
		warn = slog.LevelWarn
	}
	for _, u := range unknown {
		s.log.Log(ctx, warn, "profile key nvml-mock does not know; --strict refuses it", "err", u)
	}
	for _, f := range st.Foreign {
		s.log.Log(ctx, warn, "links directory holds an entry no render made; go-nvlib aborts its scan on an unreadable one", "entry", f)
	}
	for _, k := range st.Kept {
		s.log.Log(ctx, warn, "kept a stale directory: it holds files no render made", "path", filepath.Join(s.opts.Render.Root, k))
	}
}

// writeSpecs writes the standalone spec and merges into the other, as
// configured, behind the same gate as the cdi command and the NRI plugin
// (served). It returns how many files it changed.
func (s *Server) writeSpecs() (int, error) {
	env, err := s.served()
	if err != nil {
		return 0, err
	}
	n := 0
	if s.opts.Output != "" {
		_, wrote, err := cdispec.WriteStandalone(s.opts.Output, s.opts.Kind, s.mounts, env, true)
		if err != nil {
			return n, err
		}
		if wrote {
			n++
			s.log.Info("wrote CDI spec", "file", s.opts.Output, "device", s.opts.Kind+"="+cdispec.DeviceName, "mounts", len(s.mounts), "env", env)
		}
	}
	if s.opts.MergeInto != "" {
		_, r, wrote, err := cdispec.MergeInto(s.opts.MergeInto, s.mounts, env, true)
		if err != nil {
			return n, fmt.Errorf("merge into %s: %w; left as it was", s.opts.MergeInto, err)
		}
		if wrote {
			n++
			s.log.Info("merged into CDI spec", "file", s.opts.MergeInto, "removed", len(r.Removed), "added", len(r.Added), "env", r.Env)
		}
	}
	return n, nil
}

// served is the gate of every channel: the root holds a complete render
// (its completion marker, not a directory existing). It returns the
// variables that go with the mounts, which follow the render (a profile
// may gain or lose its machine type), unlike the mounts.
func (s *Server) served() ([]string, error) {
	root := s.opts.Render.Root
	rootFS := os.DirFS(root)
	if err := cdispec.CheckRendered(rootFS, root); err != nil {
		return nil, err
	}
	return cdispec.Env(rootFS, s.opts.Render.ContainerRoot), nil
}

// Edits are the edits of the spec's device (cdispec.DeviceEdits) as the
// root is now: the NRI plugin's source, read at each container's creation.
// When the root cannot be served now, the error says why, and the edits
// hold the mounts it would serve, without their variables.
func (s *Server) Edits() (specs.ContainerEdits, error) { return s.edits(s.mounts) }

// ReadOnlyEdits are Edits with the read-only tree's mounts (cdispec.Mounts)
// of the same root: with Writable, the view mounted read-only, which shows
// what writers did but takes no write; else Edits.
func (s *Server) ReadOnlyEdits() (specs.ContainerEdits, error) { return s.edits(s.readOnly) }

func (s *Server) edits(mounts []cdispec.Mount) (specs.ContainerEdits, error) {
	env, err := s.served()
	edits := cdispec.DeviceEdits(mounts, env)
	if err != nil {
		edits.Env = nil
	}
	return edits, err
}

// Ready says why the node is not served right, or nil when it is: the
// last sync succeeded, so the tree is the current profile's and the specs
// were written, the completion marker still vouches for that very plan,
// and the spec files are there.
func (s *Server) Ready() error {
	st := s.Status()
	switch {
	case st.Syncs == 0:
		return errors.New("no render yet")
	case st.Err != "":
		return errors.New(st.Err)
	}
	m, err := writer.ReadMarker(os.DirFS(s.opts.Render.Root))
	if err != nil {
		return fmt.Errorf("%s: %w", s.opts.Render.Root, err)
	}
	if m.Digest != st.Digest {
		return fmt.Errorf("%s holds plan %s, not the current profile's %s", s.opts.Render.Root, m.Digest, st.Digest)
	}
	for _, f := range []string{s.opts.Output, s.opts.MergeInto} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("CDI spec: %w", err)
		}
	}
	if s.nri != nil {
		return s.nri.Ready()
	}
	return nil
}

// Healthy fails only when one sync has run longer than StuckAfter: a
// restart is then the better bet. A failing render is not unhealthy; it
// is not ready.
func (s *Server) Healthy() error {
	s.mu.Lock()
	started := s.syncing
	s.mu.Unlock()
	if !started.IsZero() {
		if d := time.Since(started); d > s.opts.StuckAfter {
			return fmt.Errorf("one sync has run for %s", d.Round(time.Second))
		}
	}
	return nil
}

// Handler serves /healthz (Healthy), /readyz (Ready) and /metrics: 200
// and "ok", or 503 and the reason in one line.
func (s *Server) Handler() http.Handler {
	return endpoints.Handler(s.Healthy, s.Ready, s.writeMetrics)
}

// writeMetrics writes the counters in Prometheus' text format: the syncs,
// and the NRI plugin's (containers served, and those that run without the
// tree, which a restart would serve).
func (s *Server) writeMetrics(w io.Writer) {
	st := s.Status()
	endpoints.Metric(w, "syncs_total", "counter", "Syncs finished.", fmt.Sprintf(" %d", st.Syncs))
	endpoints.Metric(w, "sync_failures_total", "counter", "Syncs that failed.", fmt.Sprintf(" %d", st.Failures))
	c, ok := s.NRI()
	if !ok {
		return
	}
	registered := 0
	if c.Registered {
		registered = 1
	}
	endpoints.Metric(w, "nri_registered", "gauge", "1 while the NRI plugin is registered with the runtime.", fmt.Sprintf(" %d", registered))
	endpoints.Metric(w, "nri_registrations_total", "counter", "Registrations with the runtime (a runtime restart adds one).", fmt.Sprintf(" %d", c.Registrations))
	endpoints.Metric(w, "nri_containers_total", "counter", "Containers the NRI plugin judged, by what it did.",
		fmt.Sprintf(`{result="served"} %d`, c.Served), fmt.Sprintf(`{result="unrendered"} %d`, c.Unrendered),
		fmt.Sprintf(`{result="refused"} %d`, c.Refused), fmt.Sprintf(`{result="conflict"} %d`, c.Conflicts),
		fmt.Sprintf(`{result="missed"} %d`, c.Missed))
	endpoints.Metric(w, "nri_writable_containers_total", "counter", "Of the containers served, those given the writable view (serve --writable).",
		fmt.Sprintf(" %d", c.ServedWritable))
	endpoints.Metric(w, "nri_unserved_containers", "gauge", "Running containers the policy serves that run without the tree (serve's log names them).",
		fmt.Sprintf(" %d", len(c.Unserved)))
}

func (s *Server) profileName() string {
	if s.opts.Render.Profile == "" {
		return "built-in " + shipped.Default
	}
	return s.opts.Render.Profile
}

// watcher watches the directories whose changes call for a sync: the
// profile's, or the fleet map's and its chosen profile's (any change: a
// ConfigMap swaps ..data, an editor renames) and the spec files' (a change
// of those very files: another writer rewrote the spec we merge into, or
// someone removed ours).
type watcher struct {
	fs  *fsnotify.Watcher
	log *slog.Logger
	// fixed are the directories the options name: each maps to the names
	// in it that matter; nil means any name.
	fixed map[string]map[string]bool
	// chosen is the directory of the profile file the fleet map chose
	// last, watched for any name; empty for none.
	chosen string
	// dirs is fixed and chosen together: what is watched.
	dirs   map[string]map[string]bool
	warned map[string]bool
}

func (s *Server) watch() *watcher {
	if s.opts.NoWatch {
		return nil
	}
	dirs := map[string]map[string]bool{}
	switch _, builtinName := shipped.Get(s.profileName()); {
	case s.opts.Fleet != "":
		// The map's profile files may lie beside it (keys of the same
		// ConfigMap); the chosen one's directory is followed after each
		// sync.
		dirs[dirOf(s.opts.Fleet)] = nil
	case !builtinName && s.opts.Render.Profile != "":
		// A built-in profile has no file to watch.
		dirs[dirOf(s.opts.Render.Profile)] = nil
	}
	for _, f := range []string{s.opts.Output, s.opts.MergeInto} {
		if f == "" {
			continue
		}
		dir := dirOf(f)
		names, ok := dirs[dir]
		switch {
		case ok && names == nil:
			continue // already any name
		case !ok:
			names = map[string]bool{}
			dirs[dir] = names
		}
		names[filepath.Base(f)] = true
	}
	if len(dirs) == 0 {
		return nil
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("cannot watch for changes; only the resync runs", "err", err)
		return nil
	}
	w := &watcher{fs: fw, log: s.log, fixed: dirs, dirs: dirs, warned: map[string]bool{}}
	w.add()
	return w
}

// follow watches dir, the chosen profile's directory, in place of the one
// chosen before; "" watches none.
func (w *watcher) follow(dir string) {
	if dir == w.chosen {
		return
	}
	w.chosen = dir
	w.dirs = maps.Clone(w.fixed)
	if dir != "" {
		w.dirs[dir] = nil
	}
	for _, d := range w.fs.WatchList() {
		if _, ok := w.dirs[d]; !ok {
			_ = w.fs.Remove(d) // gone already, when the directory went away
			w.log.Debug("no longer watching", "dir", d)
		}
	}
	w.add()
}

// add watches every directory not yet watched. fsnotify drops the watch of
// a directory that goes away, so a missing one is tried again each resync.
func (w *watcher) add() {
	watched := map[string]bool{}
	for _, d := range w.fs.WatchList() {
		watched[d] = true
	}
	for dir := range w.dirs {
		if watched[dir] {
			continue
		}
		if err := w.fs.Add(dir); err != nil {
			if !w.warned[dir] {
				w.warned[dir] = true
				w.log.Warn("cannot watch a directory yet; the resync covers it", "dir", dir, "err", err)
			}
			continue
		}
		w.log.Debug("watching", "dir", dir)
	}
}

// dirOf is a file's directory, absolute, as fsnotify names its events.
func dirOf(file string) string {
	if abs, err := filepath.Abs(file); err == nil {
		file = abs
	}
	return filepath.Dir(file)
}

func (w *watcher) relevant(ev fsnotify.Event) bool {
	names, ok := w.dirs[filepath.Dir(ev.Name)]
	return ok && (names == nil || names[filepath.Base(ev.Name)])
}

func (w *watcher) close() { _ = w.fs.Close() }
