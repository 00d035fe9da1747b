// Package endpoints is the one home of the HTTP endpoints the long-running
// commands (serve and publish) answer the kubelet's probes and Prometheus
// on: their paths, the default address, the listener, and the answer a
// check gives. Both commands' manifests probe the same paths at the same
// named port, so what those are is said once, here.
package endpoints

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// DefaultListen is the endpoints' address when none is given.
const DefaultListen = ":8080"

// The endpoints' paths: liveness, readiness and the metrics.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
	MetricsPath = "/metrics"
)

// Listener opens the endpoints' listener at most once: at the first
// Listen, which a command calls before Run so that a failure names its
// --listen flag and a test that asked for port 0 learns the port, or at
// Serve. Its zero value listens at DefaultListen.
type Listener struct {
	// Addr is the address to listen at (default DefaultListen);
	// "127.0.0.1:0" picks a free port.
	Addr string
	ln   net.Listener
}

// Listen opens the listener, if not yet open, and returns its address.
func (l *Listener) Listen() (net.Addr, error) {
	if l.ln == nil {
		ln, err := net.Listen("tcp", cmp.Or(l.Addr, DefaultListen))
		if err != nil {
			// net's error names the address; the caller says where it
			// came from (its --listen).
			return nil, err
		}
		l.ln = ln
	}
	return l.ln.Addr(), nil
}

// Serve serves h on the listener, opening it if need be, in the
// background, logging an end that Close or Shutdown did not ask for; stop
// it through the server returned.
func (l *Listener) Serve(h http.Handler, log *slog.Logger) (*http.Server, net.Addr, error) {
	addr, err := l.Listen()
	if err != nil {
		return nil, nil, err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health endpoints stopped", "addr", addr.String(), "err", err)
		}
	}()
	return hs, addr, nil
}

// Handler answers HealthzPath with healthy and ReadyzPath with ready (a
// nil check always passes), as Probe does, and MetricsPath with what
// metrics writes in Prometheus' text format (none without metrics).
func Handler(healthy, ready func() error, metrics func(io.Writer)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+HealthzPath, Probe(healthy))
	mux.Handle("GET "+ReadyzPath, Probe(ready))
	if metrics != nil {
		mux.HandleFunc("GET "+MetricsPath, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			metrics(w)
		})
	}
	return mux
}

// Probe answers a health check: 200 and "ok", or 503 and check's error in
// one line. A nil check always passes.
func Probe(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if check != nil {
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "%v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	}
}

// Metric writes one metric in Prometheus' text format, named
// nvml_mock_sysfs_<name>, of kind (counter, gauge), with its help line:
// each value is a sample's labels (or nothing) and its value, such as
// ` 3` or `{result="served"} 3`.
func Metric(w io.Writer, name, kind, help string, values ...string) {
	fmt.Fprintf(w, "# HELP nvml_mock_sysfs_%s %s\n# TYPE nvml_mock_sysfs_%s %s\n", name, help, name, kind)
	for _, v := range values {
		fmt.Fprintf(w, "nvml_mock_sysfs_%s%s\n", name, v)
	}
}
