// Package serve is the DaemonSet's loop: it renders the profile, writes the
// CDI spec that serves the overlay, and keeps both current while it runs.
//
// It renders through overlay.Render, exactly as the render command does, so
// every guarantee of docs/design/reliability.md holds; it writes the spec through
// deploy.WriteStandalone and deploy.MergeInto, exactly as the cdi command
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
package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Defaults of Options.
const (
	DefaultListen = ":8080"
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

// Health endpoint paths.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
)

// Options configure a server. The zero value of every field but Render's
// paths and the spec targets is the default.
type Options struct {
	// Render is what each render renders, as the render command takes it.
	// When Render.Profile names a file, its directory is watched. An empty
	// Render.Profile is builtin.Default, never (as for render) the root's
	// own effective profile: the root follows the options. Render.Warn is
	// the server's: it logs each unknown profile key with its render.
	Render overlay.Options
	// AlsoAt are extra targets of the links directory (cdi --also-at).
	AlsoAt []string
	// Output is the standalone spec to write, of Kind (default
	// deploy.DefaultKind); MergeInto an existing spec to merge into. At
	// least one of them; both is fine.
	Output    string
	Kind      string
	MergeInto string

	// Listen is the address of /healthz and /readyz (default
	// DefaultListen); "127.0.0.1:0" picks a free port, see Addr.
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
	// NoWatch leaves change events out: only Resync syncs.
	NoWatch bool
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
	mounts []deploy.Mount
	log    *slog.Logger
	ln     net.Listener

	mu      sync.Mutex
	status  Status
	syncing time.Time // start of the sync in flight; zero when idle
}

// New checks the options and fills in the defaults.
func New(o Options) (*Server, error) {
	o.Render.Root = cmp.Or(o.Render.Root, overlay.DefaultRoot)
	o.Render.ContainerRoot = cmp.Or(o.Render.ContainerRoot, plan.DefaultContainerRoot)
	if o.Output == "" && o.MergeInto == "" {
		return nil, errors.New("no CDI spec to write: give Output, MergeInto, or both")
	}
	o.Kind = cmp.Or(o.Kind, deploy.DefaultKind)
	if err := deploy.CheckKind(o.Kind); err != nil {
		return nil, err
	}
	// The mount set depends on the flags alone: work it out, and refuse
	// bad flags, once.
	mounts, err := deploy.Mounts(o.Render.Root, o.Render.ContainerRoot, o.AlsoAt)
	if err != nil {
		return nil, err
	}
	o.Listen = cmp.Or(o.Listen, DefaultListen)
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
	return &Server{opts: o, mounts: mounts, log: o.Logger}, nil
}

// Listen opens the health endpoints' listener, if Run has not, and returns
// its address: the port a probe, or a test that asked for port 0, uses.
func (s *Server) Listen() (net.Addr, error) {
	if s.ln == nil {
		ln, err := net.Listen("tcp", s.opts.Listen)
		if err != nil {
			// net's error names the address; the caller says where it
			// came from (serve's --listen).
			return nil, err
		}
		s.ln = ln
	}
	return s.ln.Addr(), nil
}

// Status returns a copy of the status.
func (s *Server) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Run serves until ctx ends, then waits up to StopTimeout for the sync in
// flight and returns nil, leaving the tree and the specs in place: served
// containers keep using them. It returns an error only when the listener
// cannot be opened.
func (s *Server) Run(ctx context.Context) error {
	addr, err := s.Listen()
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("health endpoints stopped", "addr", addr.String(), "err", err)
		}
	}()
	s.log.Info("serving", "profile", s.profileName(), "root", s.opts.Render.Root,
		"output", s.opts.Output, "merge_into", s.opts.MergeInto, "addr", addr.String(),
		"resync", s.opts.Resync.String(), "watch", !s.opts.NoWatch)

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.loop(ctx)
	}()
	<-ctx.Done()
	stopped := time.Now()
	select {
	case <-done:
	case <-time.After(s.opts.StopTimeout):
		s.log.Warn("stopping with a render in flight; the next start finishes it", "waited", s.opts.StopTimeout.String())
	}
	shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdown)
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
	s.Sync(ctx, "start")
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
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			// An overflow loses events; the resync still comes.
			s.log.Warn("watch error; the resync still runs", "err", err)
		case <-fire:
			debounce, fire = nil, nil
			s.Sync(ctx, "change")
		case <-resync.C:
			if w != nil {
				w.add() // a directory that was missing may be there now
			}
			s.Sync(ctx, "resync")
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
	ro.Profile = cmp.Or(ro.Profile, builtin.Default)
	var unknown []error
	ro.Warn = func(err error) { unknown = append(unknown, err) }
	p, st, err := overlay.Render(ro)
	specWrites := 0
	if err == nil {
		s.logRender(ctx, reason, p, st, unknown, prev.Syncs == 0, time.Since(start))
		specWrites, err = s.writeSpecs()
	}
	took := time.Since(start)

	// Logged before the status says so, so whoever sees /readyz change
	// finds the line that explains it already written.
	switch {
	case err != nil && err.Error() != prev.Err:
		// One line per distinct failure: a resync of the same bad profile
		// says nothing new.
		s.log.Error("render failed; still serving the last good tree and spec", "reason", reason, "err", err, "last_good", prev.Digest)
	case err == nil && prev.Err != "":
		s.log.Info("recovered", "reason", reason, "profile", p.Machine.Source, "digest", p.Digest())
	}

	s.mu.Lock()
	s.syncing = time.Time{}
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
		s.status.Stats = st
	}
	s.mu.Unlock()
}

// logRender logs a render that succeeded: at info when it changed the
// tree (or is the first), at debug when it wrote nothing, so a quiet
// resync stays quiet.
func (s *Server) logRender(ctx context.Context, reason string, p *plan.Plan, st writer.Stats, unknown []error, first bool, took time.Duration) {
	level, msg := slog.LevelDebug, "unchanged"
	if st.Written() > 0 || st.DirsCreated > 0 || st.Removed > 0 || first {
		level, msg = slog.LevelInfo, "rendered"
	}
	s.log.Log(ctx, level, msg, "reason", reason, "profile", p.Machine.Source, "gpus", len(p.Machine.GPUs()),
		"digest", p.Digest(), "files_written", st.FilesWritten, "links_written", st.LinksWritten,
		"dirs_created", st.DirsCreated, "removed", st.Removed, "files_unchanged", st.FilesUnchanged,
		"links_unchanged", st.LinksUnchanged, "took", took.String())
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
// configured, behind the same gate as the cdi command. It returns how many
// files it changed.
func (s *Server) writeSpecs() (int, error) {
	root := s.opts.Render.Root
	rootFS := os.DirFS(root)
	if err := deploy.CheckRendered(rootFS, root); err != nil {
		return 0, err
	}
	// The variables follow the render (a profile may gain or lose its
	// machine type), so they are read each time, unlike the mounts.
	env := deploy.Env(rootFS, s.opts.Render.ContainerRoot)
	n := 0
	if s.opts.Output != "" {
		_, wrote, err := deploy.WriteStandalone(s.opts.Output, s.opts.Kind, s.mounts, env, true)
		if err != nil {
			return n, err
		}
		if wrote {
			n++
			s.log.Info("wrote CDI spec", "file", s.opts.Output, "device", s.opts.Kind+"="+deploy.DeviceName, "mounts", len(s.mounts), "env", env)
		}
	}
	if s.opts.MergeInto != "" {
		_, r, wrote, err := deploy.MergeInto(s.opts.MergeInto, s.mounts, env, true)
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

// Handler serves /healthz and /readyz: 200 and "ok", or 503 and the reason
// in one line.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%v\n", err)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.Handle("GET "+HealthzPath, probe(s.Healthy))
	mux.Handle("GET "+ReadyzPath, probe(s.Ready))
	return mux
}

func (s *Server) profileName() string {
	if s.opts.Render.Profile == "" {
		return "built-in " + builtin.Default
	}
	return s.opts.Render.Profile
}

// watcher watches the directories whose changes call for a sync: the
// profile's (any change: a ConfigMap swaps ..data, an editor renames) and
// the spec files' (a change of those very files: another writer rewrote
// the spec we merge into, or someone removed ours).
type watcher struct {
	fs  *fsnotify.Watcher
	log *slog.Logger
	// dirs maps each directory to the names in it that matter; nil means
	// any name.
	dirs   map[string]map[string]bool
	warned map[string]bool
}

func (s *Server) watch() *watcher {
	if s.opts.NoWatch {
		return nil
	}
	dirs := map[string]map[string]bool{}
	// A built-in profile has no file to watch.
	if _, builtinName := builtin.Get(s.profileName()); !builtinName && s.opts.Render.Profile != "" {
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
	w := &watcher{fs: fw, log: s.log, dirs: dirs, warned: map[string]bool{}}
	w.add()
	return w
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
