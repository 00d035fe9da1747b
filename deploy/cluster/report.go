package cluster

import (
	"os"
	"testing"
)

// MatrixEnv names the file the Kubernetes suites' matrices go to (make
// e2e-k8s prints it); ObjectsEnv the directory of the API objects they
// judged (bin/k8s).
const (
	MatrixEnv  = "NVML_MOCK_SYSFS_K8S_MATRIX"
	ObjectsEnv = "NVML_MOCK_SYSFS_K8S_OBJECTS"
)

// AppendMatrix appends a suite's report to MatrixEnv's file, if set: the
// suites run one after another and each adds its own.
func AppendMatrix(t testing.TB, text string) {
	t.Helper()
	file := os.Getenv(MatrixEnv)
	if file == "" {
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
