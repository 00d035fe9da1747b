package writer

import (
	"path"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// step is one write or one removal of a render.
type step struct {
	change *change     // a write, or
	stale  *ownedEntry // a removal
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
	writeIf(func(c change) bool { return endpointText(c.entry.Target) })
	writeIf(func(change) bool { return true })
	removeIf(func(o ownedEntry) bool { return inLinksDir(o.path) })
	removeIf(func(ownedEntry) bool { return true })
	return steps
}

func inLinksDir(p string) bool { return path.Dir(p) == plan.LinksDir }

// endpointText reports whether a links-directory entry's text is an
// endpoint's, which starts at its anchor's entry; a bridge's (and a host
// device's) climbs out with "../".
func endpointText(target string) bool {
	return target != "" && !strings.HasPrefix(target, "../")
}
