package serve

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
)

// writeMetrics writes the counters in Prometheus' text format: the syncs,
// and the NRI plugin's (containers served, and those that run without the
// tree, which a restart would serve).
func (s *Server) writeMetrics(w io.Writer) {
	st := s.Status()
	endpoints.Metric(w, "syncs_total", "counter", "Syncs finished.", fmt.Sprintf(" %d", st.Syncs))
	endpoints.Metric(w, "sync_failures_total", "counter", "Syncs that failed.", fmt.Sprintf(" %d", st.Failures))
	if s.opts.ProcHookBinary != "" {
		endpoints.Metric(w, "proc_hook_failures_total", "counter", "Containers the /proc hook could not serve, which started with the node's /proc (the hook's lines are in "+cdispec.ProcHookFailures(s.opts.ProcHookBinary)+").",
			fmt.Sprintf(" %d", procHookFailures(s.opts.ProcHookBinary)))
	}
	c, ok := s.NRI()
	if !ok {
		return
	}
	registered := 0
	if c.Registered {
		registered = 1
	}
	endpoints.Metric(w, "nri_registered", "gauge", "1 while the NRI plugin is registered with the runtime.", fmt.Sprintf(" %d", registered))
	endpoints.Metric(w, "nri_registrations_total", "counter", "Registrations with the runtime (a runtime restart adds one).", fmt.Sprintf(" %d", c.Registrations))
	endpoints.Metric(w, "nri_containers_total", "counter", "Containers the NRI plugin judged, by what it did.",
		fmt.Sprintf(`{result="served"} %d`, c.Served), fmt.Sprintf(`{result="unrendered"} %d`, c.Unrendered),
		fmt.Sprintf(`{result="refused"} %d`, c.Refused), fmt.Sprintf(`{result="conflict"} %d`, c.Conflicts),
		fmt.Sprintf(`{result="missed"} %d`, c.Missed))
	endpoints.Metric(w, "nri_writable_containers_total", "counter", "Of the containers served, those given the writable view (serve --writable).",
		fmt.Sprintf(" %d", c.ServedWritable))
	endpoints.Metric(w, "nri_unserved_containers", "gauge", "Running containers the policy serves that run without the tree (serve's log names them).",
		fmt.Sprintf(" %d", len(c.Unserved)))
}

// procHookFailures counts the lines the /proc hook appended, one per
// container it could not serve (cdispec.ProcHookFailures): none while the
// file does not exist.
func procHookFailures(binary string) int {
	data, err := os.ReadFile(cdispec.ProcHookFailures(binary))
	if err != nil {
		return 0
	}
	return bytes.Count(data, []byte("\n"))
}
