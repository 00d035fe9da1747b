package containerdtest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// procHookNRIPage is the docs page that holds TestServeNRIProcHook's rows,
// beside TestProcHook's.
func procHookNRIPage() docmatrix.Page {
	return docmatrix.Page{Path: procHookPage().Path, Suite: "deploy/e2e/containerdtest TestServeNRIProcHook", Keys: 2}
}

// procHookNRIMatrixEnv names a file TestServeNRIProcHook also writes its
// rows to (the sabotage suite reads them there).
const procHookNRIMatrixEnv = "NVML_MOCK_SYSFS_NRI_PROCHOOK_MATRIX"

// procHookFailuresMetric is serve's count of the containers the hook
// could not serve.
const procHookFailuresMetric = "nvml_mock_sysfs_proc_hook_failures_total"

// TestServeNRIProcHook serves /proc through containerd's NRI, as a node
// does: serve --nri --proc-hook-binary on the real containerd and runc,
// its adjustment carrying the createContainer hook, which runc runs at
// StartContainer. A pod that asks for nothing sees the rendered
// /proc/driver/nvidia/version, /proc/devices and a GPU's information
// file; the control, the same container opted out, sees the node's. A
// container whose root the hook cannot serve (a rendered proc/driver
// that is a file) starts anyway, counted in serve's /metrics. The host's
// /proc is the same after as before. A sabotaged run (programs.Sabotage)
// has serve serve a root it cannot render (containerdtest.ServeNRIOptions):
// every served row turns red, the hook finding no render, and the failure
// it would count never happens; the control stays green.
func TestServeNRIProcHook(t *testing.T) {
	h := containerdtest.Start(t, containerdtest.Options{})
	s := serve(t, h, unseenProfile)
	hostBefore := hostProc(t)
	rows := &docmatrix.Rows{}
	defer func() {
		table := rows.Table("row", "container", "shows")
		t.Logf("proc-hook through serve --nri:\n%s", table)
		writeMatrix(t, procHookNRIPage(), procHookNRIMatrixEnv, table)
	}()
	version := driverVersion(t, s.profile)
	gpu := s.facts.NVIDIABound()[0].BusID
	information := "driver/nvidia/gpus/" + gpu + "/information"

	t.Run("served", func(t *testing.T) {
		s.startServeNRI(t, false, "--proc-hook-binary", filepath.Join(t.TempDir(), "nvml-mock-sysfs"))
		// The files the rows read, named rather than listed from s.root,
		// which a sabotaged run leaves empty.
		files := []string{information}
		served := procHookContainer(t, h, containerdtest.Pod{Name: "nri-proc-hook"}, files)
		node := procHookContainer(t, h, containerdtest.Pod{Name: "nri-proc-hook-opt-out", Annotations: map[string]string{nriplugin.NVMLMockInjectAnnotation: "false"}}, files)
		t.Run("version", func(t *testing.T) {
			rows.Expect(t, "/proc/driver/nvidia/version", "served", "NVRM version: NVIDIA UNIX, the profile's "+version)
			require.Regexp(t, `^NVRM version: NVIDIA UNIX x86_64 Kernel Module  `+regexp.QuoteMeta(version)+`  `, served["file:driver/nvidia/version"])
		})
		t.Run("devices", func(t *testing.T) {
			rows.Expect(t, "/proc/devices", "served", "195 nvidia and nvidia-uvm listed")
			require.Regexp(t, `(?m)^195 nvidia$`, served["file:devices"])
			require.Regexp(t, `(?m)^\s*\d+ nvidia-uvm$`, served["file:devices"])
		})
		t.Run("information", func(t *testing.T) {
			rows.Expect(t, "/proc/"+information, "served", "the rendered file, byte for byte")
			rendered, err := os.ReadFile(filepath.Join(s.root, plan.ProcDir, information))
			require.NoError(t, err, "the render's information file for GPU %s", gpu)
			require.Equal(t, string(rendered), served["file:"+information])
		})
		t.Run("gate", func(t *testing.T) {
			requireGate(t, rows, "served", "passes", served["gate"])
		})
		t.Run("control: opted out", func(t *testing.T) {
			requireNodeProc(t, rows, "opted out (control)", node)
		})
	})

	t.Run("fails open", func(t *testing.T) {
		rows.Expect(t, "a rendered proc/driver that is a file", "served", "starts with the node's /proc/driver, counted in "+procHookFailuresMetric)
		// A root of its own, which serve renders once and does not sync
		// again while the test breaks it.
		root := filepath.Join(t.TempDir(), "overlay")
		hookBinary := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
		n := h.StartServeNRI(t, s.bin, containerdtest.ServeNRIOptions{Root: root, Profile: s.profile,
			Flags: []string{"--proc-hook-binary", hookBinary, "--no-watch", "--resync", "1h"}})
		podtest.Until(t, 30*time.Second, "serve's first sync", func() (bool, string) {
			return n.Metric(t, "nvml_mock_sysfs_syncs_total") > 0, n.Plugin.Log()
		})
		require.Zero(t, n.Metric(t, procHookFailuresMetric))
		driver := filepath.Join(root, plan.ProcDir, "driver")
		require.NoError(t, os.RemoveAll(driver))
		// Where serve rendered root, a no-op; in a sabotaged run, which
		// serves another root, the broken file is still made, and the row
		// turns red where it must: nothing counted.
		require.NoError(t, os.MkdirAll(filepath.Dir(driver), 0o755))
		require.NoError(t, os.WriteFile(driver, []byte("a file\n"), 0o644))
		failed := procHookContainer(t, h, containerdtest.Pod{Name: "nri-proc-hook-fails"}, nil)
		require.NotContains(t, failed["file:driver/nvidia/version"], "NVRM")
		require.Equal(t, 1, n.Metric(t, procHookFailuresMetric), "the hook's failures file:\n%s", readOr(cdispec.ProcHookFailures(hookBinary)))
	})

	t.Run("host", func(t *testing.T) {
		rows.Expect(t, "the host's /proc and /sys/module", "after every container", "unchanged: no mount below them, the same /proc/devices and /proc/driver")
		require.Equal(t, hostBefore, hostProc(t))
	})
}

// procHookContainer runs procHookScript, naming files, in a container of
// a new pod, and returns its sections; the container must exit 0.
func procHookContainer(t *testing.T, h *containerdtest.Harness, pod containerdtest.Pod, files []string) map[string]string {
	t.Helper()
	res := h.RunPod(t, pod).Run(t, containerdtest.Container{
		Name: "proc", Image: containerdtest.ConsumerImage,
		Command: procHookCommand(files),
		Mounts:  []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}},
	})
	require.Zero(t, res.ExitCode, "pod %s: %s%s", pod.Name, res.Stdout, res.Stderr)
	return sections(res.Stdout)
}

// driverVersion is the profile's system.driver_version.
func driverVersion(t *testing.T, profile string) string {
	t.Helper()
	facts, err := profilefacts.Read(profile)
	require.NoError(t, err)
	require.NotEmpty(t, facts.DriverVersion, "profile %s: system.driver_version", profile)
	return facts.DriverVersion
}

// readOr is a file's content, or why it could not be read.
func readOr(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
