package pciaddr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "0000:07:00.0", want: "0000:07:00.0"},
		{in: "0000:0F:00.0", want: "0000:0f:00.0"},
		{in: "00000000:3B:00.0", want: "0000:3b:00.0"},
		{in: "0000000A:C1:1F.7", want: "000a:c1:1f.7"},
		{in: "ABCD:ef:01.3", want: "abcd:ef:01.3"},
		{in: "", wantErr: "no domain"},
		{in: "07:00.0", wantErr: "4 or 8"},
		{in: "00010000:07:00.0", wantErr: "must start with 0000"},
		{in: "000:07:00.0", wantErr: "4 or 8"},
		{in: "0000:7:00.0", wantErr: "bus has 2"},
		{in: "0000:07:20.0", wantErr: "device number"},
		{in: "0000:07:00.8", wantErr: "function number"},
		{in: "0000:07:00.0 ", wantErr: "DD.F"},
		{in: "0000:0g:00.0", wantErr: "bus"},
		{in: "+000:07:00.0", wantErr: "domain"},
		{in: "0000:../00.0", wantErr: "bus"},
		{in: "0000:07:00.0/../../etc", wantErr: "DD.F"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.ErrorContains(t, err, "is not a PCI address")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got.String())
			require.True(t, IsBDF(got.String()))
		})
	}
}

func TestIsBDF(t *testing.T) {
	require.True(t, IsBDF("0000:07:00.0"))
	require.False(t, IsBDF("0000:0F:00.0"), "upper case is fatal to libpci")
	require.False(t, IsBDF("00000000:07:00.0"), "sysfs never uses the 8-digit domain")
	require.False(t, IsBDF(".anchor"))
}

func TestRootComplex(t *testing.T) {
	rc, err := ParseRootComplex("PCI0000:C0")
	require.NoError(t, err)
	require.Equal(t, "pci0000:c0", rc.String())
	for _, bad := range []string{"pci0000:0", "pci0000-00", "pcixxxx:00", "../../etc", "pci0000:00/..", ""} {
		_, err := ParseRootComplex(bad)
		require.ErrorContains(t, err, "not a root complex id", bad)
	}
	a, err := Parse("0000:80:00.0")
	require.NoError(t, err)
	require.Equal(t, RootComplex{Bus: 0x80}, a.RootComplex())
	require.Equal(t, -1, RootComplex{Bus: 0x00}.Compare(RootComplex{Bus: 0x80}))
	require.Equal(t, 1, RootComplex{Domain: 2}.Compare(RootComplex{Domain: 1, Bus: 0xff}))
	b, err := Parse("0000:07:00.1")
	require.NoError(t, err)
	require.Equal(t, -1, b.Compare(a))
	require.Equal(t, 0, a.Compare(a))
}

func TestCovering(t *testing.T) {
	rcs := []RootComplex{{Domain: 0, Bus: 0x00}, {Domain: 0, Bus: 0x80}, {Domain: 1, Bus: 0x10}}
	tests := []struct {
		addr  string
		want  RootComplex
		found bool
	}{
		{"0000:00:1e.0", rcs[0], true},
		{"0000:7f:00.0", rcs[0], true},
		{"0000:80:00.0", rcs[1], true},
		{"0000:ff:00.0", rcs[1], true},
		{"0001:10:00.0", rcs[2], true},
		{"0001:0f:00.0", RootComplex{}, false},
		{"0002:00:00.0", RootComplex{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			a, err := Parse(tc.addr)
			require.NoError(t, err)
			got, found := Covering(rcs, a)
			require.Equal(t, tc.found, found)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestLastBus(t *testing.T) {
	t.Parallel()
	// Unsorted on purpose: callers pass profile order.
	rcs := []RootComplex{{Domain: 0, Bus: 0x80}, {Domain: 1, Bus: 0x10}, {Domain: 0, Bus: 0x00}, {Domain: 0, Bus: 0x40}}
	tests := []struct {
		rc   RootComplex
		want uint8
	}{
		{RootComplex{Domain: 0, Bus: 0x00}, 0x3f},
		{RootComplex{Domain: 0, Bus: 0x40}, 0x7f},
		{RootComplex{Domain: 0, Bus: 0x80}, 0xff},
		{RootComplex{Domain: 1, Bus: 0x10}, 0xff},
		{RootComplex{Domain: 0, Bus: 0x20}, 0x3f}, // not in rcs: up to the next one
	}
	for _, tc := range tests {
		t.Run(tc.rc.String(), func(t *testing.T) {
			require.Equal(t, tc.want, LastBus(rcs, tc.rc))
		})
	}
}
