package serve

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

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
