package programs_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// The parsers read the programs' real output, abridged from runs against
// a rendered h100 tree.

func TestParseGFDLabels(t *testing.T) {
	labels, err := programs.ParseGFDLabels([]byte("nvidia.com/gpu.count=8\nnvidia.com/gpu.mode=compute\n\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/gpu.mode": "compute"}, labels)
	_, err = programs.ParseGFDLabels([]byte("nvidia.com/gpu.count=8\nnot a label\n"))
	require.EqualError(t, err, `GFD output line 2: "not a label" is not label=value`)
}

func TestParseNFDLabels(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		want      map[string]string
		err       string
	}{
		{
			name: "labels",
			log: `I1202 17:52:26.670100   31455 nfd-worker.go:345] "feature discovery completed" featureSource="pci" duration="1.2ms"
I1202 17:52:26.670244   31455 nfd-worker.go:783] "feature discovery completed" labels=<
	feature.node.kubernetes.io/pci-0302_10de.present: "true"
	feature.node.kubernetes.io/pci-0604_8086.present: "true"
 >
`,
			want: map[string]string{"feature.node.kubernetes.io/pci-0302_10de.present": "true", "feature.node.kubernetes.io/pci-0604_8086.present": "true"},
		},
		{
			name: "none",
			log: `I1202 17:52:29.378979   31535 nfd-worker.go:783] "feature discovery completed" labels=<
	{}
 >
`,
			want: map[string]string{},
		},
		{
			name: "below verbosity 1",
			log:  `I1202 17:52:29.378979   31535 nfd-worker.go:785] "feature discovery completed"` + "\n",
			err:  `nfd-worker log: "I1202 17:52:29.378979   31535 nfd-worker.go:785] \"feature discovery completed\"" has no labels (run it with -v 1)`,
		},
		{
			name: "cut short",
			log:  `I1202 nfd-worker.go:783] "feature discovery completed" labels=<` + "\n\tfeature.node.kubernetes.io/pci-0302_10de.present: \"true\"\n",
			err:  `nfd-worker log: the labels of "I1202 nfd-worker.go:783] \"feature discovery completed\" labels=<" never end`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels, err := programs.ParseNFDLabels([]byte(tc.log))
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, labels)
		})
	}
}

func TestParseNVMLDevices(t *testing.T) {
	devices, err := programs.ParseNVMLDevices([]byte(`[{"index": 0, "busId": "0000000A:05:00.0", "pciDeviceId": 590352606, "pciSubSystemId": 374870238, "pcieRoot": "pci000a:00"}, {"index": 1, "busId": "0000000A:06:00.0", "pciDeviceId": 590352606, "pciSubSystemId": 374870238, "pcieRootError": "no such device"}]`))
	require.NoError(t, err)
	require.Len(t, devices, 2)
	require.Equal(t, "pci000a:00", devices[0].PCIeRoot)
	require.Empty(t, devices[1].PCIeRoot)
	require.Equal(t, "no such device", devices[1].PCIeRootError)
	a, err := devices[0].Address()
	require.NoError(t, err)
	require.Equal(t, "000a:05:00.0", a.String())
	require.Equal(t, uint32(0x233010de), devices[0].DeviceID)
}

func TestWriteDriverRoot(t *testing.T) {
	mock, root := t.TempDir(), filepath.Join(t.TempDir(), "driver")
	require.NoError(t, os.WriteFile(filepath.Join(mock, programs.MockNVML), []byte("ELF"), 0o755))
	require.NoError(t, programs.WriteDriverRoot(root, mock))
	lib, err := os.ReadFile(filepath.Join(root, "usr/lib64/libnvidia-ml.so.1"))
	require.NoError(t, err)
	require.Equal(t, "ELF", string(lib))
	info, err := os.Stat(filepath.Join(root, "usr/bin/nvidia-smi"))
	require.NoError(t, err)
	require.NotZero(t, info.Mode()&0o111, "nvidia-smi must be executable")
}
