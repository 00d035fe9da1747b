package profile_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

const gpu = "devices:\n  - pci:\n      bus_id: \"0000:18:00.0\"\n      device_id: 0x233010DE\n"

// laughs builds a billion-laughs document: levels of nine aliases each,
// the last one used at the given key. Nine levels expand to 9^9 scalars;
// the seventh (l6, 9^7 nodes) is the first past the limit.
func laughs(levels int, indent, use string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%sl0: &l0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n", indent)
	for i := 1; i < levels; i++ {
		ref := fmt.Sprintf("*l%d", i-1)
		fmt.Fprintf(&b, "%sl%d: &l%d [%s]\n", indent, i, i, strings.TrimSuffix(strings.Repeat(ref+",", 9), ","))
	}
	fmt.Fprintf(&b, "%s%s: *l%d\n", indent, use, levels-1)
	return b.String()
}

func TestParseGuards(t *testing.T) {
	cases := []struct {
		name  string
		yaml  string
		field string
		want  string
	}{
		{"alias bomb under devices", laughs(9, "", "devices"), "l6", "alias bomb"},
		{"alias bomb under an ignored field", "system:\n" + laughs(9, "  ", "bomb") + gpu, "system.l6", "alias bomb"},
		{"an alias inside its own anchor", "a: &a [1, *a]\n" + gpu, "a[1]", "refers to its own anchor"},
		{"a small alias is fine", "x: &x 0x233010DE\ndevices:\n  - pci:\n      bus_id: \"0000:18:00.0\"\n      device_id: *x\n", "", ""},
		{"float for an integer", gpu + "    pcie:\n      max_link_width: 16.0\n", "devices[0].pcie.max_link_width", "want an integer, found a float"},
		{"float through an alias", "w: &w 8.5\n" + gpu + "    pcie:\n      max_link_width: *w\n", "devices[0].pcie.max_link_width", "found a float"},
		{"float for a 64-bit size", gpu + "    bar1_memory:\n      total_bytes: 1.5e9\n", "devices[0].bar1_memory.total_bytes", "found a float"},
		{"float under an ignored field is fine", "system:\n  power: 700.5\n" + gpu, "", ""},
		{"a key with a newline stays on one line", "\"sys\\ntem\":\n" + laughs(9, "  ", "bomb") + gpu, "sys\ntem.l6", "\"sys\\ntem.l6\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := profile.Parse("test.yaml", []byte(tc.yaml))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			var pe *profile.Error
			require.True(t, errors.As(err, &pe), "%v", err)
			require.Equal(t, tc.field, pe.Field)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

// TestLoadFileRefusesSpecialFiles names a FIFO as the profile: opening it
// must not wait for a writer.
func TestLoadFileRefusesSpecialFiles(t *testing.T) {
	fifo := t.TempDir() + "/fifo.yaml"
	require.NoError(t, mkfifo(fifo))
	_, err := profile.LoadFile(fifo)
	require.ErrorContains(t, err, "not a regular file")
	_, err = profile.LoadFile(os.DevNull)
	require.ErrorContains(t, err, "not a regular file")
}

// BenchmarkParseAliasBomb shows a billion-laughs document costs time and
// memory linear in its size, whether the bomb sits under a decoded field
// or an ignored one.
func BenchmarkParseAliasBomb(b *testing.B) {
	for name, doc := range map[string]string{
		"devices": laughs(9, "", "devices"),
		"ignored": "system:\n" + laughs(9, "  ", "bomb") + gpu,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := profile.Parse("bomb.yaml", []byte(doc)); err == nil {
					b.Fatal("the bomb was accepted")
				}
			}
		})
	}
}
