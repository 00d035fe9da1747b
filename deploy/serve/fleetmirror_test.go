package serve

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

// dirFiles are the regular files of dir and their contents, the mirror's
// manifest left out; one the mirror removes while they are read is left
// out too.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		if e.Name() == MirrorManifest || !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		out[e.Name()] = string(data)
	}
	return out
}

// mirror is a FleetMirror running until stop or the test's end, its log
// kept.
type mirror struct {
	*FleetMirror
	logs *podtest.Log
	stop func()
}

func runMirror(t *testing.T, c kubernetes.Interface, name types.NamespacedName, dir string) mirror {
	t.Helper()
	logs := &podtest.Log{}
	m, err := NewFleetMirror(c, name, dir, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	require.NoError(t, m.Wait(ctx, 10*time.Second))
	return mirror{FleetMirror: m, logs: logs, stop: stop}
}

// logged reports whether the mirror logged msg at level.
func (m mirror) logged(t *testing.T, level, msg string) bool {
	for _, rec := range m.logs.Records(t, level) {
		if rec["msg"] == msg {
			return true
		}
	}
	return false
}

// written is how many times the mirror has written the keys.
func (m mirror) written(t *testing.T) int {
	n := 0
	for _, rec := range m.logs.Records(t, "DEBUG") {
		if rec["msg"] == "fleet ConfigMap written" {
			n++
		}
	}
	return n
}

// TestFleetMirror: the directory holds the ConfigMap's keys from the first
// Wait, follows each update (a key gone is removed), and keeps the last
// keys when the ConfigMap is deleted: the mirror logs the deletion, and
// only then is the directory judged unchanged.
func TestFleetMirror(t *testing.T) {
	name := types.NamespacedName{Namespace: "nvml-mock", Name: "nvml-mock-sysfs-fleet"}
	data := map[string]string{"fleet.yaml": "default: gb200.yaml\n", "gb200.yaml": "version: \"1.0\"\n"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}, Data: data}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: "another"}, Data: map[string]string{"x.yaml": "x"}}
	c := fake.NewSimpleClientset(cm, other)
	dir := filepath.Join(t.TempDir(), "fleet")
	m := runMirror(t, c, name, dir)
	require.Equal(t, data, dirFiles(t, dir))

	ctx := context.Background()
	updated := map[string]string{"fleet.yaml": "default: t4-vm\n", "h100.yaml": "version: \"1.0\"\n"}
	cm = cm.DeepCopy()
	cm.Data = updated
	_, err := c.CoreV1().ConfigMaps(name.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return maps.Equal(updated, dirFiles(t, dir)) }, 10*time.Second, 10*time.Millisecond, "%v", dirFiles(t, dir))

	require.NoError(t, c.CoreV1().ConfigMaps(name.Namespace).Delete(ctx, name.Name, metav1.DeleteOptions{}))
	// The window is judged once the mirror has seen the deletion, never
	// before: a wait alone passes whether or not the event came.
	require.Eventually(t, func() bool { return m.logged(t, "ERROR", "fleet ConfigMap deleted; the last map it held serves on") },
		10*time.Second, 10*time.Millisecond, "the mirror saw the deletion")
	require.Equal(t, updated, dirFiles(t, dir), "the last map serves on")
}

// TestFleetMirrorRemovesOnlyWhatItWrote: --fleet's directory may hold
// files of someone else's; the mirror removes a key gone from the
// ConfigMap, and never a file it did not write, also after a restart that
// missed the update which dropped the key.
func TestFleetMirrorRemovesOnlyWhatItWrote(t *testing.T) {
	name := types.NamespacedName{Namespace: "nvml-mock", Name: "nvml-mock-sysfs-fleet"}
	data := map[string]string{"fleet.yaml": "default: gb200.yaml\n", "gb200.yaml": "version: \"1.0\"\n", "h100.yaml": "version: \"1.0\"\n"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}, Data: data}
	c := fake.NewSimpleClientset(cm)
	dir := filepath.Join(t.TempDir(), "fleet")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	foreign := map[string]string{"README": "the operator's notes\n", "local.yaml": "version: \"1.0\"\n"}
	for f, text := range foreign {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644))
	}
	withForeign := func(keys map[string]string) map[string]string {
		out := maps.Clone(keys)
		maps.Copy(out, foreign)
		return out
	}

	m := runMirror(t, c, name, dir)
	require.Equal(t, withForeign(data), dirFiles(t, dir))

	ctx := context.Background()
	update := func(data map[string]string) {
		t.Helper()
		cm = cm.DeepCopy()
		cm.Data = data
		_, err := c.CoreV1().ConfigMaps(name.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	dropped := maps.Clone(data)
	delete(dropped, "gb200.yaml")
	before := m.written(t)
	update(dropped)
	require.Eventually(t, func() bool { return m.written(t) > before }, 10*time.Second, 10*time.Millisecond, "the mirror wrote the update")
	require.Equal(t, withForeign(dropped), dirFiles(t, dir), "gb200.yaml removed, the files it did not write kept")

	// A restart that missed an update: the manifest still names the key
	// the mirror wrote, so the new mirror removes it.
	m.stop()
	missed := maps.Clone(dropped)
	delete(missed, "h100.yaml")
	update(missed)
	runMirror(t, c, name, dir)
	require.Equal(t, withForeign(missed), dirFiles(t, dir), "h100.yaml removed after the restart, the files it did not write kept")
	manifest, err := os.ReadFile(filepath.Join(dir, MirrorManifest))
	require.NoError(t, err)
	require.Equal(t, "fleet.yaml\n", string(manifest))
}

// TestFleetMirrorRefusesABadManifest: a manifest line that is no
// ConfigMap key (edited by hand to name a path) is refused, in one line
// naming the file, the line and the value, and nothing is removed.
func TestFleetMirrorRefusesABadManifest(t *testing.T) {
	name := types.NamespacedName{Namespace: "nvml-mock", Name: "fleet"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}, Data: map[string]string{"fleet.yaml": "default: t4-vm\n"}}
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "keep")
	require.NoError(t, os.WriteFile(outside, []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, MirrorManifest), []byte("fleet.yaml\n../"+filepath.Base(filepath.Dir(outside))+"/keep\n"), 0o644))
	m, err := NewFleetMirror(fake.NewSimpleClientset(cm), name, dir, slog.New(slog.NewTextHandler(&podtest.Log{}, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	err = m.Wait(ctx, 10*time.Second)
	require.ErrorContains(t, err, filepath.Join(dir, MirrorManifest)+`: line 2: "../`)
	require.ErrorContains(t, err, "not a ConfigMap key")
	require.FileExists(t, outside)
}
