package podtest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPollRetriesUntilItsDeadline: a check that cannot look twice (as a
// restarting server refuses connections) is asked again, and the poll ends
// when it holds; one that never holds ends at the deadline with what it
// last saw.
func TestPollRetriesUntilItsDeadline(t *testing.T) {
	t.Parallel()
	tries := 0
	_, err := Poll(10*time.Second, time.Millisecond, func() (bool, string) {
		tries++
		if tries <= 2 {
			return false, fmt.Sprintf("connection refused (try %d)", tries)
		}
		return true, "ok"
	})
	require.NoError(t, err)
	require.Equal(t, 3, tries)

	n := 0
	took, err := Poll(100*time.Millisecond, 5*time.Millisecond, func() (bool, string) {
		n++
		return false, fmt.Sprintf("state %d", n)
	})
	require.Error(t, err)
	require.GreaterOrEqual(t, took, 100*time.Millisecond)
	require.Contains(t, err.Error(), fmt.Sprintf("last saw: state %d", n))
	require.Contains(t, err.Error(), fmt.Sprintf("(%d tries)", n))
}

// TestWaitProbeThroughErrors: a server that answers 503 twice, then 200, is
// waited through; one that never listens fails the wait with the dial's
// error as the last thing seen.
func TestWaitProbeThroughErrors(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if asked.Add(1) <= 2 {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()
	WaitProbe(t, srv.URL, http.StatusOK, 10*time.Second)
	require.EqualValues(t, 3, asked.Load())

	_, saw := probeCheck(srv.URL, http.StatusTeapot)()
	require.Equal(t, `200 "ok"`, saw, "a wrong answer is what a failed wait names")

	// A port nothing listens on: refused, every time.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = Poll(100*time.Millisecond, 10*time.Millisecond, probeCheck(url, http.StatusOK))
	require.ErrorContains(t, err, "connection refused")
}
