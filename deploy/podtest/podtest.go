// Package podtest does for tests what the kubelet does for the DaemonSet's
// pod: it lays out a ConfigMap volume and updates it the way the kubelet
// does, and probes health endpoints the way an httpGet probe does. The
// serve tests use it on temporary directories, and so can a test that runs
// the pod through a container runtime. It is a public test kit, as
// overlay/overlaytest is, because the end-to-end wing (deploy/e2e, its own
// module) uses it too: an internal/ package reached from another module is
// no API.
package podtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ConfigMapUpdateWait is how long a test on a real kubelet waits for a
// changed ConfigMap to reach a pod's volume. The kubelet swaps it in after
// its sync period (a minute, jittered) plus its ConfigMap cache's delay:
// 44 to 90 s after the API update on the test node. Twice the longest seen
// gives a loaded machine room.
const ConfigMapUpdateWait = 3 * time.Minute

// ConfigMap is a directory laid out as the kubelet lays out a ConfigMap
// volume with one key: the data in a timestamped directory, ..data a
// symlink to it, and the key a symlink through ..data. Swap updates it as
// the kubelet's AtomicWriter does: a new timestamped directory, a symlink
// ..data_tmp renamed over ..data (the one atomic step), then the old
// directory's removal. A reader of the key sees the old text or the new.
type ConfigMap struct {
	t    testing.TB
	Dir  string // the volume, to mount as a directory (never with subPath)
	Key  string
	gen  int
	data string // the current timestamped directory
}

// NewConfigMap makes the volume at dir, which must not exist, holding text
// under key.
func NewConfigMap(t testing.TB, dir, key string, text []byte) *ConfigMap {
	t.Helper()
	cm := &ConfigMap{t: t, Dir: dir, Key: key}
	require.NoError(t, os.Mkdir(dir, 0o755))
	cm.Swap(text)
	require.NoError(t, os.Symlink(filepath.Join("..data", key), cm.File()))
	return cm
}

// File is the key's path in the volume, as the container names it.
func (cm *ConfigMap) File() string { return filepath.Join(cm.Dir, cm.Key) }

// Swap replaces the key's text atomically.
func (cm *ConfigMap) Swap(text []byte) {
	t := cm.t
	t.Helper()
	cm.gen++
	data := fmt.Sprintf("..%s.%09d", time.Now().UTC().Format("2006_01_02_15_04_05"), cm.gen)
	require.NoError(t, os.Mkdir(filepath.Join(cm.Dir, data), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(cm.Dir, data, cm.Key), text, 0o644))
	tmp := filepath.Join(cm.Dir, "..data_tmp")
	require.NoError(t, os.Symlink(data, tmp))
	require.NoError(t, os.Rename(tmp, filepath.Join(cm.Dir, "..data")))
	if cm.data != "" {
		require.NoError(t, os.RemoveAll(filepath.Join(cm.Dir, cm.data)))
	}
	cm.data = data
}

// Probe gets url as an httpGet probe does; err is set when nothing answers.
func Probe(url string) (code int, body string, err error) {
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// pollEvery is how often the polls here ask again: short next to any
// deadline they are given, long next to a probe's own cost.
const pollEvery = 20 * time.Millisecond

// Poll asks check every interval until it reports done, and returns how
// long that took. check says what it saw each time; after within, Poll
// returns an error naming the last of it, and how often it asked. A check
// that cannot look (a connection refused while a server restarts) says so
// as what it saw and is asked again: only the deadline ends a poll.
func Poll(within, interval time.Duration, check func() (done bool, saw string)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(within)
	var saw string
	for tries := 1; ; tries++ {
		var done bool
		if done, saw = check(); done {
			return time.Since(start), nil
		}
		if !time.Now().Before(deadline) {
			return time.Since(start), fmt.Errorf("not within %s (%d tries); last saw: %s", within, tries, saw)
		}
		time.Sleep(min(interval, time.Until(deadline)))
	}
}

// Until polls check as Poll does and fails the test after within, naming
// what it waited for and what check last saw; it returns how long the wait
// took.
func Until(t testing.TB, within time.Duration, what string, check func() (done bool, saw string)) time.Duration {
	t.Helper()
	took, err := Poll(within, pollEvery, check)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return took
}

// WaitProbe polls url until it answers want, and returns how long that
// took; it fails the test after within, with the last answer or the last
// error. Nothing answering yet (the server not listening, or restarting)
// is polled through like a wrong code.
func WaitProbe(t testing.TB, url string, want int, within time.Duration) time.Duration {
	t.Helper()
	return Until(t, within, fmt.Sprintf("%s to answer %d", url, want), probeCheck(url, want))
}

// probeCheck is WaitProbe's check.
func probeCheck(url string, want int) func() (bool, string) {
	return func() (bool, string) {
		code, body, err := Probe(url)
		if err != nil {
			return false, err.Error()
		}
		return code == want, fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
	}
}

// Log collects what serve --log-format json writes, from any goroutine.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Records parses every line as a JSON record and returns those at level
// ("INFO", "ERROR", ...); a line that is not JSON fails the test.
func (l *Log) Records(t testing.TB, level string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line %q", line)
		if rec["level"] == level {
			out = append(out, rec)
		}
	}
	return out
}
