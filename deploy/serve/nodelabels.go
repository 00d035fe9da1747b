package serve

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NodeLabels is where a fleet map's label rules read the node's labels.
type NodeLabels interface {
	// Labels returns the node's labels as last seen.
	Labels(ctx context.Context) (map[string]string, error)
	// Changed receives when the labels (or whether they can be read) may
	// have changed: the server then syncs, debounced like a file change.
	Changed() <-chan struct{}
}

// Timings of NodeLabelWatch.
const (
	// DefaultNodeListTimeout bounds one list of the node, so a sync that
	// waits for the first one never waits on a dead API server for long.
	DefaultNodeListTimeout = 30 * time.Second
	// DefaultNodeWatchRetry is the first wait before a list or watch is
	// tried again, doubled after each failure up to MaxNodeWatchRetry. A
	// watch the API server ends in the ordinary way (its timeout) is
	// listed and watched again at once: the list catches up on anything
	// the gap missed.
	DefaultNodeWatchRetry = time.Second
	MaxNodeWatchRetry     = 30 * time.Second
	// nodeWatchTimeout asks the API server to end each watch after this
	// long, so a watch that died silently (a dropped connection no one
	// reset) is replaced within it.
	nodeWatchTimeout = 5 * time.Minute
)

// NodeLabelWatch is the real NodeLabels: one Node's labels, listed from the
// API server and then kept by a watch of that Node alone (field selector
// metadata.name=<node>), listed and watched again whenever the watch ends
// or fails. It reads object metadata only (client-go's metadata client),
// which carries the labels without the Node's status, and keeps the
// binary small: the typed clients link every API group's types.
//
// RBAC: the downward API gives a pod its spec.nodeName but never the
// Node's labels, so label rules need a read of the Node: the service
// account needs get, list and watch on nodes (a ClusterRole; list and watch
// are what this calls). A map without label rules needs none of it: the
// watch starts at the first call of Labels, which the server makes only
// for a map with label rules that does not name the node, so serve with
// any other map never talks to the API server.
type NodeLabelWatch struct {
	node    string
	connect func() (metadata.ResourceInterface, error)
	log     *slog.Logger
	// listTimeout and retry are DefaultNodeListTimeout and
	// DefaultNodeWatchRetry; tests shorten them.
	listTimeout time.Duration
	retry       time.Duration

	wanted     chan struct{} // closed by the first Labels: Run may connect
	wantedOnce sync.Once
	answered   chan struct{} // closed once the first list has answered or failed
	answerOnce sync.Once
	changed    chan struct{}

	mu     sync.Mutex
	labels map[string]string
	listed bool  // labels hold the API server's answer (once true, stays true)
	err    error // why the labels cannot be read; nil once they can
}

// NewNodeLabelWatch watches node's labels through kubeconfig's API
// server, or the pod's own (rest.InClusterConfig) when kubeconfig is
// empty. Nothing connects before Run runs and Labels is first called.
func NewNodeLabelWatch(node, kubeconfig string, log *slog.Logger) *NodeLabelWatch {
	return newNodeLabelWatch(node, func() (metadata.ResourceInterface, error) { return nodeClient(kubeconfig) }, log)
}

func newNodeLabelWatch(node string, connect func() (metadata.ResourceInterface, error), log *slog.Logger) *NodeLabelWatch {
	if log == nil {
		log = slog.Default()
	}
	return &NodeLabelWatch{
		node: node, connect: connect, log: log,
		listTimeout: DefaultNodeListTimeout, retry: DefaultNodeWatchRetry,
		wanted: make(chan struct{}), answered: make(chan struct{}), changed: make(chan struct{}, 1),
	}
}

// nodeClient is the metadata client of nodes. kubeconfig names the file
// when given; otherwise the pod's service account is used.
func nodeClient(kubeconfig string) (metadata.ResourceInterface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("in-cluster API config (give a kubeconfig outside a pod): %w", err)
	}
	cfg.UserAgent = "nvml-mock-sysfs"
	c, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return c.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}), nil
}

// Changed receives, at most one pending at a time, when the labels or
// their error changed.
func (w *NodeLabelWatch) Changed() <-chan struct{} { return w.changed }

// Labels returns the node's labels. The first call starts the watch and
// waits for its first list (at most the list timeout, or ctx); later calls
// return what the watch last saw at once. Once listed, the labels stay
// served through an API server outage: the last ones seen are the best
// guess, and a blip must not take the node's tree away.
func (w *NodeLabelWatch) Labels(ctx context.Context) (map[string]string, error) {
	w.wantedOnce.Do(func() { close(w.wanted) })
	select {
	case <-w.answered:
	case <-ctx.Done():
		return nil, fmt.Errorf("labels of node %s: %w", w.node, ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	return maps.Clone(w.labels), nil
}

// Run keeps the labels current until ctx ends; it connects only once
// Labels has been called.
func (w *NodeLabelWatch) Run(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-w.wanted:
	}
	// failures counts the tries in a row that failed, or whose watch ended
	// soon after it began: each doubles the wait before the next.
	failures := 0
	var nodes metadata.ResourceInterface
	for {
		if failures > 0 {
			wait := min(w.retry<<min(failures-1, 16), MaxNodeWatchRetry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		if nodes == nil {
			var err error
			if nodes, err = w.connect(); err != nil {
				w.failed(err)
				failures++
				continue
			}
		}
		rv, err := w.list(ctx, nodes)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.failed(err)
			failures++
			continue
		}
		began := time.Now()
		err = w.follow(ctx, nodes, rv)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			w.log.Warn("node watch failed; listing again", "node", w.node, "err", err)
		case time.Since(began) < MaxNodeWatchRetry:
			failures++
			w.log.Debug("node watch ended early; listing again", "node", w.node)
		default:
			// The API server's ordinary end of a watch: list again at once.
			failures = 0
			w.log.Debug("node watch ended; listing again", "node", w.node)
		}
	}
}

// list reads the node and returns the resource version to watch from.
func (w *NodeLabelWatch) list(ctx context.Context, nodes metadata.ResourceInterface) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, w.listTimeout)
	defer cancel()
	l, err := nodes.List(ctx, metav1.ListOptions{FieldSelector: w.selector()})
	if err != nil {
		return "", err
	}
	for _, n := range l.Items {
		if n.Name == w.node {
			w.set(n.Labels, nil)
			return l.ResourceVersion, nil
		}
	}
	w.set(nil, fmt.Errorf("node %s: no such Node in the API server", w.node))
	return l.ResourceVersion, nil
}

// follow applies the watch's events until it ends; it returns why it
// failed, or nil for an ordinary end.
func (w *NodeLabelWatch) follow(ctx context.Context, nodes metadata.ResourceInterface, rv string) error {
	timeout := int64(nodeWatchTimeout / time.Second)
	wi, err := nodes.Watch(ctx, metav1.ListOptions{
		FieldSelector: w.selector(), ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout,
	})
	if err != nil {
		return err
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if n, ok := ev.Object.(*metav1.PartialObjectMetadata); ok && n.Name == w.node {
					w.set(n.Labels, nil)
				}
			case watch.Deleted:
				w.set(nil, fmt.Errorf("node %s: the Node was deleted", w.node))
			case watch.Error:
				// 410 Gone among them: the version is too old to watch
				// from, and the list in between brings a new one.
				return apierrors.FromObject(ev.Object)
			}
		}
	}
}

func (w *NodeLabelWatch) selector() string {
	return fields.OneTermEqualSelector("metadata.name", w.node).String()
}

// failed records a list that failed. Before any list succeeded, Labels
// returns the error; after, the labels last seen stay served, and the
// error goes to the log only.
func (w *NodeLabelWatch) failed(err error) {
	err = fmt.Errorf("labels of node %s: %w", w.node, err)
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		err = fmt.Errorf("%w (a fleet map's label rules need get, list and watch on nodes for serve's service account)", err)
	}
	w.mu.Lock()
	listed := w.listed
	w.mu.Unlock()
	if listed {
		w.log.Warn("cannot read the node's labels; keeping the last ones seen", "node", w.node, "err", err)
		return
	}
	w.set(nil, err)
}

// set records what a list or an event said, and signals Changed when it
// differs from what was known.
func (w *NodeLabelWatch) set(labels map[string]string, err error) {
	w.mu.Lock()
	same := w.answeredOnce() && maps.Equal(w.labels, labels) && errText(w.err) == errText(err)
	w.labels, w.err = maps.Clone(labels), err
	w.listed = w.listed || err == nil
	w.mu.Unlock()
	w.answerOnce.Do(func() { close(w.answered) })
	if same {
		return
	}
	select {
	case w.changed <- struct{}{}:
	default: // one pending signal is enough: the sync reads the latest
	}
}

func (w *NodeLabelWatch) answeredOnce() bool {
	select {
	case <-w.answered:
		return true
	default:
		return false
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
