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
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/podtest"
)

// fakeAPIServer answers what NodeLabelWatch asks of an API server: a list
// and a watch of nodes by field selector, as JSON metadata, as the real
// one answers the metadata client's Accept header.
type fakeAPIServer struct {
	t    *testing.T
	srv  *httptest.Server
	node string

	mu      sync.Mutex
	labels  map[string]string
	rv      int
	exists  bool
	status  int         // an error status for every request, when not 0
	lists   int         // lists answered
	watches []string    // the resourceVersion of each watch begun
	events  chan string // lines for the watch in progress
	end     chan bool   // ends the watch in progress
	queries []string    // every request's query
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

func (a *fakeAPIServer) object() map[string]any {
	return map[string]any{
		"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
		"metadata": map[string]any{"name": a.node, "resourceVersion": fmt.Sprint(a.rv), "labels": a.labels},
	}
}

func (a *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.queries = append(a.queries, r.URL.RawQuery)
	status := a.status
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != "/api/v1/nodes" || r.URL.Query().Get("fieldSelector") != "metadata.name="+a.node {
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
	if r.URL.Query().Get("watch") != "true" {
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
	a.watches = append(a.watches, r.URL.Query().Get("resourceVersion"))
	a.mu.Unlock()
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

// setLabels changes the node's labels and sends the watch's event.
func (a *fakeAPIServer) setLabels(labels map[string]string) {
	a.mu.Lock()
	a.labels, a.rv = labels, a.rv+1
	ev, err := json.Marshal(map[string]any{"type": "MODIFIED", "object": a.object()})
	a.mu.Unlock()
	require.NoError(a.t, err)
	a.events <- string(ev)
}

func (a *fakeAPIServer) counts() (lists int, watches []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists, append([]string(nil), a.watches...)
}

func runLabels(t *testing.T, w *NodeLabelWatch) {
	t.Helper()
	w.retry = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func waitChanged(t *testing.T, w *NodeLabelWatch, what string) {
	t.Helper()
	select {
	case <-w.Changed():
	case <-time.After(10 * time.Second):
		t.Fatalf("no Changed: %s", what)
	}
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
	lists, _ := api.counts()
	require.Zero(t, lists)

	labels, err := w.Labels(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nvml-mock/profile": "gb200"}, labels)
	waitChanged(t, w, "the first list")

	// A label change comes through the watch, from the list's version.
	podtest.Until(t, 10*time.Second, "the watch begun", func() (bool, string) {
		_, watches := api.counts()
		return len(watches) == 1, fmt.Sprint(watches)
	})
	_, watches := api.counts()
	require.Equal(t, []string{"100"}, watches)
	api.setLabels(map[string]string{"nvml-mock/profile": "h100"})
	waitChanged(t, w, "the label change")
	labels, err = w.Labels(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nvml-mock/profile": "h100"}, labels)

	// The API server ends the watch: listed and watched again, from the
	// new list's version, and later changes still come through.
	api.end <- true
	podtest.Until(t, 10*time.Second, "listed and watched again", func() (bool, string) {
		lists, watches := api.counts()
		return lists == 2 && len(watches) == 2, fmt.Sprintf("%d lists, watches %v", lists, watches)
	})
	_, watches = api.counts()
	require.Equal(t, "101", watches[1])
	api.setLabels(map[string]string{"nvml-mock/profile": "b200"})
	waitChanged(t, w, "the label change after the new watch")
	labels, err = w.Labels(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nvml-mock/profile": "b200"}, labels)

	// An outage after a good list keeps the labels last seen.
	api.mu.Lock()
	api.status = http.StatusForbidden
	api.mu.Unlock()
	api.end <- true
	podtest.Until(t, 10*time.Second, "the failed list logged", func() (bool, string) {
		return bytes.Contains([]byte(logs.String()), []byte("keeping the last ones seen")), logs.String()
	})
	labels, err = w.Labels(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nvml-mock/profile": "b200"}, labels)
	api.mu.Lock()
	for _, q := range api.queries {
		require.Contains(t, q, "fieldSelector=metadata.name%3Dworker-a", "every request asks for the one node")
	}
	api.mu.Unlock()
}

func TestNodeLabelWatchErrors(t *testing.T) {
	t.Parallel()
	t.Run("forbidden", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", nil)
		api.mu.Lock()
		api.status = http.StatusForbidden
		api.mu.Unlock()
		w := NewNodeLabelWatch("worker-a", api.kubeconfig(), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
		runLabels(t, w)
		_, err := w.Labels(context.Background())
		require.ErrorContains(t, err, "labels of node worker-a: nodes is forbidden")
		require.ErrorContains(t, err, "need get, list and watch on nodes")
		require.NotContains(t, err.Error(), "\n")
		waitChanged(t, w, "the first answer, an error")

		// Granted: the retry lists it, and Changed says so.
		api.mu.Lock()
		api.status = 0
		api.mu.Unlock()
		waitChanged(t, w, "the grant")
		labels, err := w.Labels(context.Background())
		require.NoError(t, err)
		require.Empty(t, labels)
	})
	t.Run("no such node", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPIServer(t, "worker-a", nil)
		api.mu.Lock()
		api.exists = false
		api.mu.Unlock()
		w := NewNodeLabelWatch("worker-a", api.kubeconfig(), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
		runLabels(t, w)
		_, err := w.Labels(context.Background())
		require.EqualError(t, err, "node worker-a: no such Node in the API server")
	})
	t.Run("missing kubeconfig", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "kubeconfig")
		w := NewNodeLabelWatch("worker-a", missing, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
		runLabels(t, w)
		_, err := w.Labels(context.Background())
		require.ErrorContains(t, err, "labels of node worker-a: kubeconfig "+missing)
	})
	t.Run("not in a pod", func(t *testing.T) {
		t.Parallel()
		if _, ok := os.LookupEnv("KUBERNETES_SERVICE_HOST"); ok {
			t.Skip("running in a pod: the in-cluster config is there")
		}
		w := NewNodeLabelWatch("worker-a", "", slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
		runLabels(t, w)
		_, err := w.Labels(context.Background())
		require.ErrorContains(t, err, "in-cluster API config")
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
