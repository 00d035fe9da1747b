package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

// fakeAPIServer answers what NodeLabelWatch's informer asks of an API
// server: a list and a watch of nodes by field selector, as JSON metadata,
// as the real one answers the metadata client's Accept header.
type fakeAPIServer struct {
	t    *testing.T
	srv  *httptest.Server
	node string

	mu        sync.Mutex
	labels    map[string]string
	rv        int
	exists    bool
	status    int         // an error status for every request, when not 0
	hangLists bool        // lists answer only when the client gives up
	hanging   int         // lists begun that hang
	goneWatch bool        // watches answered 410: too old a version
	refused   int         // requests answered with status
	lists     int         // lists answered
	watches   []string    // the resourceVersion of each watch begun
	events    chan string // lines for the watch in progress
	end       chan bool   // ends the watch in progress
	queries   []string    // every request's query
}

func newFakeAPIServer(t *testing.T, node string, labels map[string]string) *fakeAPIServer {
	a := &fakeAPIServer{t: t, node: node, labels: labels, rv: 100, exists: true, events: make(chan string, 16), end: make(chan bool)}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

// kubeconfig writes a kubeconfig naming the server, as --kubeconfig takes.
func (a *fakeAPIServer) kubeconfig() string {
	file := filepath.Join(a.t.TempDir(), "kubeconfig")
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
  - name: fake
    cluster: {server: %q}
users:
  - name: serve
    user: {token: not-checked}
contexts:
  - name: fake
    context: {cluster: fake, user: serve}
current-context: fake
`, a.srv.URL)
	require.NoError(a.t, os.WriteFile(file, []byte(text), 0o600))
	return file
}

// change changes the server's state under its lock.
func (a *fakeAPIServer) change(f func(a *fakeAPIServer)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *fakeAPIServer) object() map[string]any {
	return map[string]any{
		"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
		"metadata": map[string]any{"name": a.node, "resourceVersion": fmt.Sprint(a.rv), "labels": a.labels},
	}
}

func (a *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.queries = append(a.queries, r.URL.RawQuery)
	status, hang := a.status, a.hangLists
	if status != 0 {
		a.refused++
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	q := r.URL.Query()
	// A watch that streams the list (sendInitialEvents) is not what serve
	// asks: it lists, then watches.
	if r.URL.Path != "/api/v1/nodes" || q.Get("fieldSelector") != "metadata.name="+a.node || q.Has("sendInitialEvents") {
		http.Error(w, "not what serve asks", http.StatusBadRequest)
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "reason": http.StatusText(status),
			"message": `nodes is forbidden: User "system:serviceaccount:nvml-mock:nvml-mock-sysfs" cannot list resource "nodes" in API group "" at the cluster scope`,
		})
		return
	}
	if q.Get("watch") != "true" {
		if hang {
			a.change(func(a *fakeAPIServer) { a.hanging++ })
			<-r.Context().Done()
			a.change(func(a *fakeAPIServer) { a.hanging-- })
			return
		}
		a.mu.Lock()
		a.lists++
		list := map[string]any{"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
			"metadata": map[string]any{"resourceVersion": fmt.Sprint(a.rv)}, "items": []any{}}
		if a.exists {
			list["items"] = []any{a.object()}
		}
		a.mu.Unlock()
		_ = json.NewEncoder(w).Encode(list)
		return
	}
	a.mu.Lock()
	gone := a.goneWatch
	a.watches = append(a.watches, q.Get("resourceVersion"))
	a.mu.Unlock()
	if gone {
		w.WriteHeader(http.StatusGone)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": http.StatusGone, "reason": "Expired",
			"message": "too old resource version: " + q.Get("resourceVersion"),
		})
		return
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case line := <-a.events:
			fmt.Fprintln(w, line)
			w.(http.Flusher).Flush()
		case <-a.end:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// event changes the node as f says, bumps its version and sends the
// watch's event of type kind.
func (a *fakeAPIServer) event(kind string, f func(a *fakeAPIServer)) {
	a.mu.Lock()
	f(a)
	a.rv++
	ev, err := json.Marshal(map[string]any{"type": kind, "object": a.object()})
	a.mu.Unlock()
	require.NoError(a.t, err)
	a.events <- string(ev)
}

// setLabels changes the node's labels through the watch.
func (a *fakeAPIServer) setLabels(labels map[string]string) {
	a.event("MODIFIED", func(a *fakeAPIServer) { a.labels = labels })
}

func (a *fakeAPIServer) counts() (lists int, watches []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists, append([]string(nil), a.watches...)
}

// runLabels runs w until the test ends, or until the function it returns
// is called, which waits for Run to return.
func runLabels(t *testing.T, w *NodeLabelWatch) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// labelsOf is w.Labels, failing the test rather than hanging it.
func labelsOf(t *testing.T, w *NodeLabelWatch) (map[string]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	labels, err := w.Labels(ctx)
	require.NoError(t, ctx.Err(), "Labels did not answer")
	return labels, err
}

func waitChanged(t *testing.T, w *NodeLabelWatch, what string) {
	t.Helper()
	select {
	case <-w.Changed():
	case <-time.After(10 * time.Second):
		t.Fatalf("no Changed: %s", what)
	}
}

// noChange fails if Changed receives within a while: long enough for an
// event the fake sent to reach the informer's handler many times over.
func noChange(t *testing.T, w *NodeLabelWatch, what string) {
	t.Helper()
	select {
	case <-w.Changed():
		t.Fatalf("Changed, needlessly: %s", what)
	case <-time.After(300 * time.Millisecond):
	}
}

func requireLabels(t *testing.T, w *NodeLabelWatch, want map[string]string) {
	t.Helper()
	labels, err := labelsOf(t, w)
	require.NoError(t, err)
	require.Equal(t, want, labels)
}

func TestNodeLabelWatch(t *testing.T) {
	t.Parallel()
	api := newFakeAPIServer(t, "worker-a", map[string]string{"nvml-mock/profile": "gb200"})
	logs := &podtest.Log{}
	w := NewNodeLabelWatch("worker-a", api.kubeconfig(), slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	runLabels(t, w)

	// Nothing is asked of the API server before the first Labels: a map
	// without label rules never calls it.
	time.Sleep(100 * time.Millisecond)
	api.change(func(a *fakeAPIServer) { require.Empty(t, a.queries) })

	requireLabels(t, w, map[string]string{"nvml-mock/profile": "gb200"})
	waitChanged(t, w, "the first list")
	// client-go logs through serve's logger, not klog's stderr.
	podtest.Until(t, 10*time.Second, "client-go's log in serve's", func() (bool, string) {
		return strings.Contains(logs.String(), `"msg":"Listing and watching"`), logs.String()
	})

	// A label change comes through the watch, from the list's version.
	podtest.Until(t, 10*time.Second, "the watch begun", func() (bool, string) {
		_, watches := api.counts()
		return len(watches) == 1, fmt.Sprint(watches)
	})
	_, watches := api.counts()
	require.Equal(t, []string{"100"}, watches)
	api.setLabels(map[string]string{"nvml-mock/profile": "h100"})
	waitChanged(t, w, "the label change")
	requireLabels(t, w, map[string]string{"nvml-mock/profile": "h100"})

	// A change of the Node that leaves its labels (a status update) is no
	// change of the labels.
	api.event("MODIFIED", func(*fakeAPIServer) {})
	noChange(t, w, "the Node changed, its labels did not")

	// The API server ends the watch: watched again from the last version
	// seen, and later changes still come through.
	api.end <- true
	podtest.Until(t, 10*time.Second, "watched again", func() (bool, string) {
		_, watches := api.counts()
		return len(watches) == 2, fmt.Sprint(watches)
	})
	lists, watches := api.counts()
	require.Equal(t, "102", watches[1])
	require.Equal(t, 1, lists, "a watch ended in the ordinary way needs no list")
	api.setLabels(map[string]string{"nvml-mock/profile": "b200"})
	waitChanged(t, w, "the label change after the new watch")
	requireLabels(t, w, map[string]string{"nvml-mock/profile": "b200"})

	// The Node deleted: an error naming it; created again: its labels.
	api.event("DELETED", func(a *fakeAPIServer) { a.exists = false })
	waitChanged(t, w, "the Node deleted")
	_, err := labelsOf(t, w)
	require.EqualError(t, err, "node worker-a: the Node was deleted")
	api.event("ADDED", func(a *fakeAPIServer) { a.exists, a.labels = true, map[string]string{"nvml-mock/profile": "a100"} })
	waitChanged(t, w, "the Node created again")
	requireLabels(t, w, map[string]string{"nvml-mock/profile": "a100"})

	// An outage after a good list keeps the labels last seen, and is
	// logged once, at warn, however often the informer retries. (Its
	// backoff, 0.8s doubled and not reset for 2 minutes, makes the test
	// wait for a retry of the first outage only.)
	outage := func(n, retries int) {
		t.Helper()
		api.change(func(a *fakeAPIServer) { a.status, a.refused = http.StatusForbidden, 0 })
		api.end <- true
		podtest.Until(t, 20*time.Second, "the informer retried", func() (bool, string) {
			var refused int
			api.change(func(a *fakeAPIServer) { refused = a.refused })
			return refused >= retries, fmt.Sprint(refused, " refused")
		})
		require.Len(t, logs.Records(t, "WARN"), n, logs.String())
		require.Contains(t, logs.String(), "keeping the last ones seen")
		require.Empty(t, logs.Records(t, "ERROR"), logs.String())
		requireLabels(t, w, map[string]string{"nvml-mock/profile": "a100"})
	}
	outage(1, 2)

	// The API server back: said so, and a list that finds the labels as
	// they were changes nothing.
	_, watches = api.counts()
	api.change(func(a *fakeAPIServer) { a.status = 0 })
	podtest.Until(t, 20*time.Second, "the end of the outage logged", func() (bool, string) {
		return strings.Contains(logs.String(), "reading the node's labels again"), logs.String()
	})
	noChange(t, w, "listed again after the outage, the same labels")
	requireLabels(t, w, map[string]string{"nvml-mock/profile": "a100"})

	// The next outage is logged again. The watch ends after a second: an
	// ordinary end, which the informer follows with a watch at once; a
	// shorter one it takes for a fault, and waits out its backoff first.
	podtest.Until(t, 10*time.Second, "watched again after the outage", func() (bool, string) {
		_, now := api.counts()
		return len(now) > len(watches), fmt.Sprint(now)
	})
	time.Sleep(1100 * time.Millisecond)
	outage(2, 1)

	api.change(func(a *fakeAPIServer) {
		for _, q := range a.queries {
			require.Contains(t, q, "fieldSelector=metadata.name%3Dworker-a", "every request asks for the one node")
		}
	})
}

// TestNodeLabelWatchNoOutage: failures that are no outage are not logged.
func TestNodeLabelWatchNoOutage(t *testing.T) {
	t.Parallel()
	api := newFakeAPIServer(t, "worker-a", map[string]string{"nvml-mock/profile": "gb200"})
	logs := &podtest.Log{}
	w := NewNodeLabelWatch("worker-a", api.kubeconfig(), slog.New(slog.NewJSONHandler(logs, nil)))
	stop := runLabels(t, w)
	requireLabels(t, w, map[string]string{"nvml-mock/profile": "gb200"})
	podtest.Until(t, 10*time.Second, "the watch begun", func() (bool, string) {
		_, watches := api.counts()
		return len(watches) == 1, fmt.Sprint(watches)
	})

	// The watch's version too old to watch from: the informer lists again,
	// and this list hangs until serve stops, which cancels it.
	api.change(func(a *fakeAPIServer) { a.goneWatch, a.hangLists = true, true })
	// A second, so the informer takes the end for an ordinary one and
	// watches again at once (see TestNodeLabelWatch).
	time.Sleep(1100 * time.Millisecond)
	api.end <- true
	podtest.Until(t, 10*time.Second, "listed again", func() (bool, string) {
		var hanging int
		api.change(func(a *fakeAPIServer) { hanging = a.hanging })
		return hanging == 1, fmt.Sprint(hanging, " lists hanging")
	})
	_, watches := api.counts()
	require.Len(t, watches, 2, "the watch answered 410")
	stop()
	// The list's own goroutine sees the cancel after Run returned.
	podtest.Until(t, 10*time.Second, "the list canceled", func() (bool, string) {
		var hanging int
		api.change(func(a *fakeAPIServer) { hanging = a.hanging })
		return hanging == 0, fmt.Sprint(hanging, " lists hanging")
	})
	time.Sleep(100 * time.Millisecond)
	require.Empty(t, logs.String(), "nothing logged at info or above")
}

func TestNodeLabelWatchErrors(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	t.Run("forbidden", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", map[string]string{"nvml-mock/profile": "gb200"})
		api.change(func(a *fakeAPIServer) { a.status = http.StatusForbidden })
		w := NewNodeLabelWatch("worker-a", api.kubeconfig(), quiet)
		runLabels(t, w)
		_, err := labelsOf(t, w)
		require.ErrorContains(t, err, "labels of node worker-a: nodes is forbidden")
		require.ErrorContains(t, err, "need get, list and watch on nodes")
		require.NotContains(t, err.Error(), "\n")
		waitChanged(t, w, "the first answer, an error")

		// Granted: the retry lists it, and Changed says so.
		api.change(func(a *fakeAPIServer) { a.status = 0 })
		waitChanged(t, w, "the grant")
		requireLabels(t, w, map[string]string{"nvml-mock/profile": "gb200"})
	})
	t.Run("no such node, then created", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", nil)
		api.change(func(a *fakeAPIServer) { a.exists = false })
		w := NewNodeLabelWatch("worker-a", api.kubeconfig(), quiet)
		runLabels(t, w)
		_, err := labelsOf(t, w)
		require.EqualError(t, err, "node worker-a: no such Node in the API server")
		waitChanged(t, w, "the first answer, an error")

		podtest.Until(t, 10*time.Second, "the watch begun", func() (bool, string) {
			_, watches := api.counts()
			return len(watches) == 1, fmt.Sprint(watches)
		})
		api.event("ADDED", func(a *fakeAPIServer) { a.exists, a.labels = true, map[string]string{"nvml-mock/profile": "gb200"} })
		waitChanged(t, w, "the Node created")
		requireLabels(t, w, map[string]string{"nvml-mock/profile": "gb200"})
	})
	t.Run("a list that does not answer", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", nil)
		api.change(func(a *fakeAPIServer) { a.hangLists = true })
		w := NewNodeLabelWatch("worker-a", api.kubeconfig(), quiet)
		w.listTimeout = 100 * time.Millisecond
		runLabels(t, w)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := w.Labels(ctx)
		require.ErrorContains(t, err, "labels of node worker-a: ")
		require.ErrorContains(t, err, "context deadline exceeded")
		require.NoError(t, ctx.Err(), "the list's own timeout ended the wait")
	})
	t.Run("no API server", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", nil)
		kubeconfig := api.kubeconfig()
		api.srv.Close()
		w := NewNodeLabelWatch("worker-a", kubeconfig, quiet)
		runLabels(t, w)
		_, err := labelsOf(t, w)
		require.ErrorContains(t, err, "labels of node worker-a: ")
		require.ErrorContains(t, err, "connection refused")
	})
	t.Run("missing kubeconfig", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "kubeconfig")
		w := NewNodeLabelWatch("worker-a", missing, quiet)
		runLabels(t, w)
		_, err := labelsOf(t, w)
		require.ErrorContains(t, err, "labels of node worker-a: kubeconfig "+missing)
	})
	t.Run("Labels waits no longer than its context", func(t *testing.T) {
		t.Parallel()
		// Run not running: the first list never answers.
		w := NewNodeLabelWatch("worker-a", "", nil)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := w.Labels(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// TestNodeLabelWatchNotInAPod runs without the in-cluster config
// (KUBERNETES_SERVICE_HOST emptied, as outside a pod), so it judges the
// same inside a pod as outside, where it skipped in one: t.Setenv keeps it
// out of the parallel tests.
func TestNodeLabelWatchNotInAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	w := NewNodeLabelWatch("worker-a", "", slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	runLabels(t, w)
	_, err := labelsOf(t, w)
	require.ErrorContains(t, err, "in-cluster API config")
}
