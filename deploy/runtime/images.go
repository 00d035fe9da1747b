package runtime

import (
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// pauseProgram is the sandbox's program, built static from the
// repository: testdata keeps it out of the product's packages.
const pauseProgram = "./deploy/runtime/testdata/pause"

// pauseImage is the sandbox image: the pause program alone.
func pauseImage(t testing.TB) ociimage.Image {
	t.Helper()
	return ociimage.Image{
		Name:       PauseImage,
		Files:      []ociimage.File{{Path: "/pause", Source: overlaytest.BuildStatic(t, pauseProgram), Mode: 0o755}},
		Entrypoint: []string{"/pause"},
	}
}
