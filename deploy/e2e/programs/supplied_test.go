package programs_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

func TestSupplied(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, programs.GPUKubeletPlugin), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, programs.MockNVML), []byte("ELF"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, programs.Dranet), []byte("not executable"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, programs.DeviceInjector), 0o755))
	s := programs.Supplied{Dir: dir}

	p, err := s.Path(programs.GPUKubeletPlugin)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, programs.GPUKubeletPlugin), p)
	_, err = s.Path(programs.MockNVML)
	require.NoError(t, err, "a library need not be executable")

	var missing *programs.NotSuppliedError
	_, err = s.Path(programs.RenderPCISysfs)
	require.ErrorAs(t, err, &missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Contains(t, err.Error(), "render-pci-sysfs not supplied")
	_, err = s.Path(programs.Dranet)
	require.ErrorContains(t, err, "is not executable")
	_, err = s.Path(programs.DeviceInjector)
	require.ErrorContains(t, err, "not a file")

	_, err = programs.Supplied{Dir: ""}.Path(programs.Dranet)
	if os.Getenv(programs.SuppliedEnv) == "" {
		require.EqualError(t, err, "dranet not supplied (NVML_MOCK_SYSFS_PROGRAMS is unset)")
	}
	_, err = s.Describe()
	require.ErrorContains(t, err, "device-injector", "an unusable program is an error, not a row not run")

	require.Equal(t, "not run: dranet not supplied: a row", programs.NotRun("a row", programs.Dranet))
}
