package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// readTar returns every entry of a tar archive by name, with its header.
func readTar(t *testing.T, data []byte) (map[string][]byte, map[string]*tar.Header, []string) {
	t.Helper()
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[hdr.Name], headers[hdr.Name] = b, hdr
		order = append(order, hdr.Name)
	}
	return files, headers, order
}

// blob returns a blob of the layout by descriptor, checking its digest and
// size: what an importer checks.
func blob(t *testing.T, layout map[string][]byte, d v1.Descriptor) []byte {
	t.Helper()
	b, ok := layout["blobs/sha256/"+d.Digest.Encoded()]
	require.True(t, ok, "blob %s is missing", d.Digest)
	require.Equal(t, d.Digest, digest.FromBytes(b))
	require.Equal(t, d.Size, int64(len(b)))
	return b
}

func testImage(t *testing.T) Image {
	src := filepath.Join(t.TempDir(), "prog")
	require.NoError(t, os.WriteFile(src, []byte("#!binary"), 0o755))
	return Image{
		Name: "docker.io/library/demo:v1",
		Files: []File{
			{Path: "/bin/prog", Source: src},
			{Path: "/etc/demo/config.yaml", Data: []byte("a: 1\n")},
			{Path: "/tmp", Mode: fs.ModeDir | 0o1777},
			{Path: "/lib", Mode: fs.ModeSymlink, Link: "usr/lib"},
		},
		Entrypoint: []string{"/bin/prog"},
		Cmd:        []string{"serve"},
		Env:        []string{"A=b"},
		WorkingDir: "/",
	}
}

func TestWrite(t *testing.T) {
	img := testImage(t)
	var out bytes.Buffer
	require.NoError(t, Write(&out, img))
	layout, _, _ := readTar(t, out.Bytes())

	require.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(layout["oci-layout"]))
	var index v1.Index
	require.NoError(t, json.Unmarshal(layout["index.json"], &index))
	require.Equal(t, 2, index.SchemaVersion)
	require.Len(t, index.Manifests, 1)
	md := index.Manifests[0]
	require.Equal(t, v1.MediaTypeImageManifest, md.MediaType)
	require.Equal(t, map[string]string{AnnotationImageName: "docker.io/library/demo:v1", v1.AnnotationRefName: "v1"}, md.Annotations)

	var manifest v1.Manifest
	require.NoError(t, json.Unmarshal(blob(t, layout, md), &manifest))
	require.Equal(t, v1.MediaTypeImageConfig, manifest.Config.MediaType)
	require.Len(t, manifest.Layers, 1)
	require.Equal(t, v1.MediaTypeImageLayer, manifest.Layers[0].MediaType)

	var config v1.Image
	require.NoError(t, json.Unmarshal(blob(t, layout, manifest.Config), &config))
	require.Equal(t, "linux", config.OS)
	require.Equal(t, md.Platform.Architecture, config.Architecture)
	require.Equal(t, []string{"/bin/prog"}, config.Config.Entrypoint)
	require.Equal(t, []string{"serve"}, config.Config.Cmd)
	require.Equal(t, []string{"A=b"}, config.Config.Env)
	layer := blob(t, layout, manifest.Layers[0])
	require.Equal(t, []digest.Digest{digest.FromBytes(layer)}, config.RootFS.DiffIDs, "an uncompressed layer's diff id is its digest")

	files, headers, order := readTar(t, layer)
	require.Equal(t, []string{"bin/", "bin/prog", "etc/", "etc/demo/", "etc/demo/config.yaml", "lib", "tmp/"}, order, "sorted, with the parents added")
	require.Equal(t, "#!binary", string(files["bin/prog"]))
	require.Equal(t, int64(0o755), headers["bin/prog"].Mode, "a Source file keeps its mode")
	require.Equal(t, int64(0o644), headers["etc/demo/config.yaml"].Mode)
	require.Equal(t, int64(0o755), headers["etc/demo/"].Mode)
	require.Equal(t, int64(0o1777)&0o777, headers["tmp/"].Mode&0o777)
	require.Equal(t, "usr/lib", headers["lib"].Linkname)
	for name, h := range headers {
		require.Zero(t, h.ModTime.Unix(), name)
		require.Zero(t, h.Uid, name)
	}

	var again bytes.Buffer
	require.NoError(t, Write(&again, img))
	require.Equal(t, out.Bytes(), again.Bytes(), "deterministic")
}

func TestWriteRefuses(t *testing.T) {
	tests := []struct {
		name    string
		img     Image
		wantErr string
	}{
		{"no name", Image{}, "Name is empty"},
		{"relative path", Image{Name: "x:1", Files: []File{{Path: "bin/x"}}}, `file "bin/x": Path must be absolute`},
		{"unclean path", Image{Name: "x:1", Files: []File{{Path: "/bin/../x"}}}, "absolute and clean"},
		{"twice", Image{Name: "x:1", Files: []File{{Path: "/x"}, {Path: "/x"}}}, `file "/x": named twice`},
		{"file as a parent", Image{Name: "x:1", Files: []File{{Path: "/x"}, {Path: "/x/y"}}}, `file "/x/y": its parent /x is not a directory`},
		{"link without target", Image{Name: "x:1", Files: []File{{Path: "/l", Mode: fs.ModeSymlink}}}, "needs Link"},
		{"missing source", Image{Name: "x:1", Files: []File{{Path: "/x", Source: "/nonexistent/file"}}}, "/nonexistent/file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, Write(io.Discard, tc.img), tc.wantErr)
		})
	}
}

// TestPodmanLoads has an independent reader, podman's (containers/image),
// load the archive into a private store and read back its config.
func TestPodmanLoads(t *testing.T) {
	overlaytest.SkipUnlessRoot(t, "podman with a private store")
	overlaytest.RequireProgram(t, "podman", "podman")
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	require.NoError(t, WriteFile(archive, testImage(t)))
	podman := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("podman", append([]string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
	podman("load", "-i", archive)
	out := podman("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{json .Config.Cmd}}", "docker.io/library/demo:v1")
	require.Equal(t, `["/bin/prog"] ["serve"]`, strings.TrimSpace(out))
	t.Cleanup(func() {
		_ = exec.Command("podman", "--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs", "system", "reset", "--force").Run()
	})
}

// A program that imports only ociimage writes an image. This test binary
// cannot show it by calling Write: testify and the other test imports link
// crypto/sha256 in, which hides a missing import of it in the package
// (go-digest then panics "sha256 not available" in every other program).
func TestWriteFromAProgramOfItsOwn(t *testing.T) {
	bin := hosttest.BuildStatic(t, "./deploy/e2e/ociimage/testdata/writeimage")
	out, err := exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "a program that links only ociimage:\n%s", out)
}
