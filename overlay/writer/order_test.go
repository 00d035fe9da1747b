package writer

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// replayPlans are every built-in under every hierarchy that accepts it, and
// the flip test's pair, whose anchors move between hierarchies.
func replayPlans(t *testing.T) []*plan.Plan {
	t.Helper()
	var out []*plan.Plan
	seen := map[string]bool{}
	add := func(source string, p *profile.Profile, h boards.Hierarchy) {
		m, err := profile.Normalize(source, p, profile.Options{Hierarchy: h})
		if err != nil {
			return // e.g. T4s on the root bus under a switched hierarchy
		}
		pl, err := plan.New(m, plan.Options{})
		require.NoError(t, err)
		if !seen[pl.Digest()] {
			seen[pl.Digest()] = true
			out = append(out, pl)
		}
	}
	hierarchies := []boards.Hierarchy{"", boards.Flat, boards.HGX, boards.DGX}
	for _, b := range shipped.All() {
		for _, h := range hierarchies {
			add("built-in "+b.Name, b.New(), h)
		}
	}
	for _, f := range []string{"a.yaml", "b.yaml"} {
		p, err := profile.LoadFile("../../testdata/flip/" + f)
		require.NoError(t, err)
		add(f, p, "")
	}
	require.GreaterOrEqual(t, len(out), 10)
	return out
}

// sim is a tree in memory with what a replay looks up often: how many
// entries each directory holds, and the entries of the links directory.
type sim struct {
	tree     plancheck.Tree
	children map[string]int
	links    map[string]bool
}

func newSim(entries []plan.Entry) *sim {
	s := &sim{tree: plancheck.Tree{}, children: map[string]int{}, links: map[string]bool{}}
	for _, e := range entries {
		s.put(e)
	}
	return s
}

func (s *sim) put(e plan.Entry) {
	if _, ok := s.tree[e.Path]; !ok {
		s.children[path.Dir(e.Path)]++
	}
	s.tree[e.Path] = e
	if inLinksDir(e.Path) {
		s.links[e.Path] = true
	}
}

func (s *sim) remove(p string) {
	if _, ok := s.tree[p]; ok {
		s.children[path.Dir(p)]--
		delete(s.tree, p)
		delete(s.links, p)
	}
}

func (s *sim) removeAll(p string) {
	for q := range s.tree {
		if q == p || strings.HasPrefix(q, p+"/") {
			s.remove(q)
		}
	}
}

type orderFunc func(entries []plan.Entry, changes []change, stale []ownedEntry, current map[string]string) []step

// replayer applies a render to a tree in memory, one step at a time, as
// Apply does on disk, and checks after every step that can matter that
// each entry of the links directory resolves to its own device: both its
// text now and every text it had since the render's last settle step,
// which a reader's walk may have read and not finished following.
type replayer struct {
	order      orderFunc
	violations []string
}

// inFlight holds, for each links-directory entry, the texts a reader may
// still be following.
type inFlight map[string][]string

func (f inFlight) add(p, text string) {
	if !slices.Contains(f[p], text) {
		f[p] = append(f[p], text)
	}
}

// texts is what readers may follow right after a settle step (or before
// the render): the links-directory entries' texts now.
func (s *sim) texts() inFlight {
	f := inFlight{}
	for l := range s.links {
		if e := s.tree[l]; e.Kind == plan.Symlink {
			f.add(l, e.Target)
		}
	}
	return f
}

// steps is what a render of p over s would do, as Apply computes it.
func (r *replayer) steps(s *sim, owned map[string]ownedEntry, p *plan.Plan) []step {
	planned := map[string]bool{}
	var changes []change
	for _, e := range p.Entries {
		planned[e.Path] = true
		cur, ok := s.tree[e.Path]
		if !ok || cur.Kind != e.Kind || cur.Target != e.Target || cur.Mode != e.Mode || !bytes.Equal(cur.Data, e.Data) {
			changes = append(changes, change{entry: e, replace: ok && cur.Kind != e.Kind})
		}
	}
	var stale []ownedEntry
	for _, o := range owned {
		if !planned[o.path] {
			stale = append(stale, o)
		}
	}
	slices.SortFunc(stale, func(a, b ownedEntry) int { return a.pos - b.pos })
	current := map[string]string{}
	for l := range s.links {
		if e := s.tree[l]; e.Kind == plan.Symlink {
			current[l] = e.Target
		}
	}
	return r.order(p.Entries, changes, stale, current)
}

// replay renders p over s. With stop >= 0 it stops before that step, as a
// SIGKILL would, and returns the manifest such a render leaves.
func (r *replayer) replay(s *sim, owned map[string]ownedEntry, p *plan.Plan, stop int) map[string]ownedEntry {
	steps := r.steps(s, owned, p)
	unionOwned, err := parseManifest(union(owned, p.Entries))
	if err != nil {
		panic(err)
	}
	flying := s.texts()
	for i, st := range steps {
		if i == stop {
			return unionOwned
		}
		if st.settle {
			flying = s.texts()
			continue
		}
		what := r.apply(s, st)
		if what == "" {
			continue
		}
		if st.change != nil {
			flying.add(st.change.entry.Path, st.change.entry.Target)
		}
		for l := range s.links {
			if v := s.tree.CheckEntry(l); v != "" {
				r.violations = append(r.violations, fmt.Sprintf("after step %d (%s) of %s: %s", i, what, p.Machine.Source, v))
			}
			// A walk that read an earlier text of an entry since removed
			// fails as on a hot-unplug; one whose entry is still there
			// must reach the device.
			for _, text := range flying[l] {
				if text == s.tree[l].Target {
					continue // checked above
				}
				if v := s.tree.CheckText(l, text); v != "" {
					r.violations = append(r.violations, fmt.Sprintf("after step %d (%s) of %s, a reader that read an earlier text: %s", i, what, p.Machine.Source, v))
				}
			}
		}
	}
	final, err := parseManifest(manifestOf(p.Entries))
	if err != nil {
		panic(err)
	}
	return final
}

// apply does one step and says what it did when that can change how a
// links-directory entry resolves: such texts pass only through entries of
// the links directory and directories, and end at a vendor file.
func (r *replayer) apply(s *sim, st step) string {
	if st.change != nil {
		e := st.change.entry
		if st.change.replace {
			s.removeAll(e.Path)
		}
		s.put(e)
		if e.Kind != plan.Symlink || !inLinksDir(e.Path) {
			return ""
		}
		return "write " + e.Path
	}
	o := st.stale
	e, ok := s.tree[o.path]
	if !ok || s.children[o.path] > 0 {
		return "" // gone already, or a directory that is not empty and stays
	}
	s.remove(o.path)
	switch {
	case e.Kind == plan.File && path.Base(o.path) != "vendor", e.Kind == plan.Symlink && !inLinksDir(o.path):
		return ""
	}
	return "remove " + o.path
}

func freshState(p *plan.Plan) (*sim, map[string]ownedEntry) {
	owned, err := parseManifest(manifestOf(p.Entries))
	if err != nil {
		panic(err)
	}
	return newSim(p.Entries), owned
}

// TestOrderKeepsEveryEntryResolvable replays renders between every pair of
// plans, and renders that start from a tree a killed render left, checking
// after every step that every links-directory entry resolves to its own
// device. That is the property a reader of the mounted tree relies on.
func TestOrderKeepsEveryEntryResolvable(t *testing.T) {
	t.Parallel()
	plans := replayPlans(t)
	const seed = 4
	rng := rand.New(rand.NewPCG(seed, seed))
	r := &replayer{order: order}
	pairs, crashes := 0, 0
	for i, from := range plans {
		for j, to := range plans {
			if i == j {
				continue
			}
			state, owned := freshState(from)
			r.replay(state, owned, to, -1)
			require.Equal(t, plancheck.FromEntries(to.Entries), state.tree, "%s -> %s does not end at the plan", from.Machine.Source, to.Machine.Source)
			pairs++

			// Kill a render from -> to at a random step, then render a third plan.
			state, owned = freshState(from)
			stop := rng.IntN(len(r.steps(state, owned, to)))
			crashedOwned := r.replay(state, owned, to, stop)
			next := plans[rng.IntN(len(plans))]
			r.replay(state, crashedOwned, next, -1)
			require.Equal(t, plancheck.FromEntries(next.Entries), state.tree, "%s -> %s killed at step %d, then %s, does not end at the plan", from.Machine.Source, to.Machine.Source, stop, next.Machine.Source)
			crashes++
		}
	}
	t.Logf("replayed %d renders between %d plans and %d renders after a killed one (seed %d)", pairs, len(plans), crashes, seed)
	require.Empty(t, r.violations, "first: %v", first(r.violations, 10))
}

// naiveOrder is the writer's earlier order: every write in plan order, then
// every removal in reverse manifest order.
func naiveOrder(_ []plan.Entry, changes []change, stale []ownedEntry, _ map[string]string) []step {
	var steps []step
	for i := range changes {
		steps = append(steps, step{change: &changes[i]})
	}
	for i := len(stale) - 1; i >= 0; i-- {
		steps = append(steps, step{stale: &stale[i]})
	}
	return steps
}

// TestNaiveOrderTears is the replay's negative control: the earlier order
// rewrote a bridge entry that was an anchor before the endpoints passing
// through it, which the flip test saw as torn reads.
func TestNaiveOrderTears(t *testing.T) {
	t.Parallel()
	a, b := flipPair(t)
	r := &replayer{order: naiveOrder}
	state, owned := freshState(b)
	r.replay(state, owned, a, -1)
	require.NotEmpty(t, r.violations)
	require.Contains(t, strings.Join(r.violations, "\n"), "0000:07:00.0")
}

// TestReadersInFlightNeedSettling is the settle steps' negative control:
// without the pauses, a flip between the flip test's profiles turns an old
// anchor into an endpoint and removes old directories while a reader may
// still be following an old text through them.
func TestReadersInFlightNeedSettling(t *testing.T) {
	t.Parallel()
	unsettled := func(entries []plan.Entry, changes []change, stale []ownedEntry, current map[string]string) []step {
		return slices.DeleteFunc(order(entries, changes, stale, current), func(s step) bool { return s.settle })
	}
	a, b := flipPair(t)
	settled, bare := &replayer{order: order}, &replayer{order: unsettled}
	for _, r := range []*replayer{settled, bare} {
		for _, flip := range [][2]*plan.Plan{{a, b}, {b, a}} {
			state, owned := freshState(flip[0])
			r.replay(state, owned, flip[1], -1)
		}
	}
	t.Logf("the flip pair's two renders: %d walks in flight broken without settle steps, %d with them", len(bare.violations), len(settled.violations))
	require.Empty(t, settled.violations)
	require.NotEmpty(t, bare.violations)
	require.Contains(t, strings.Join(bare.violations, "\n"), "a reader that read an earlier text")
}

// flipPair is the flip test's two plans, whose anchors move between them.
func flipPair(t *testing.T) (a, b *plan.Plan) {
	t.Helper()
	for _, p := range replayPlans(t) {
		switch p.Machine.Source {
		case "a.yaml":
			a = p
		case "b.yaml":
			b = p
		}
	}
	return a, b
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
