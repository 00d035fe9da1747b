package serve

import (
	"log/slog"
	"maps"
	"path/filepath"

	"github.com/fsnotify/fsnotify"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

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
