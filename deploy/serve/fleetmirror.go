package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/apiwatch"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
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
	err := func() error {
		keys := slices.Sorted(maps.Keys(cm.Data))
		keys = slices.DeleteFunc(keys, func(k string) bool { return k == fleet.ConfigMapKey })
		if _, ok := cm.Data[fleet.ConfigMapKey]; ok {
			keys = append(keys, fleet.ConfigMapKey)
		}
		for _, k := range keys {
			// The API server allows [-._a-zA-Z0-9]+ as a key: a file
			// name, never a path; "." and ".." it refuses.
			if err := renameio.WriteFile(filepath.Join(m.dir, k), []byte(cm.Data[k]), 0o644); err != nil {
				return err
			}
		}
		entries, err := os.ReadDir(m.dir)
		if err != nil {
			return err
		}
		var errs []error
		for _, e := range entries {
			if _, ok := cm.Data[e.Name()]; !ok && e.Type().IsRegular() {
				errs = append(errs, os.Remove(filepath.Join(m.dir, e.Name())))
			}
		}
		return errors.Join(errs...)
	}()
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
