package writer

import (
	"path"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// step is one write or one removal of a render.
type step struct {
	change *change     // a write, or
	stale  *ownedEntry // a removal, or
	settle bool        // a pause for readers' walks in flight (readerGrace)
}

// order sequences a render so that every entry of the links directory
// resolves at every moment, whatever the old tree was and wherever the
// render is killed. An endpoint's entry passes through its anchor's entry
// (anchor/../../../../devices/...), which works only while the anchor's
// entry leads four levels below sys/; nothing passes through any other
// entry, and a bridge's entry ("../../../../opt/...") resolves on its own.
// Old device directories stay until the end, so an old endpoint text keeps
// resolving as long as its anchor entry leads to depth four. Hence:
//
//  1. directories, files and links inside the device tree, in plan order:
//     new paths appear, old ones keep their meaning;
//  2. stale entries that are endpoints now: nothing passes through them;
//  3. bridge entries that are endpoints now, or new: they resolve on their
//     own, and nothing passes through them;
//  4. the new plan's anchors: whatever each held, its new text leads to
//     depth four too, so old endpoint texts through it still resolve;
//  5. endpoint entries that are not bridges now (through the new anchors);
//  6. endpoint entries that are bridges now: steps 2, 3 and 5 moved every
//     entry that passed through them;
//  7. the other entries (bridges before and after), then the stale ones
//     left: no entry passes through them any more. Stale entries go before
//     the directories they lead to, which the manifest alone does not
//     ensure after a killed render (it lists the old plan, then the new);
//  8. everything else stale, in reverse manifest order: contents before
//     their directories.
//
// A reader's walk reads an entry's text and then follows it, and a reader
// the scheduler pauses in between may follow a text replaced meanwhile.
// Steps 2 to 5 keep such old texts resolving, but steps 6 and 7 rewrite
// old anchors (into endpoints, or bridges elsewhere) and steps 7 and 8
// remove old anchors and directories. So before step 6, and again before
// the removals, a settle step pauses the writer (readerGrace) for walks in
// flight to end, when texts changed since the last pause: as the kernel
// waits out a grace period before freeing what lock-free readers may
// still hold. The replay in order_test.go checks both kinds of reader.
//
// current holds the link text on disk of each links-directory entry.
func order(entries []plan.Entry, changes []change, stale []ownedEntry, current map[string]string) []step {
	anchors := map[string]bool{}
	for _, e := range entries {
		if e.Kind == plan.Symlink && inLinksDir(e.Path) && endpointText(e.Target) {
			first, _, _ := strings.Cut(e.Target, "/")
			anchors[plan.LinksDir+"/"+first] = true
		}
	}
	steps := make([]step, 0, len(changes)+len(stale))
	written := make([]bool, len(changes))
	writeIf := func(pick func(c change) bool) {
		for i := range changes {
			if !written[i] && pick(changes[i]) {
				written[i] = true
				steps = append(steps, step{change: &changes[i]})
			}
		}
	}
	removed := make([]bool, len(stale))
	removeIf := func(pick func(o ownedEntry) bool) {
		for i := len(stale) - 1; i >= 0; i-- {
			if !removed[i] && pick(stale[i]) {
				removed[i] = true
				steps = append(steps, step{stale: &stale[i]})
			}
		}
	}
	isBridgeNow := func(p string) bool { return strings.HasPrefix(current[p], "../") }

	writeIf(func(c change) bool { return c.entry.Kind != plan.Symlink || !inLinksDir(c.entry.Path) })
	removeIf(func(o ownedEntry) bool { return inLinksDir(o.path) && endpointText(current[o.path]) })
	writeIf(func(c change) bool { return !endpointText(c.entry.Target) && !isBridgeNow(c.entry.Path) })
	writeIf(func(c change) bool { return anchors[c.entry.Path] })
	writeIf(func(c change) bool { return endpointText(c.entry.Target) && !isBridgeNow(c.entry.Path) })
	settled := 0 // steps before the last settle step
	settle := func() {
		if slices.ContainsFunc(steps[settled:], rewritesLink(current)) {
			steps = append(steps, step{settle: true})
			settled = len(steps)
		}
	}
	settle()
	writeIf(func(c change) bool { return endpointText(c.entry.Target) })
	writeIf(func(change) bool { return true })
	if slices.Contains(removed, false) {
		settle()
	}
	removeIf(func(o ownedEntry) bool { return inLinksDir(o.path) })
	removeIf(func(ownedEntry) bool { return true })
	if n := len(steps); n > 0 && steps[n-1].settle {
		steps = steps[:n-1] // nothing left to wait for
	}
	return steps
}

func inLinksDir(p string) bool { return path.Dir(p) == plan.LinksDir }

// rewritesLink reports whether a step replaces or removes a text that a
// links-directory entry had before the render.
func rewritesLink(current map[string]string) func(step) bool {
	return func(s step) bool {
		var p string
		switch {
		case s.change != nil:
			p = s.change.entry.Path
		case s.stale != nil:
			p = s.stale.path
		}
		_, had := current[p]
		return had && inLinksDir(p)
	}
}

// endpointText reports whether a links-directory entry's text is an
// endpoint's, which starts at its anchor's entry; a bridge's (and a host
// device's) climbs out with "../".
func endpointText(target string) bool {
	return target != "" && !strings.HasPrefix(target, "../")
}
