package kubetest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// MatrixEnv names the file the Kubernetes suites' matrices go to (make
// e2e-k8s prints it); ObjectsEnv the directory of the API objects they
// judged (bin/k8s).
const (
	MatrixEnv  = "NVML_MOCK_SYSFS_K8S_MATRIX"
	ObjectsEnv = "NVML_MOCK_SYSFS_K8S_OBJECTS"
)

// AppendMatrix appends a suite's report to MatrixEnv's file: make e2e-k8s
// runs the suites one after another and prints what they all wrote. Unset,
// it goes straight to standard output (t.Log would indent it, and go test
// shows a passing package's output only with -v). A report whose matrices
// judged no row fails t (docmatrix.RequireJudged).
func AppendMatrix(t testing.TB, text string) {
	t.Helper()
	docmatrix.RequireJudged(t, t.Name(), text)
	file := os.Getenv(MatrixEnv)
	if file == "" {
		os.Stdout.WriteString(text)
		return
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString("\n" + text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Errorf("%s: %v", MatrixEnv, err)
	}
}

// ObjectsDir is the directory a suite writes the API objects it judged
// for one profile into, bin/k8s/<name>/ (ObjectsEnv's directory when
// set), emptied of an earlier run's.
func ObjectsDir(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(cmp.Or(os.Getenv(ObjectsEnv), filepath.Join(overlaytest.Repo(t), "bin", "k8s")), name)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WriteObject writes an API object the suite judged into dir (ObjectsDir's)
// as name, indented JSON: v as the API server returned it ([]byte, a GET's
// body, written as it is but indented) or a typed object (marshalled). A
// write that fails is an error of the test, not its end: the judgment
// goes on (a suite writes its objects when a profile fails, too).
func WriteObject(t testing.TB, dir, name string, v any) {
	t.Helper()
	var out bytes.Buffer
	var err error
	switch raw := v.(type) {
	case []byte:
		err = json.Indent(&out, raw, "", "  ")
	default:
		var b []byte
		if b, err = json.MarshalIndent(v, "", "  "); err == nil {
			out.Write(b)
		}
	}
	if err == nil {
		out.WriteByte('\n')
		err = os.WriteFile(filepath.Join(dir, name), out.Bytes(), 0o644)
	}
	if err != nil {
		t.Errorf("cluster: write the judged object %s: %v", filepath.Join(dir, name), err)
	}
}

// specFile is the name the DaemonSet gives our spec (--output=/var/run/cdi/…).
const specFile = "nvml-mock-sysfs.yaml"

// WriteCDISpec writes our CDI spec for the render at root into the node's
// containerd's CDI directory with bin (our binary), as the DaemonSet's
// serve does into /var/run/cdi: the spec of the device pods' annotations
// name.
func (c *Cluster) WriteCDISpec(t testing.TB, bin, root string, flags ...string) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"cdi", "--root", root, "--output", filepath.Join(c.Runtime.CDIDir, specFile)}, flags...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster: nvml-mock-sysfs cdi: %v: %s", err, out)
	}
}
