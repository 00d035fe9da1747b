package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// kubeletPlugins reads the registered plugins' sockets from a kubelet's
// /metrics at url.
func kubeletPlugins(ctx context.Context, client *http.Client, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's metrics: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %.300s", resp.Status, raw)
	}
	if err != nil {
		return nil, fmt.Errorf("the kubelet's metrics: %w", err)
	}
	return registeredPlugins(raw)
}

// pluginMetric is the kubelet plugin manager's gauge: one series per
// socket and state, actual_state_of_world for a registered plugin.
const pluginMetric = "plugin_manager_total_plugins"

// registeredPlugins reads the sockets of pluginMetric's series in the
// actual state of the world with a positive value from a Prometheus text
// exposition.
func registeredPlugins(exposition []byte) ([]string, error) {
	var sockets []string
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		labels, ok := strings.CutPrefix(line, pluginMetric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok {
			return nil, fmt.Errorf("the kubelet's metrics: %q: no value", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("the kubelet's metrics: %q: %w", line, err)
		}
		if v > 0 && strings.Contains(labels, `state="actual_state_of_world"`) {
			if _, rest, ok := strings.Cut(labels, `socket_path="`); ok {
				socket, _, _ := strings.Cut(rest, `"`)
				sockets = append(sockets, socket)
			}
		}
	}
	return sockets, sc.Err()
}
