// Package ociimage writes a container image as an OCI image layout in one
// tar archive, the form `ctr images import` (and podman load) accepts, so
// tests can run images built here from local files: no registry, no build
// engine. An image is one uncompressed layer of the files given, a config
// with the entrypoint, command and environment, and a manifest, each
// addressed by its sha256 digest.
//
// The output is deterministic: the same Image gives the same bytes, so the
// same digests, whenever and wherever it is written.
package ociimage

import (
	"archive/tar"
	"bytes"
	"cmp"
	// go-digest hashes through crypto.SHA256, which is only available once
	// crypto/sha256 is linked in; without this import every program but our
	// test binaries (whose other imports pull it in) panics with "sha256 not
	// available" at the first digest.
	_ "crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// AnnotationImageName is the index annotation containerd's importer takes
// the image's full name from (org.opencontainers.image.ref.name holds only
// a tag there).
const AnnotationImageName = "io.containerd.image.name"

// File is one entry of the image's layer.
type File struct {
	// Path is the absolute path in the image, such as /nvml-mock-sysfs.
	Path string
	// Source is a host file whose content is copied. Empty uses Data.
	Source string
	// Data is the content when Source is empty.
	Data []byte
	// Mode is the permission bits, plus fs.ModeDir for an empty directory
	// or fs.ModeSymlink for a link to Link. Zero means 0644; a Source file
	// keeps its own permission bits when Mode is zero.
	Mode fs.FileMode
	// Link is the target of a symbolic link (Mode has fs.ModeSymlink).
	Link string
}

// Image is what an image holds and how it runs.
type Image struct {
	// Name is the full reference it is imported as, such as
	// docker.io/library/nvml-mock-sysfs:test.
	Name string
	// Files are the layer's entries. Parent directories are added as 0755
	// where no File names them.
	Files []File
	// Entrypoint, Cmd, Env and WorkingDir are the image config's.
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	// Architecture is GOARCH's name for the platform; empty means this
	// machine's.
	Architecture string
}

// Write writes img as an OCI image layout tar archive.
func Write(w io.Writer, img Image) error {
	if img.Name == "" {
		return fmt.Errorf("image: Name is empty: containerd imports an unnamed image under no name")
	}
	layer, err := Layer(img.Files)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	arch := img.Architecture
	arch = cmp.Or(arch, runtime.GOARCH)
	platform := v1.Platform{OS: "linux", Architecture: arch}
	config := v1.Image{
		Platform: platform,
		Config: v1.ImageConfig{
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			Env:        img.Env,
			WorkingDir: img.WorkingDir,
		},
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layer)}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return err
	}
	manifest := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    descriptor(v1.MediaTypeImageConfig, configJSON),
		Layers:    []v1.Descriptor{descriptor(v1.MediaTypeImageLayer, layer)},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	manifestDesc := descriptor(v1.MediaTypeImageManifest, manifestJSON)
	manifestDesc.Platform = &platform
	manifestDesc.Annotations = map[string]string{
		AnnotationImageName:  img.Name,
		v1.AnnotationRefName: tagOf(img.Name),
	}
	index := v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{manifestDesc},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	layoutJSON, err := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{v1.ImageLayoutFile, layoutJSON},
		{v1.ImageIndexFile, indexJSON},
		{blobPath(layer), layer},
		{blobPath(configJSON), configJSON},
		{blobPath(manifestJSON), manifestJSON},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}); err != nil {
			return err
		}
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// WriteFile writes img's archive to a file.
func WriteFile(name string, img Image) error {
	var buf bytes.Buffer
	if err := Write(&buf, img); err != nil {
		return err
	}
	return os.WriteFile(name, buf.Bytes(), 0o644)
}

func descriptor(mediaType string, data []byte) v1.Descriptor {
	return v1.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

func blobPath(data []byte) string {
	d := digest.FromBytes(data)
	return path.Join(v1.ImageBlobsDir, d.Algorithm().String(), d.Encoded())
}

// tagOf is the tag of a reference (after the last colon that follows the
// last slash), or "latest".
func tagOf(name string) string {
	last := name[strings.LastIndex(name, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		return last[i+1:]
	}
	return "latest"
}

// Layer returns the uncompressed tar of files, sorted by path, owned by
// root, with every time at the epoch, and every missing parent directory
// added.
func Layer(files []File) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("file %q: Path must be absolute and clean, and not /", f.Path)
		}
		if _, dup := byPath[f.Path]; dup {
			return nil, fmt.Errorf("file %q: named twice", f.Path)
		}
		byPath[f.Path] = f
	}
	for _, f := range files {
		for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
			if prev, ok := byPath[dir]; ok {
				if !prev.Mode.IsDir() {
					return nil, fmt.Errorf("file %q: its parent %s is not a directory", f.Path, dir)
				}
				continue
			}
			byPath[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(byPath)) {
		if err := writeEntry(tw, byPath[p]); err != nil {
			return nil, fmt.Errorf("file %q: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, f File) error {
	name := strings.TrimPrefix(f.Path, "/")
	// The epoch, not the zero time, which tar cannot encode.
	hdr := &tar.Header{Name: name, Mode: int64(f.Mode.Perm()), ModTime: time.Unix(0, 0)}
	switch {
	case f.Mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if hdr.Mode == 0 {
			hdr.Mode = 0o755
		}
		return tw.WriteHeader(hdr)
	case f.Mode&fs.ModeSymlink != 0:
		if f.Link == "" {
			return fmt.Errorf("a symbolic link needs Link")
		}
		hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		return tw.WriteHeader(hdr)
	case f.Mode.Type() != 0:
		return fmt.Errorf("mode %v: only files, directories and symbolic links", f.Mode)
	}
	data := f.Data
	if f.Source != "" {
		var err error
		if data, err = os.ReadFile(f.Source); err != nil {
			return err
		}
		if hdr.Mode == 0 {
			info, err := os.Stat(f.Source)
			if err != nil {
				return err
			}
			hdr.Mode = int64(info.Mode().Perm())
		}
	}
	if hdr.Mode == 0 {
		hdr.Mode = 0o644
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
