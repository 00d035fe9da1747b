package serve

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// dirFiles are the files of dir and their contents; one the mirror
// removes while they are read is left out.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		out[e.Name()] = string(data)
	}
	return out
}

// TestFleetMirror: the directory holds the ConfigMap's keys from the first
// Wait, follows each update (a key gone is removed), and keeps the last
// keys when the ConfigMap is deleted.
func TestFleetMirror(t *testing.T) {
	name := types.NamespacedName{Namespace: "nvml-mock", Name: "nvml-mock-sysfs-fleet"}
	data := map[string]string{"fleet.yaml": "default: gb200.yaml\n", "gb200.yaml": "version: \"1.0\"\n"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}, Data: data}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: "another"}, Data: map[string]string{"x.yaml": "x"}}
	c := fake.NewSimpleClientset(cm, other)
	dir := filepath.Join(t.TempDir(), "fleet")
	m, err := NewFleetMirror(c, name, dir, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	require.NoError(t, m.Wait(ctx, 10*time.Second))
	require.Equal(t, data, dirFiles(t, dir))

	updated := map[string]string{"fleet.yaml": "default: t4-vm\n", "h100.yaml": "version: \"1.0\"\n"}
	cm = cm.DeepCopy()
	cm.Data = updated
	_, err = c.CoreV1().ConfigMaps(name.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return maps.Equal(updated, dirFiles(t, dir)) }, 10*time.Second, 10*time.Millisecond, "%v", dirFiles(t, dir))

	require.NoError(t, c.CoreV1().ConfigMaps(name.Namespace).Delete(ctx, name.Name, metav1.DeleteOptions{}))
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, updated, dirFiles(t, dir), "the last map serves on")
}
