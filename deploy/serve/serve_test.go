package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// badProfile names the field and the value its error must name.
const (
	badProfile = "../../testdata/hostile/link-gen-is-a-float.yaml"
	badField   = "devices[0].pcie.max_link_gen"
	badValue   = "4.5"
)

const profileKey = "profile.yaml"

func TestMain(m *testing.M) { os.Exit(overlaytest.Main(m)) }

func newConfigMap(t *testing.T, text []byte) *podtest.ConfigMap {
	t.Helper()
	return podtest.NewConfigMap(t, filepath.Join(t.TempDir(), "profile"), profileKey, text)
}

func builtinText(t *testing.T, name string) []byte {
	t.Helper()
	p, ok := shipped.Get(name)
	require.True(t, ok, name)
	text, err := profile.Marshal(p, name)
	require.NoError(t, err)
	return text
}

// served is a running server on temporary paths.
type served struct {
	t    *testing.T
	srv  *Server
	opts Options
	cm   *podtest.ConfigMap
	logs *podtest.Log
	url  string
	stop context.CancelFunc
	done chan error
}

// start serves the ConfigMap's profile into a new root and a standalone
// spec; adjust changes the options first.
func start(t *testing.T, cm *podtest.ConfigMap, adjust func(*Options)) *served {
	t.Helper()
	dir := t.TempDir()
	logs := &podtest.Log{}
	o := Options{
		// No test here is of durability: skip syncfs, which flushes the
		// whole filesystem.
		Render: overlay.Options{Profile: cm.File(), Root: filepath.Join(dir, "overlay"), Writer: writer.Options{SkipSync: true}},
		Output: filepath.Join(dir, "cdi", "nvml-mock-sysfs.yaml"),
		Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	require.NoError(t, os.Mkdir(filepath.Dir(o.Output), 0o755))
	if adjust != nil {
		adjust(&o)
	}
	srv, err := New(o)
	require.NoError(t, err)
	addr, err := srv.Listen()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{t: t, srv: srv, opts: o, cm: cm, logs: logs, url: "http://" + addr.String(), stop: cancel, done: make(chan error, 1)}
	go func() { s.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// probe gets a health endpoint, as the kubelet's httpGet probe does.
func (s *served) probe(path string) (int, string) {
	s.t.Helper()
	code, body, err := podtest.Probe(s.url + path)
	require.NoError(s.t, err)
	return code, body
}

// waitReady waits for /readyz to answer want and returns how long it took.
func (s *served) waitReady(want int, within time.Duration) time.Duration {
	s.t.Helper()
	return podtest.WaitProbe(s.t, s.url+endpoints.ReadyzPath, want, within)
}

// waitFirstSync waits until the first sync has finished, whether or not
// it already had: waitSyncs(1) after start waits for a second one when
// the first beat it, which a long Resync never brings.
func (s *served) waitFirstSync() Status {
	s.t.Helper()
	podtest.Until(s.t, 10*time.Second, "the first sync", func() (bool, string) {
		st := s.srv.Status()
		return st.Syncs >= 1, fmt.Sprintf("%d syncs, last error %q", st.Syncs, st.Err)
	})
	return s.srv.Status()
}

// waitSyncs waits until n more syncs have finished.
func (s *served) waitSyncs(n int) Status {
	s.t.Helper()
	from := s.srv.Status().Syncs
	podtest.Until(s.t, 10*time.Second, fmt.Sprintf("%d more syncs (from %d)", n, from), func() (bool, string) {
		st := s.srv.Status()
		return st.Syncs >= from+n, fmt.Sprintf("%d syncs, last error %q", st.Syncs, st.Err)
	})
	return s.srv.Status()
}

// waitDigest waits until the last good render is of the plan want, and
// returns how long that took.
func (s *served) waitDigest(want string, within time.Duration, what string) time.Duration {
	s.t.Helper()
	return podtest.Until(s.t, within, what, func() (bool, string) {
		st := s.srv.Status()
		return st.Digest == want, fmt.Sprintf("digest %s after %d syncs, last error %q", st.Digest, st.Syncs, st.Err)
	})
}

// logged returns the log records of level whose message is msg.
func (s *served) logged(level, msg string) []map[string]any {
	s.t.Helper()
	var out []map[string]any
	for _, rec := range s.logs.Records(s.t, level) {
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// requireNoWatch requires a server that says it does not watch (its
// "serving" line) and that logged no change event: what a watch logs for
// each event it takes in, before the debounce.
func (s *served) requireNoWatch() {
	s.t.Helper()
	serving := s.logged("INFO", "serving")
	require.Len(s.t, serving, 1, "the serving line")
	require.Equal(s.t, false, serving[0]["watch"], "the serving line: %v", serving[0])
	require.Empty(s.t, s.logged("DEBUG", "change event"), "a server without the watch saw a change")
}

// digestOf is the plan digest a render of the profile text would vouch for.
func (s *served) digestOf(name string) string {
	s.t.Helper()
	o := s.opts.Render
	o.Profile = name
	p, err := overlay.Plan(o)
	require.NoError(s.t, err)
	return p.Digest()
}

// specIdentity says whether the spec file was rewritten: inode and mtime.
func specIdentity(t *testing.T, file string) string {
	t.Helper()
	info, err := os.Stat(file)
	require.NoError(t, err)
	return fmt.Sprintf("%v %v", info.Sys(), info.ModTime().UnixNano())
}

func TestUnchangedProfileWritesNothing(t *testing.T) {
	t.Parallel()
	s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitReady(http.StatusOK, 10*time.Second)
	first := s.waitSyncs(1)
	tree := overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true})
	spec := specIdentity(t, s.opts.Output)

	st := s.waitSyncs(5)
	require.Zero(t, st.Failures)
	require.Zero(t, st.Stats.Written()+st.Stats.DirsCreated+st.Stats.Removed, "%+v", st.Stats)
	require.Positive(t, st.Stats.FilesUnchanged)
	require.Equal(t, first.SpecWrites, st.SpecWrites, "no spec rewritten")
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true}), "after 5 resyncs")
	require.Equal(t, spec, specIdentity(t, s.opts.Output))
	t.Logf("FIGURES %d syncs of an unchanged profile: 0 files written, %d files and %d links unchanged, last sync %s",
		st.Syncs, st.Stats.FilesUnchanged, st.Stats.LinksUnchanged, st.Duration)

	// Negative control: the resyncs do compare. A file truncated behind
	// the server's back is written again by the next one.
	var victim string
	require.NoError(t, filepath.WalkDir(filepath.Join(s.opts.Render.Root, "sys/devices"), func(p string, d os.DirEntry, err error) error {
		if err == nil && victim == "" && d.Name() == "vendor" {
			victim = p
		}
		return err
	}))
	require.NotEmpty(t, victim)
	want, err := os.ReadFile(victim)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(victim, 0))
	podtest.Until(t, 5*time.Second, "the resync repairs "+victim, func() (bool, string) {
		b, err := os.ReadFile(victim)
		if err != nil {
			return false, err.Error()
		}
		return bytes.Equal(b, want), fmt.Sprintf("%q", b)
	})
	// The repair's sync may still be removing its staging directory: let
	// it end before walking the tree (later syncs change nothing).
	s.waitSyncs(1)
	require.NotEqual(t, tree, overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true}), "the repair wrote")
}

func TestConfigMapSwapRerenders(t *testing.T) {
	t.Parallel()
	t.Run("watch", func(t *testing.T) {
		t.Parallel()
		cm := newConfigMap(t, builtinText(t, "t4-vm"))
		// An hour's resync: only the watch can see the swap in time.
		s := start(t, cm, func(o *Options) { o.Resync = time.Hour })
		s.waitReady(http.StatusOK, 10*time.Second)
		require.Equal(t, s.digestOf("t4-vm"), s.srv.Status().Digest)
		// With an hour's resync, a render within the wait is the watch's
		// (the negative control below sees none without it). How soon it
		// began is a figure, not a limit: a shared machine under load
		// delays it by chance.
		var noticedMax time.Duration
		for i, name := range []string{"hgx-h100", "t4-vm", "hgx-h100"} {
			began := time.Now()
			cm.Swap(builtinText(t, name))
			want := s.digestOf(name)
			s.waitDigest(want, 30*time.Second, fmt.Sprintf("swap %d to %s rendered", i, name))
			took, render := time.Since(began), s.srv.Status().Duration
			noticed := took - render
			noticedMax = max(noticedMax, noticed)
			t.Logf("swap %d to %s: rendered %s after the swap; the sync took %s", i, name, took.Round(time.Millisecond), render.Round(time.Millisecond))
			s.waitReady(http.StatusOK, 30*time.Second)
			eff, err := os.ReadFile(filepath.Join(s.opts.Render.Root, plan.ProfileFile))
			require.NoError(t, err)
			require.Contains(t, string(eff), map[string]string{"t4-vm": "Tesla T4", "hgx-h100": "H100"}[name])
		}
		t.Logf("FIGURES 3 ConfigMap swaps, each render began within %s of the swap (debounce %s, resync 1h)", noticedMax.Round(time.Millisecond), DefaultDebounce)
	})
	t.Run("no watch: the swap waits for the resync", func(t *testing.T) {
		t.Parallel()
		// Negative control: without the watch the same swap goes unseen.
		// The barrier is a watching twin on the same volume: once it has
		// rendered the swap, the swap's events were queued for every watch
		// of the directory long before (its debounce, then its render), and
		// a watch logs each event it takes in ("change event") at once.
		cm := newConfigMap(t, builtinText(t, "t4-vm"))
		s := start(t, cm, func(o *Options) { o.Resync = time.Hour; o.NoWatch = true })
		twin := start(t, cm, func(o *Options) { o.Resync = time.Hour })
		s.waitReady(http.StatusOK, 10*time.Second)
		twin.waitReady(http.StatusOK, 10*time.Second)
		old := s.srv.Status().Digest
		cm.Swap(builtinText(t, "hgx-h100"))
		twin.waitDigest(s.digestOf("hgx-h100"), 30*time.Second, "the watching twin renders the swap")
		require.NotEmpty(t, twin.logged("DEBUG", "change event"), "the twin's watch saw the swap")
		s.requireNoWatch()
		require.Equal(t, old, s.srv.Status().Digest)
		require.Equal(t, 1, s.srv.Status().Syncs)
	})
	t.Run("no watch: the resync is the safety net", func(t *testing.T) {
		t.Parallel()
		cm := newConfigMap(t, builtinText(t, "t4-vm"))
		s := start(t, cm, func(o *Options) { o.Resync = 300 * time.Millisecond; o.NoWatch = true })
		s.waitReady(http.StatusOK, 10*time.Second)
		cm.Swap(builtinText(t, "hgx-h100"))
		s.waitDigest(s.digestOf("hgx-h100"), 30*time.Second, "the resync renders the swap")
	})
}

func TestBadProfileKeepsTheLastGoodTree(t *testing.T) {
	t.Parallel()
	bad, err := os.ReadFile(badProfile)
	require.NoError(t, err)
	cm := newConfigMap(t, builtinText(t, "t4-vm"))
	s := start(t, cm, func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitReady(http.StatusOK, 10*time.Second)
	s.waitSyncs(1)
	good := s.srv.Status().Digest
	tree := overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true})
	spec := specIdentity(t, s.opts.Output)

	cm.Swap(bad)
	notReadyIn := s.waitReady(http.StatusServiceUnavailable, 5*time.Second)
	_, body := s.probe(endpoints.ReadyzPath)
	for _, want := range []string{cm.File(), badField, badValue} {
		require.Contains(t, body, want)
	}
	st := s.waitSyncs(5)
	require.GreaterOrEqual(t, st.Failures, 5)
	require.Equal(t, good, st.Digest, "the last good render")
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true}), "the bad profile")
	require.Equal(t, spec, specIdentity(t, s.opts.Output))
	code, _ := s.probe(endpoints.HealthzPath)
	require.Equal(t, http.StatusOK, code, "a bad profile is not-ready, not unhealthy")
	select {
	case err := <-s.done:
		t.Fatalf("Run returned on a bad profile: %v", err)
	default:
	}
	errs := s.logs.Records(t, "ERROR")
	require.Len(t, errs, 1, "one line for %d failed syncs", st.Failures)
	line := fmt.Sprint(errs[0]["err"])
	for _, want := range []string{cm.File(), badField, badValue} {
		require.Contains(t, line, want)
	}

	// Fixed: ready again by itself, on the new profile.
	cm.Swap(builtinText(t, "hgx-h100"))
	readyIn := s.waitReady(http.StatusOK, 30*time.Second)
	require.Equal(t, s.digestOf("hgx-h100"), s.srv.Status().Digest)
	recovered := false
	for _, rec := range s.logs.Records(t, "INFO") {
		recovered = recovered || rec["msg"] == "recovered"
	}
	require.True(t, recovered)
	t.Logf("FIGURES bad profile: not ready within %s, %d failed syncs logged as 1 line, tree and spec untouched; fixed: ready within %s",
		notReadyIn.Round(time.Millisecond), st.Failures, readyIn.Round(time.Millisecond))
}

func TestBadProfileAtStartIsNotReady(t *testing.T) {
	t.Parallel()
	bad, err := os.ReadFile(badProfile)
	require.NoError(t, err)
	cm := newConfigMap(t, bad)
	s := start(t, cm, func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitSyncs(3)
	code, body := s.probe(endpoints.ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, badField)
	_, err = os.Stat(s.opts.Output)
	require.ErrorIs(t, err, os.ErrNotExist, "no spec before a good render: the gate")
	cm.Swap(builtinText(t, "t4-vm"))
	s.waitReady(http.StatusOK, 30*time.Second)
	_, err = os.Stat(s.opts.Output)
	require.NoError(t, err)
}

func TestReadyFollowsTheMarker(t *testing.T) {
	t.Parallel()
	// No watch: the first sync's own spec write is a change event, whose
	// sync, a beat later, would re-render the root under the render below
	// (seen, under load, as "no completion marker" at the probe).
	s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) { o.Resync, o.NoWatch = time.Hour, true })
	s.waitReady(http.StatusOK, 10*time.Second)
	// Another render of the same root, of another profile: the tree is no
	// longer the current profile's, and readyz says so.
	o := s.opts.Render
	o.Profile = "hgx-h100"
	_, _, err := overlay.Render(o)
	require.NoError(t, err)
	code, body := s.probe(endpoints.ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not the current profile's")
	s.srv.Sync(context.Background(), "test")
	s.waitReady(http.StatusOK, time.Second)
}

func TestStopLeavesTheTree(t *testing.T) {
	t.Parallel()
	s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), nil)
	s.waitReady(http.StatusOK, 10*time.Second)
	tree := overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true})
	began := time.Now()
	s.stop()
	select {
	case err := <-s.done:
		require.NoError(t, err)
		s.done <- err // for the cleanup
	case <-time.After(DefaultStopTimeout + 2*time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	t.Logf("FIGURES Run returned %s after its context ended", time.Since(began).Round(time.Millisecond))
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true}), "after the stop")
	_, err := os.Stat(s.opts.Output)
	require.NoError(t, err)
	_, err = http.Get(s.url + endpoints.HealthzPath)
	require.Error(t, err, "the endpoints are closed")
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]Options{
		"no spec target":    {Render: overlay.Options{Root: "/tmp/x"}},
		"relative root":     {Render: overlay.Options{Root: "x"}, Output: "/tmp/s.yaml"},
		"bad kind":          {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", Kind: "nokind"},
		"also-at depth":     {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", AlsoAt: []string{"/host/sys/bus/pci/devices"}},
		"container root /":  {Render: overlay.Options{Root: "/tmp/x", ContainerRoot: "/"}, Output: "/tmp/s.yaml"},
		"fleet and profile": {Render: overlay.Options{Root: "/tmp/x", Profile: "t4-vm"}, Output: "/tmp/s.yaml", Fleet: "/tmp/f.yaml", NodeName: "n"},
		"fleet, no node":    {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", Fleet: "/tmp/f.yaml"},
		"node, no fleet":    {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", NodeName: "n"},
		"kubeconfig alone":  {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", Kubeconfig: "/k"},
		"mirror, no fleet":  {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", FleetConfigMap: "ns/f"},
		"mirror elsewhere":  {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", Fleet: "/tmp/map.yaml", NodeName: "n", FleetConfigMap: "ns/f"},
		"mirror unnamed":    {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", Fleet: "/tmp/fleet.yaml", NodeName: "n", FleetConfigMap: "f"},
		"tree, no view":     {Render: overlay.Options{Root: "/tmp/x"}, Output: "/tmp/s.yaml", WritableTree: "/tmp/t"},
	} {
		_, err := New(o)
		require.Error(t, err, name)
	}
	s, err := New(Options{Output: "/tmp/s.yaml"})
	require.NoError(t, err)
	require.Nil(t, s.opts.NodeLabels, "no fleet map, no label watch")
	f, err := New(Options{Output: "/tmp/s.yaml", Fleet: "/tmp/fleet.yaml", NodeName: "n", FleetConfigMap: "ns/f"})
	require.NoError(t, err)
	require.Same(t, f.labelWatch, f.opts.NodeLabels, "a fleet map without a source of labels: the Node's, through the API")
	require.Equal(t, "ns/f", f.fleetConfigMap.String())
	require.Equal(t, endpoints.DefaultListen, s.opts.Listen)
	require.Equal(t, overlay.DefaultRoot, s.opts.Render.Root)
	require.Equal(t, DefaultResync, s.opts.Resync)
}

// merged says whether the spec in file serves root: a top-level mount of it
// at the container root, and no whole-/sys/devices mount left.
func merged(t *testing.T, file, root string) bool {
	t.Helper()
	s, err := cdispec.ReadSpec(file)
	require.NoError(t, err)
	ours, whole := false, false
	for _, m := range s.ContainerEdits.Mounts {
		ours = ours || (m.HostPath == root && m.ContainerPath == plan.DefaultContainerRoot)
		whole = whole || m.ContainerPath == cdispec.WholeDevicesDir
	}
	return ours && !whole
}

// waitMerged waits until the spec merged into serves the server's root.
func (s *served) waitMerged(within time.Duration) {
	s.t.Helper()
	podtest.Until(s.t, within, "merged into "+s.opts.MergeInto, func() (bool, string) {
		st := s.srv.Status()
		return merged(s.t, s.opts.MergeInto, s.opts.Render.Root), fmt.Sprintf("not merged after %d syncs (%d spec writes), last error %q", st.Syncs, st.SpecWrites, st.Err)
	})
}

// rewrite replaces file atomically, as another spec writer would.
func rewrite(t *testing.T, file string, data []byte) {
	t.Helper()
	tmp := file + ".tmp"
	require.NoError(t, os.WriteFile(tmp, data, 0o644))
	require.NoError(t, os.Rename(tmp, file))
}

func TestMergeIntoFollowsTheOtherWriter(t *testing.T) {
	t.Parallel()
	original, err := os.ReadFile("../cdispec/testdata/nvidia.yaml")
	require.NoError(t, err)
	setup := func(t *testing.T, o *Options) {
		o.MergeInto = filepath.Join(filepath.Dir(o.Output), "nvidia.yaml")
		o.Output = ""
		rewrite(t, o.MergeInto, original)
	}

	t.Run("watch", func(t *testing.T) {
		t.Parallel()
		s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) { setup(t, o); o.Resync = time.Hour })
		s.waitReady(http.StatusOK, 30*time.Second)
		require.True(t, merged(t, s.opts.MergeInto, s.opts.Render.Root))
		// nvml-mock's setup writes its spec again: merged again at once.
		began := time.Now()
		rewrite(t, s.opts.MergeInto, original)
		require.False(t, merged(t, s.opts.MergeInto, s.opts.Render.Root))
		s.waitMerged(5 * time.Second)
		t.Logf("FIGURES the rewritten spec merged again %s after the rewrite", time.Since(began).Round(time.Millisecond))
	})
	t.Run("no watch", func(t *testing.T) {
		t.Parallel()
		// Negative control: without the watch the rewrite stays unmerged.
		// The barrier is a watching twin whose spec lies in the same
		// directory and is rewritten after ours: inotify queues one
		// directory's events in order, so once the twin has merged its own
		// again, the event of ours was queued for any watch before it, and
		// a watch logs each event it takes in ("change event") at once.
		s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) { setup(t, o); o.Resync = time.Hour; o.NoWatch = true })
		s.waitReady(http.StatusOK, 30*time.Second)
		twin := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) {
			o.MergeInto = filepath.Join(filepath.Dir(s.opts.MergeInto), "twin.yaml")
			o.Output = ""
			rewrite(t, o.MergeInto, original)
			o.Resync = time.Hour
		})
		twin.waitReady(http.StatusOK, 30*time.Second)
		rewrite(t, s.opts.MergeInto, original)
		rewrite(t, twin.opts.MergeInto, original)
		twin.waitMerged(5 * time.Second)
		require.NotEmpty(t, twin.logged("DEBUG", "change event"), "the twin's watch saw its rewrite")
		s.requireNoWatch()
		require.False(t, merged(t, s.opts.MergeInto, s.opts.Render.Root))
	})
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		// The spec to merge into is not there yet: not ready, until it is.
		s := start(t, newConfigMap(t, builtinText(t, "t4-vm")), func(o *Options) {
			setup(t, o)
			require.NoError(t, os.Remove(o.MergeInto))
			o.Resync = time.Hour
		})
		s.waitFirstSync()
		code, body := s.probe(endpoints.ReadyzPath)
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "merge into "+s.opts.MergeInto)
		rewrite(t, s.opts.MergeInto, original)
		s.waitReady(http.StatusOK, 30*time.Second)
		require.True(t, merged(t, s.opts.MergeInto, s.opts.Render.Root))
	})
}

// TestStuckRenderAndStopTimeout holds the writer's own lock on the root, so
// a render waits: /healthz fails once it has waited StuckAfter, and a stop
// abandons it after StopTimeout instead of waiting for the lock.
func TestStuckRenderAndStopTimeout(t *testing.T) {
	t.Parallel()
	cm := newConfigMap(t, builtinText(t, "t4-vm"))
	s := start(t, cm, func(o *Options) {
		o.Resync = time.Hour
		o.StuckAfter = 300 * time.Millisecond
		o.StopTimeout = 500 * time.Millisecond
	})
	s.waitReady(http.StatusOK, 30*time.Second)
	lock := func() func() {
		fd, err := unix.Open(s.opts.Render.Root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Flock(fd, unix.LOCK_EX))
		return func() { require.NoError(t, unix.Close(fd)) }
	}

	unlock := lock()
	cm.Swap(builtinText(t, "hgx-h100"))
	podtest.WaitProbe(t, s.url+endpoints.HealthzPath, http.StatusServiceUnavailable, 10*time.Second)
	_, body := s.probe(endpoints.HealthzPath)
	require.Contains(t, body, "one sync has run for")
	unlock()
	podtest.WaitProbe(t, s.url+endpoints.HealthzPath, http.StatusOK, 30*time.Second)
	s.waitReady(http.StatusOK, 30*time.Second)
	require.Equal(t, s.digestOf("hgx-h100"), s.srv.Status().Digest)

	unlock = lock()
	syncs := s.srv.Status().Syncs
	cm.Swap(builtinText(t, "t4-vm"))
	// The render is under way and waits for the lock once /healthz says
	// one sync has run for StuckAfter.
	podtest.WaitProbe(t, s.url+endpoints.HealthzPath, http.StatusServiceUnavailable, 10*time.Second)
	began := time.Now()
	s.stop()
	require.NoError(t, <-s.done)
	took := time.Since(began)
	require.Less(t, took, 5*time.Second, "abandoned after StopTimeout, not after the lock timeout")
	require.GreaterOrEqual(t, took, s.opts.StopTimeout)
	unlock()
	// The abandoned render goes on in this process; let it end before the
	// temporary directories go.
	podtest.Until(t, 30*time.Second, "the abandoned render ends", func() (bool, string) {
		st := s.srv.Status()
		return st.Syncs > syncs, fmt.Sprintf("%d syncs, %d before the stop", st.Syncs, syncs)
	})
	s.done <- nil
	warned := false
	for _, rec := range s.logs.Records(t, "WARN") {
		warned = warned || strings.HasPrefix(fmt.Sprint(rec["msg"]), "stopping with a render in flight")
	}
	require.True(t, warned)
	t.Logf("FIGURES a render stuck on the lock: healthz 503 after StuckAfter; stop returned after %s (StopTimeout %s)", took.Round(time.Millisecond), s.opts.StopTimeout)
}

// typoProfile has one key nvml-mock's schema lacks: a typo of
// subsystem_id, which would otherwise render a default subsystem.
const typoProfile = "devices:\n  - index: 0\n    pci:\n      bus_id: \"0000:07:00.0\"\n      subsytem_id: 0x134F10DE\n      device_id: 0x20B010DE\n"

// An unknown key is logged with the render that read it, at warn level
// when the render changed the tree and at debug on a quiet resync; with
// Strict it fails the render: not ready, nothing written.
func TestUnknownKeysAreLoggedAndStrictRefusesThem(t *testing.T) {
	t.Parallel()
	s := start(t, newConfigMap(t, []byte(typoProfile)), func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitReady(http.StatusOK, 10*time.Second)
	s.waitSyncs(3)
	unknownKey := func(level string) int {
		n := 0
		for _, rec := range s.logs.Records(t, level) {
			if strings.HasPrefix(fmt.Sprint(rec["msg"]), "profile key nvml-mock does not know") {
				require.Contains(t, fmt.Sprint(rec["err"]), "devices[0].pci.subsytem_id: unknown key (line 5)")
				require.Contains(t, fmt.Sprint(rec["err"]), "nearest known key: subsystem_id")
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, unknownKey("WARN"), "once, with the first render")
	require.GreaterOrEqual(t, unknownKey("DEBUG"), 2, "again at debug with each quiet resync")

	strict := start(t, newConfigMap(t, []byte(typoProfile)), func(o *Options) {
		o.Resync = 50 * time.Millisecond
		o.Render.Strict = true
	})
	strict.waitSyncs(2)
	code, body := strict.probe(endpoints.ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "subsytem_id: unknown key")
	require.Contains(t, body, "--strict refuses keys nvml-mock does not know")
	_, err := os.Stat(strict.opts.Render.Root)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written")
	_, err = os.Stat(strict.opts.Output)
	require.ErrorIs(t, err, os.ErrNotExist, "no spec")
}

// Without a profile the server renders the built-in default, never (as
// render does) the root's own effective profile: the root follows the
// options, so a render of another profile in it is replaced.
func TestNoProfileIsTheDefaultNotTheRoots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "overlay")
	_, _, err := overlay.Render(overlay.Options{Profile: "t4-vm", Root: root, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	srv, err := New(Options{
		Render: overlay.Options{Root: root, Writer: writer.Options{SkipSync: true}},
		Output: filepath.Join(dir, "spec.yaml"),
		Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
	})
	require.NoError(t, err)
	srv.Sync(context.Background(), "test")
	st := srv.Status()
	require.Empty(t, st.Err)
	require.Equal(t, "built-in "+shipped.Default, st.Profile)
}

// fakeLabels is the node's labels as a test sets them: NodeLabels without
// an API server.
type fakeLabels struct {
	mu      sync.Mutex
	labels  map[string]string
	err     error
	calls   int
	changed chan struct{}
}

func newFakeLabels(labels map[string]string) *fakeLabels {
	return &fakeLabels{labels: labels, changed: make(chan struct{}, 1)}
}

func (f *fakeLabels) Labels(context.Context) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return maps.Clone(f.labels), f.err
}

func (f *fakeLabels) Changed() <-chan struct{} { return f.changed }

// set changes the labels, or their error, and signals as a watch would.
func (f *fakeLabels) set(labels map[string]string, err error) {
	f.mu.Lock()
	f.labels, f.err = labels, err
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *fakeLabels) called() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

const fleetKey = "fleet.yaml"

// startFleet serves node through the fleet map in the ConfigMap fleet, with
// labels as the node's labels; adjust changes the options further.
func startFleet(t *testing.T, fleet *podtest.ConfigMap, node string, labels NodeLabels, adjust func(*Options)) *served {
	t.Helper()
	return start(t, fleet, func(o *Options) {
		o.Render.Profile = ""
		o.Fleet, o.NodeName, o.NodeLabels = fleet.File(), node, labels
		if adjust != nil {
			adjust(o)
		}
	})
}

func newFleetMap(t *testing.T, text string) *podtest.ConfigMap {
	t.Helper()
	return podtest.NewConfigMap(t, filepath.Join(t.TempDir(), "fleet"), fleetKey, []byte(text))
}

// markerDigest is the plan digest the root's completion marker vouches for.
func (s *served) markerDigest() string {
	s.t.Helper()
	m, err := writer.ReadMarker(os.DirFS(s.opts.Render.Root))
	require.NoError(s.t, err)
	return m.Digest
}

// waitQuiet waits until no sync has run, or been running, for three
// debounces: the syncs that the last one set off (its own spec write is a
// change event) are over, so the next one has the cause the test gives.
func (s *served) waitQuiet() {
	s.t.Helper()
	quiet := 3 * s.srv.opts.Debounce
	podtest.Until(s.t, 30*time.Second, "no sync for "+quiet.String(), func() (bool, string) {
		before := s.srv.Status().Syncs
		time.Sleep(quiet)
		s.srv.mu.Lock()
		idle := s.srv.syncing.IsZero()
		s.srv.mu.Unlock()
		after := s.srv.Status().Syncs
		return idle && before == after, fmt.Sprintf("%d syncs, then %d (idle %v)", before, after, idle)
	})
}

// requireChangeIn requires a change event the watch took in for a name in
// dir: the watch, not a resync or another event, saw what the test did.
func (s *served) requireChangeIn(dir string) {
	s.t.Helper()
	for _, rec := range s.logged("DEBUG", "change event") {
		if filepath.Dir(fmt.Sprint(rec["name"])) == dir {
			return
		}
	}
	s.t.Fatalf("no change event in %s: %s", dir, s.logs.String())
}

// requireRendered requires a "rendered" line that names the node, the rule
// and the profile of the fleet map's choice.
func (s *served) requireRendered(node, rule, profile string) {
	s.t.Helper()
	var saw []string
	for _, rec := range s.logged("INFO", "rendered") {
		if rec["node"] == node && rec["rule"] == rule && rec["profile"] == profile {
			return
		}
		saw = append(saw, fmt.Sprintf("node=%v rule=%v profile=%v", rec["node"], rec["rule"], rec["profile"]))
	}
	s.t.Fatalf("no rendered line with node=%s rule=%s profile=%s; saw %v", node, rule, profile, saw)
}

// The map chooses by the node's name first, then by its labels, then the
// default; a change of the labels or of the map re-renders through the
// watch alone (the resync is an hour away).
func TestFleetChoosesAndFollowsTheLabelsAndTheMap(t *testing.T) {
	t.Parallel()
	h100 := newConfigMap(t, builtinText(t, "hgx-h100"))
	text := func(nodes string) string {
		return nodes + "labels:\n  - match:\n      nvml-mock/profile: h100\n    profile: " + h100.File() + "\ndefault: t4-vm\n"
	}
	fm := newFleetMap(t, text(""))
	labels := newFakeLabels(map[string]string{"kubernetes.io/os": "linux"})
	s := startFleet(t, fm, "worker-b", labels, func(o *Options) { o.Resync = time.Hour })

	s.waitReady(http.StatusOK, 30*time.Second)
	st := s.srv.Status()
	require.Equal(t, s.digestOf("t4-vm"), st.Digest)
	require.Equal(t, "default", st.Rule)
	s.requireRendered("worker-b", "default", "built-in t4-vm")
	serving := s.logged("INFO", "serving")
	require.Len(t, serving, 1)
	require.Equal(t, fm.File(), serving[0]["fleet"])
	require.Equal(t, "worker-b", serving[0]["node"])

	// A label: the label rule's profile file.
	s.waitQuiet()
	before := s.markerDigest()
	labels.set(map[string]string{"kubernetes.io/os": "linux", "nvml-mock/profile": "h100"}, nil)
	took := s.waitDigest(s.digestOf(h100.File()), 30*time.Second, "the label change rendered")
	s.waitReady(http.StatusOK, 30*time.Second)
	require.NotEqual(t, before, s.markerDigest(), "the marker vouches for the new plan")
	require.Equal(t, "labels[0] {nvml-mock/profile=h100}", s.srv.Status().Rule)
	s.requireRendered("worker-b", "labels[0] {nvml-mock/profile=h100}", h100.File())
	require.NotEmpty(t, s.logged("DEBUG", "node labels changed"))
	t.Logf("FIGURES a label change rendered %s after it (debounce %s, resync 1h)", took.Round(time.Millisecond), DefaultDebounce)

	// The map names the node: its name beats its labels.
	s.waitQuiet()
	fm.Swap([]byte(text("nodes:\n  worker-b: t4-vm\n")))
	s.waitDigest(s.digestOf("t4-vm"), 30*time.Second, "the map's swap rendered")
	s.waitReady(http.StatusOK, 30*time.Second)
	s.requireChangeIn(fm.Dir)
	require.Equal(t, "nodes[worker-b]", s.srv.Status().Rule)
	s.requireRendered("worker-b", "nodes[worker-b]", "built-in t4-vm")
}

// The chosen profile file is watched where it lies, beside the map or not;
// once the map chooses another, its directory is no longer watched.
func TestFleetFollowsTheChosenProfile(t *testing.T) {
	t.Parallel()
	prof := newConfigMap(t, builtinText(t, "t4-vm"))
	fm := newFleetMap(t, "default: "+prof.File()+"\n")
	s := startFleet(t, fm, "worker-a", nil, func(o *Options) { o.Resync = time.Hour })
	s.waitReady(http.StatusOK, 30*time.Second)
	require.Equal(t, s.digestOf(prof.File()), s.srv.Status().Digest)

	// The other ConfigMap, the profile's, changes.
	s.waitQuiet()
	prof.Swap(builtinText(t, "hgx-h100"))
	s.waitDigest(s.digestOf(prof.File()), 30*time.Second, "the chosen profile's swap rendered")
	s.waitReady(http.StatusOK, 30*time.Second)
	s.requireChangeIn(prof.Dir)
	s.requireRendered("worker-a", "default", prof.File())

	// A built-in now: nothing of the profile's to watch.
	s.waitQuiet()
	fm.Swap([]byte("default: t4-vm\n"))
	s.waitDigest(s.digestOf("t4-vm"), 30*time.Second, "the map's swap to a built-in rendered")
	s.requireChangeIn(fm.Dir)
	podtest.Until(t, 5*time.Second, "the profile's directory unwatched", func() (bool, string) {
		for _, rec := range s.logged("DEBUG", "no longer watching") {
			if rec["dir"] == prof.Dir {
				return true, ""
			}
		}
		return false, s.logs.String()
	})
}

// A node the map gives no profile is not ready, and says why in one line,
// logged once however many syncs fail; the map's fix serves it.
func TestFleetNoMatchIsNotReady(t *testing.T) {
	t.Parallel()
	fm := newFleetMap(t, "nodes:\n  worker-a: t4-vm\nlabels:\n  - match: {nvml-mock/profile: gb200}\n    profile: gb200.yaml\n")
	labels := newFakeLabels(map[string]string{"nvml-mock/profile": "h100"})
	s := startFleet(t, fm, "worker-c", labels, func(o *Options) { o.Resync = 50 * time.Millisecond })
	st := s.waitSyncs(5)
	require.Equal(t, st.Syncs, st.Failures)
	want := "fleet map " + fm.File() + ": node worker-c matches no rule and the map has no default"
	code, body := s.probe(endpoints.ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, want, strings.TrimSpace(body))
	errs := s.logs.Records(t, "ERROR")
	require.Len(t, errs, 1, "one line for %d failed syncs", st.Failures)
	require.Equal(t, want, errs[0]["err"])
	require.Equal(t, "worker-c", errs[0]["node"])
	_, err := os.Stat(s.opts.Output)
	require.ErrorIs(t, err, os.ErrNotExist, "no spec for a node the map does not serve")
	code, _ = s.probe(endpoints.HealthzPath)
	require.Equal(t, http.StatusOK, code, "not served is not-ready, not unhealthy")

	fm.Swap([]byte("nodes:\n  worker-a: t4-vm\ndefault: t4-vm\n"))
	s.waitReady(http.StatusOK, 30*time.Second)
	require.Equal(t, "default", s.srv.Status().Rule)
	require.Len(t, s.logged("INFO", "recovered"), 1)
}

// A bad map, at start or later, is a failed sync like a bad profile: the
// last good tree stays, and the map's error names the file and the field.
func TestFleetBadMapKeepsTheLastGoodTree(t *testing.T) {
	t.Parallel()
	fm := newFleetMap(t, "nodes:\n  worker-a:\n")
	s := startFleet(t, fm, "worker-a", nil, func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitSyncs(2)
	_, body := s.probe(endpoints.ReadyzPath)
	require.Contains(t, body, "fleet map "+fm.File()+": nodes.worker-a: empty profile")

	fm.Swap([]byte("nodes:\n  worker-a: t4-vm\n"))
	s.waitReady(http.StatusOK, 30*time.Second)
	good := s.srv.Status().Digest
	tree := overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true})

	fm.Swap([]byte("nodez:\n  worker-a: hgx-h100\n"))
	s.waitReady(http.StatusServiceUnavailable, 10*time.Second)
	_, body = s.probe(endpoints.ReadyzPath)
	require.Contains(t, body, `unknown field "nodez"`)
	require.Contains(t, body, fm.File())
	st := s.waitSyncs(2)
	require.Equal(t, good, st.Digest)
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, s.opts.Render.Root, overlaytest.SnapshotOptions{Identity: true}), "the bad map")
}

// Sync alone, without Run or a watch, reads the map afresh each time: a map
// rewritten in place, as a plain file, is followed.
func TestFleetSyncRereadsTheMap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, fleetKey)
	require.NoError(t, os.WriteFile(file, []byte("nodes:\n  worker-a: t4-vm\n"), 0o644))
	// Labels that cannot be read: Sync without Run starts no real watch.
	labels := newFakeLabels(nil)
	labels.err = errors.New("no labels here")
	srv, err := New(Options{
		Render:     overlay.Options{Root: filepath.Join(dir, "overlay"), Writer: writer.Options{SkipSync: true}},
		Fleet:      file,
		NodeName:   "worker-a",
		NodeLabels: labels,
		Output:     filepath.Join(dir, "spec.yaml"),
		Logger:     slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
	})
	require.NoError(t, err)
	srv.Sync(context.Background(), "test")
	require.NoError(t, srv.Ready())
	require.Equal(t, "built-in t4-vm", srv.Status().Profile)

	require.NoError(t, os.WriteFile(file, []byte("nodes:\n  worker-a: hgx-h100\n"), 0o644))
	srv.Sync(context.Background(), "test")
	require.NoError(t, srv.Ready())
	require.Equal(t, "built-in hgx-h100", srv.Status().Profile)
	require.Equal(t, "nodes[worker-a]", srv.Status().Rule)

	// Label rules whose labels cannot be read: a failed sync that says so.
	require.Zero(t, labels.called(), "a map without label rules reads no labels")
	require.NoError(t, os.WriteFile(file, []byte("labels:\n  - match: {a: b}\n    profile: t4-vm\n"), 0o644))
	srv.Sync(context.Background(), "test")
	require.ErrorContains(t, srv.Ready(), "has label rules: no labels here")
}

// A map without label rules never asks for the labels: serve with it needs
// no API server and no RBAC. A map with them fails its sync while the
// labels cannot be read, and says why.
func TestFleetReadsLabelsOnlyForLabelRules(t *testing.T) {
	t.Parallel()
	labels := newFakeLabels(nil)
	s := startFleet(t, newFleetMap(t, "nodes:\n  worker-a: t4-vm\ndefault: t4-vm\n"), "worker-a", labels, func(o *Options) { o.Resync = 50 * time.Millisecond })
	s.waitReady(http.StatusOK, 30*time.Second)
	s.waitSyncs(3)
	require.Zero(t, labels.called())

	// A node the map names needs no labels either, though the map has
	// label rules for others.
	named := newFakeLabels(nil)
	named.err = fmt.Errorf("no API server here")
	n := startFleet(t, newFleetMap(t, "nodes:\n  worker-a: t4-vm\nlabels:\n  - match: {a: b}\n    profile: hgx-h100\n"), "worker-a", named, func(o *Options) { o.Resync = 50 * time.Millisecond })
	n.waitReady(http.StatusOK, 30*time.Second)
	n.waitSyncs(3)
	require.Zero(t, named.called())

	denied := newFakeLabels(nil)
	denied.err = fmt.Errorf(`labels of node worker-a: nodes is forbidden`)
	d := startFleet(t, newFleetMap(t, "labels:\n  - match: {a: b}\n    profile: t4-vm\ndefault: t4-vm\n"), "worker-a", denied, func(o *Options) { o.Resync = time.Hour })
	d.waitFirstSync()
	_, body := d.probe(endpoints.ReadyzPath)
	require.Contains(t, body, "has label rules: labels of node worker-a: nodes is forbidden")
	denied.set(nil, nil)
	d.waitReady(http.StatusOK, 30*time.Second)
}
