package serve

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/kubeclient"
)

// NodeLabels is where a fleet map's label rules read the node's labels.
type NodeLabels interface {
	// Labels returns the node's labels as last seen.
	Labels(ctx context.Context) (map[string]string, error)
	// Changed receives when the labels (or whether they can be read) may
	// have changed: the server then syncs, debounced like a file change.
	Changed() <-chan struct{}
}

// DefaultNodeListTimeout bounds one list of the node, so a sync that waits
// for the first one never waits on a dead API server for long.
const DefaultNodeListTimeout = 30 * time.Second

// NodeLabelWatch is the real NodeLabels: one Node's labels, kept by
// client-go's informer over a list and watch of that Node alone (field
// selector metadata.name=<node>); the informer lists and watches again,
// with its own backoff, whenever the watch ends or fails. It reads object
// metadata only (client-go's metadata client), which carries the labels
// without the Node's status, and keeps the binary small: the typed
// clients, and metadatainformer which imports them, link every API
// group's types.
//
// RBAC: the downward API gives a pod its spec.nodeName but never the
// Node's labels, so label rules need a read of the Node: the service
// account needs get, list and watch on nodes (a ClusterRole; list and watch
// are what this calls). A map without label rules needs none of it: the
// informer starts at the first call of Labels, which the server makes only
// for a map with label rules that does not name the node, so serve with
// any other map never talks to the API server.
type NodeLabelWatch struct {
	node       string
	kubeconfig string
	log        *slog.Logger
	// listTimeout is DefaultNodeListTimeout; tests shorten it.
	listTimeout time.Duration

	wanted     chan struct{} // closed by the first Labels: Run may connect
	wantedOnce sync.Once
	answered   chan struct{} // closed once the first list has answered or failed
	answerOnce sync.Once
	changed    chan struct{}

	mu     sync.Mutex
	labels map[string]string
	listed bool  // labels hold the API server's answer (once true, stays true)
	err    error // why the labels cannot be read; nil once they can
	outage bool  // a failure after listed was logged; the next answer ends it
}

// NewNodeLabelWatch watches node's labels through kubeconfig's API
// server, or the pod's own when kubeconfig is empty (kubeclient.Config).
// Nothing connects before Run runs and Labels is first called.
func NewNodeLabelWatch(node, kubeconfig string, log *slog.Logger) *NodeLabelWatch {
	if log == nil {
		log = slog.Default()
	}
	return &NodeLabelWatch{
		node: node, kubeconfig: kubeconfig, log: log, listTimeout: DefaultNodeListTimeout,
		wanted: make(chan struct{}), answered: make(chan struct{}), changed: make(chan struct{}, 1),
	}
}

// Changed receives, at most one pending at a time, when the labels or
// their error changed.
func (w *NodeLabelWatch) Changed() <-chan struct{} { return w.changed }

// Labels returns the node's labels. The first call starts the informer and
// waits for its first list (at most the list timeout, or ctx); later calls
// return what the informer last saw at once. Once listed, the labels stay
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
	nodes, err := kubeclient.NodeMetadata(w.kubeconfig)
	if err != nil {
		// A wrong flag or a pod without its service account: trying again
		// mends neither, and every sync reports the error.
		w.set(nil, fmt.Errorf("labels of node %s: %w", w.node, err))
		return
	}
	// No resync period: the informer then passes on no relist or resync
	// that left the Node as it was; set drops the rest (a status update
	// changes the Node, not its labels).
	informer := cache.NewSharedIndexInformerWithOptions(w.listWatch(ctx, nodes), &metav1.PartialObjectMetadata{},
		cache.SharedIndexInformerOptions{ObjectDescription: "Node " + w.node})
	// The list and watch report their failures themselves (listWatch);
	// the default handler would log each retry of an outage as an error.
	_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		logr.FromContextOrDiscard(ctx).V(4).Info("node list or watch ended; retrying", "node", w.node, "err", err)
	})
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.seen,
		UpdateFunc: func(_, node any) { w.seen(node) },
		DeleteFunc: func(any) { w.set(nil, fmt.Errorf("node %s: the Node was deleted", w.node)) },
	})
	// client-go logs through the logger in ctx: serve's own, not klog's
	// text on stderr.
	informer.RunWithContext(logr.NewContext(ctx, logr.FromSlogHandler(w.log.Handler())))
}

// listWatch lists and watches the one node for the informer, and notes
// each answer and failure as it happens: the informer's error handler
// never hears of a watch it retries after a refused connection.
func (w *NodeLabelWatch) listWatch(ctx context.Context, nodes metadata.ResourceInterface) cache.ListerWatcher {
	selector := fields.OneTermEqualSelector("metadata.name", w.node).String()
	return listThenWatch{&cache.ListWatch{
		ListWithContextFunc: func(listCtx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			listCtx, cancel := context.WithTimeout(listCtx, w.listTimeout)
			defer cancel()
			list, err := nodes.List(listCtx, opts)
			if err != nil {
				w.failed(ctx, err)
				return nil, err
			}
			w.answer()
			if len(list.Items) == 0 {
				// The informer tells of a Node it lists, not of none.
				w.set(nil, fmt.Errorf("node %s: no such Node in the API server", w.node))
			}
			return list, nil
		},
		WatchFuncWithContext: func(watchCtx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			watcher, err := nodes.Watch(watchCtx, opts)
			if err != nil {
				// An expired version is no outage: the informer lists again.
				if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
					w.failed(ctx, err)
				}
				return nil, err
			}
			w.answer()
			return watcher, nil
		},
	}}
}

// listThenWatch makes the informer list the Node and then watch it,
// rather than stream the list in a watch (client-go's WatchListClient):
// a stream saves nothing on one object, and the first Labels waits on the
// list, which listTimeout bounds, where nothing bounds a stream's wait for
// its first events.
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is how client-go's reflector asks
// (watchlist.DoesClientNotSupportWatchListSemantics).
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// seen records the Node as the informer delivers it.
func (w *NodeLabelWatch) seen(obj any) {
	if node, ok := obj.(*metav1.PartialObjectMetadata); ok {
		w.set(node.Labels, nil)
	}
}

// answer notes that the API server answered: an outage logged is over.
func (w *NodeLabelWatch) answer() {
	w.mu.Lock()
	outage := w.outage
	w.outage = false
	w.mu.Unlock()
	if outage {
		w.log.Info("reading the node's labels again", "node", w.node)
	}
}

// failed records a list or watch that failed. Before any list succeeded,
// Labels returns the error; after, the labels last seen stay served, and
// the error goes to the log only: once at warn for an outage, the
// informer's retries in it at debug.
func (w *NodeLabelWatch) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // serve is stopping: no outage
	}
	err = fmt.Errorf("labels of node %s: %w", w.node, err)
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		err = fmt.Errorf("%w (a fleet map's label rules need get, list and watch on nodes for serve's service account)", err)
	}
	w.mu.Lock()
	listed, outage := w.listed, w.outage
	w.outage = listed
	w.mu.Unlock()
	switch {
	case !listed:
		w.set(nil, err)
	case !outage:
		w.log.Warn("cannot read the node's labels; keeping the last ones seen", "node", w.node, "err", err)
	default:
		w.log.Debug("still cannot read the node's labels", "node", w.node, "err", err)
	}
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
