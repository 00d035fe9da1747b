package serve

import (
	"context"
	"time"

	"github.com/fsnotify/fsnotify"
)

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
	// arm starts the debounce on the first change of a burst, so a burst
	// of events (a ConfigMap update swaps several links) syncs once.
	arm := func() {
		if debounce == nil {
			debounce = time.NewTimer(s.opts.Debounce)
			fire = debounce.C
		}
	}
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
			arm()
		case _, ok := <-labelsChanged:
			if !ok {
				labelsChanged = nil
				continue
			}
			s.log.Debug("node labels changed", "node", s.opts.NodeName)
			arm()
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
