package serve

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/apiwatch"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/kubeclient"
)

// FleetMirror keeps a directory holding the keys of the fleet ConfigMap
// (fleet.yaml and the profiles beside it) as files, read and watched
// through the API: serve's --fleet names the map in that directory, and
// serve follows it as it follows a mounted ConfigMap (its change events),
// without waiting for the kubelet's ConfigMap sync (39 to 60 s after the
// update, in the fleet suite's runs).
//
// Each file is replaced whole (renameio), the profiles before the map, so
// a sync mid-update reads a map whose profiles are there. A key gone from
// the ConfigMap is removed; a ConfigMap deleted leaves the files as they
// were (the last map serves on), and the log says so.
//
// It removes only files it wrote: the keys it wrote are listed in
// MirrorManifest in the same directory, so a key gone is removed after a
// restart too, and nothing else in the directory is ever touched.
type FleetMirror struct {
	client kubernetes.Interface
	name   types.NamespacedName
	dir    string
	log    *slog.Logger

	once   sync.Once
	synced chan struct{} // closed after the first write (or a first list with no ConfigMap)
	mu     sync.Mutex
	err    error // the last write's failure
}

// MirrorManifest lists, one a line, the keys the fleet mirror wrote as
// files beside it. No ConfigMap key can be its name: the API server
// refuses a key that starts with ".." (validation.IsConfigMapKey), which
// is why the kubelet's own ..data is named so.
const MirrorManifest = "..nvml-mock-sysfs-mirrored"

// NewFleetMirror mirrors the ConfigMap name into dir, which it creates
// now, so that serve watches it from its start.
func NewFleetMirror(client kubernetes.Interface, name types.NamespacedName, dir string, log *slog.Logger) (*FleetMirror, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &FleetMirror{client: client, name: name, dir: dir, log: log, synced: make(chan struct{})}, nil
}

// startAPIWatches starts what Options.Fleet reads through the API, until
// ctx ends: the label watch New made, and the mirror of
// Options.FleetConfigMap, whose first write it waits for (at most
// DefaultNodeListTimeout) so that the first sync reads the map. A mirror
// that does not come in time leaves serve not ready, and its write a
// change event. The error, a mirror that cannot be made, names the flag.
func (s *Server) startAPIWatches(ctx context.Context) error {
	if s.labelWatch != nil {
		// It connects only when a map with label rules asks for labels.
		go s.labelWatch.Run(ctx)
	}
	if s.opts.FleetConfigMap == "" {
		return nil
	}
	m, err := func() (*FleetMirror, error) {
		client, err := kubeclient.Typed(s.opts.Kubeconfig)
		if err != nil {
			return nil, err
		}
		return NewFleetMirror(client, s.fleetConfigMap, filepath.Dir(s.opts.Fleet), s.log)
	}()
	if err != nil {
		return fmt.Errorf("--fleet-configmap %s: %w", s.opts.FleetConfigMap, err)
	}
	go m.Run(ctx)
	if err := m.Wait(ctx, DefaultNodeListTimeout); err != nil {
		s.log.Error("no fleet map from the API server yet", "err", err)
	}
	return nil
}

// Run mirrors until ctx ends.
func (m *FleetMirror) Run(ctx context.Context) {
	inf := apiwatch.ConfigMap(m.client, m.name)
	changed := func(obj any) {
		// The field selector is the API server's to apply.
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == m.name.Namespace && cm.Name == m.name.Name {
			m.write(cm)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == m.name.Namespace && cm.Name == m.name.Name {
				m.log.Error("fleet ConfigMap deleted; the last map it held serves on", "configmap", m.name.String())
			}
		},
	})
	go inf.RunWithContext(ctx)
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		select {
		case <-m.synced: // written already
		default:
			m.log.Error("no fleet ConfigMap yet; serve has no map until it is made", "configmap", m.name.String())
			m.once.Do(func() { close(m.synced) })
		}
	}
	<-ctx.Done()
}

// Wait waits, at most timeout, for the first write, so that serve's first
// sync reads the map; it returns why it did not come.
func (m *FleetMirror) Wait(ctx context.Context, timeout time.Duration) error {
	select {
	case <-m.synced:
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("fleet ConfigMap %s: not read from the API server in %s", m.name, timeout)
	}
}

// write makes dir hold cm's data, the map last.
func (m *FleetMirror) write(cm *corev1.ConfigMap) {
	err := m.writeKeys(cm.Data)
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
	if err != nil {
		m.log.Error("cannot write the fleet ConfigMap's keys; the last ones written serve on", "configmap", m.name.String(), "dir", m.dir, "err", err)
	} else {
		m.log.Debug("fleet ConfigMap written", "configmap", m.name.String(), "dir", m.dir, "resource_version", cm.ResourceVersion)
	}
	m.once.Do(func() { close(m.synced) })
}

// writeKeys writes data's keys as files, the map last, then removes the
// files of keys it wrote before that data no longer has. The manifest
// lists both while the files change, so a kill at any moment leaves no
// file it wrote unlisted.
func (m *FleetMirror) writeKeys(data map[string]string) error {
	wrote, err := m.mirrored()
	if err != nil {
		return err
	}
	keys := slices.Sorted(maps.Keys(data))
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == fleet.ConfigMapKey })
	if _, ok := data[fleet.ConfigMapKey]; ok {
		keys = append(keys, fleet.ConfigMapKey)
	}
	if err := m.writeManifest(slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(keys), wrote...))))); err != nil {
		return err
	}
	for _, k := range keys {
		// The API server allows [-._a-zA-Z0-9]+ as a key: a file
		// name, never a path; "." and ".." it refuses.
		if err := renameio.WriteFile(filepath.Join(m.dir, k), []byte(data[k]), 0o644); err != nil {
			return err
		}
	}
	var errs []error
	for _, k := range wrote {
		if _, ok := data[k]; !ok {
			if err := os.Remove(filepath.Join(m.dir, k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return m.writeManifest(slices.Sorted(slices.Values(keys)))
}

// mirrored are the keys the manifest lists: none when there is none yet.
// A line that is no key's name (the file edited by hand) is refused, as
// the mirror never removes a path outside its directory.
func (m *FleetMirror) mirrored() ([]string, error) {
	file := filepath.Join(m.dir, MirrorManifest)
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for i, k := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		switch {
		case k == "":
			continue
		case len(validation.IsConfigMapKey(k)) > 0:
			return nil, fmt.Errorf("%s: line %d: %q: not a ConfigMap key: %s", file, i+1, k, strings.Join(validation.IsConfigMapKey(k), "; "))
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func (m *FleetMirror) writeManifest(keys []string) error {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "\n")
	}
	return renameio.WriteFile(filepath.Join(m.dir, MirrorManifest), []byte(b.String()), 0o644)
}
