package sysfs

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLinkSpeedRoundTrip(t *testing.T) {
	t.Parallel()
	for gen := 1; gen <= MaxLinkGen; gen++ {
		got, ok := LinkGen(LinkSpeed(gen))
		require.True(t, ok, "gen %d", gen)
		require.Equal(t, gen, got)
	}
	require.Equal(t, "16.0 GT/s PCIe", LinkSpeed(4))
	require.Equal(t, "Unknown", LinkSpeed(0))
	require.Equal(t, "Unknown", LinkSpeed(MaxLinkGen+1))
	_, ok := LinkGen("Unknown")
	require.False(t, ok)
	require.True(t, ValidLinkGen(1))
	require.True(t, ValidLinkGen(MaxLinkGen))
	require.False(t, ValidLinkGen(0))
	require.False(t, ValidLinkGen(MaxLinkGen+1))
}

// TestLinkSpeedTexts pins each generation's text to the kernel's
// pci_speed_string: the renderer and every checker read them from here.
func TestLinkSpeedTexts(t *testing.T) {
	t.Parallel()
	want := []string{"2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"}
	for i, text := range want {
		require.Equal(t, text, LinkSpeed(i+1), "gen %d", i+1)
	}
}

func TestLinkWidths(t *testing.T) {
	t.Parallel()
	require.Equal(t, "1, 2, 4, 8, 12, 16 or 32", LinkWidthsText())
	require.True(t, ValidLinkWidth(16))
	require.False(t, ValidLinkWidth(3))
}

func TestLinksDepth(t *testing.T) {
	t.Parallel()
	require.Equal(t, LinksDepth, strings.Count(KernelLinksDir, "/"), "LinksDepth counts KernelLinksDir's directories")
	require.Equal(t, "../../", Up(2))
}

func TestModalias(t *testing.T) {
	t.Parallel()
	require.Equal(t, "pci:v000010DEd000020B0sv000010DEsd0000134Fbc03sc02i00",
		Modalias(0x10de, 0x20b0, 0x10de, 0x134f, 0x030200))
}

func TestLinkFields(t *testing.T) {
	t.Parallel()
	for _, w := range LinkWidths() {
		for gen := 1; gen <= MaxLinkGen; gen++ {
			reg := LinkFields(gen, w) | 0xab<<24 // a port number above the fields
			require.Equal(t, gen, LinkSpeedGen(reg))
			require.Equal(t, w, LinkWidth(reg))
		}
	}
	require.Equal(t, uint32(0x105), LinkFields(5, 16), "Gen5 x16 as an H100's LnkCap holds it")
}

// TestVFIODevName pins the vfio device names that compat accepts to the
// ones the renderer writes, and nothing looser.
func TestVFIODevName(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 9, 10, 255} {
		require.True(t, IsVFIODevName(VFIODevName(n)), VFIODevName(n))
	}
	for _, s := range []string{"", "vfio", "vfio-1", "vfio+1", "vfio01", "vfio1a", "VFIO0", "iommufd0", " vfio0"} {
		require.False(t, IsVFIODevName(s), "%q", s)
	}
}

func TestWalk(t *testing.T) {
	w := NewWalk("a//./b")
	var got []string
	for c, more := w.Next(); more; c, more = w.Next() {
		got = append(got, c)
		if c == "a" {
			require.True(t, w.Follow("x/../y"), "a link's text is spliced in")
		}
	}
	require.Equal(t, []string{"a", "x", "..", "y", "b"}, got)

	loop := NewWalk("l")
	for range MaxFollows {
		loop.Next()
		require.True(t, loop.Follow("l"))
	}
	require.False(t, loop.Follow("l"), "the kernel gives up after %d links", MaxFollows)
	require.Equal(t, []string{"l"}, loop.Rest())
}
