package plan

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/utils/cpuset"
)

func TestCPUMask(t *testing.T) {
	tests := []struct {
		cpus     string
		possible int
		want     string
	}{
		{"0-1", 2, "3"},
		{"0-7", 8, "ff"},
		{"0-31", 32, "ffffffff"},
		{"32-63", 64, "ffffffff,00000000"},
		{"0,71", 72, "80,00000000,00000001"},
	}
	for _, tt := range tests {
		h := HostCPUs{Possible: tt.possible}
		set, err := cpuset.Parse(tt.cpus)
		require.NoError(t, err)
		require.Equal(t, tt.want, cpuMask(set, h.Possible), tt.cpus)
	}
}
