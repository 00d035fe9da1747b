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

// RegisteredPlugins returns the registration sockets of the plugins the
// kubelet's plugin manager has registered (its actual state of the world),
// read from the kubelet's own API (/metrics on its port, which allows the
// cluster's anonymous reads): what the kubelet says it holds, not a log
// line's wording at some -v. The API server's node proxy would refuse the
// kubelet's loopback address.
func (c *Cluster) RegisteredPlugins(ctx context.Context) ([]string, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: c.Dial, TLSClientConfig: selfSigned()}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+kubeletAddress+"/metrics", nil)
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

// kubeletAddress is the kubelet's API, as its configuration sets it
// (port 10250 on the namespace's loopback).
const kubeletAddress = "127.0.0.1:10250"

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
