package endpoints

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHandler: each path answers its own check, 200 and "ok" or 503 and the
// reason in one line; a nil check passes; no metrics function, no path.
func TestHandler(t *testing.T) {
	h := Handler(nil, func() error { return errors.New("no render yet") }, func(w io.Writer) {
		Metric(w, "syncs_total", "counter", "Syncs finished.", " 3")
	})
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get(h, HealthzPath)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = get(h, ReadyzPath)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "no render yet\n", body)
	code, body = get(h, MetricsPath)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "# HELP nvml_mock_sysfs_syncs_total Syncs finished.\n# TYPE nvml_mock_sysfs_syncs_total counter\nnvml_mock_sysfs_syncs_total 3\n", body)

	code, _ = get(Handler(nil, nil, nil), MetricsPath)
	require.Equal(t, http.StatusNotFound, code)
}

// TestListenerOpensOnce: Listen before Serve is the port Serve serves, as
// a command names --listen in its error and a test learns port 0's port.
func TestListenerOpensOnce(t *testing.T) {
	l := Listener{Addr: "127.0.0.1:0"}
	first, err := l.Listen()
	require.NoError(t, err)
	again, err := l.Listen()
	require.NoError(t, err)
	require.Equal(t, first.String(), again.String())
	hs, served, err := l.Serve(Handler(nil, nil, nil), slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	require.NoError(t, err)
	defer hs.Close()
	require.Equal(t, first.String(), served.String())
	resp, err := http.Get("http://" + served.String() + ReadyzPath)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	_, err = (&Listener{Addr: served.String()}).Listen()
	require.Error(t, err, "a second listener at a taken address")
}
