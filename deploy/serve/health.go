package serve

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Listen opens the health endpoints' listener, if Run has not, and returns
// its address: the port a probe, or a test that asked for port 0, uses.
func (s *Server) Listen() (net.Addr, error) { return s.endpoints.Listen() }

// Ready says why the node is not served right, or nil when it is: the
// last sync succeeded, so the tree is the current profile's and the specs
// were written, the completion marker still vouches for that very plan,
// and the spec files are there.
func (s *Server) Ready() error {
	st := s.Status()
	switch {
	case st.Syncs == 0:
		return errors.New("no render yet")
	case st.Err != "":
		return errors.New(st.Err)
	}
	m, err := writer.ReadMarker(os.DirFS(s.opts.Render.Root))
	if err != nil {
		return fmt.Errorf("%s: %w", s.opts.Render.Root, err)
	}
	if m.Digest != st.Digest {
		return fmt.Errorf("%s holds plan %s, not the current profile's %s", s.opts.Render.Root, m.Digest, st.Digest)
	}
	for _, f := range []string{s.opts.Output, s.opts.MergeInto} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("CDI spec: %w", err)
		}
	}
	if s.nri != nil {
		return s.nri.Ready()
	}
	return nil
}

// Healthy fails only when one sync has run longer than StuckAfter: a
// restart is then the better bet. A failing render is not unhealthy; it
// is not ready.
func (s *Server) Healthy() error {
	s.mu.Lock()
	started := s.syncing
	s.mu.Unlock()
	if !started.IsZero() {
		if d := time.Since(started); d > s.opts.StuckAfter {
			return fmt.Errorf("one sync has run for %s", d.Round(time.Second))
		}
	}
	return nil
}

// Handler serves /healthz (Healthy), /readyz (Ready) and /metrics: 200
// and "ok", or 503 and the reason in one line.
func (s *Server) Handler() http.Handler {
	return endpoints.Handler(s.Healthy, s.Ready, s.writeMetrics)
}
