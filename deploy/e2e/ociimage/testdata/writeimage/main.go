// Command writeimage writes a one-file image to stdout with nothing but
// package ociimage linked in: a test runs it to prove that ociimage works
// from any program, not only from test binaries, whose other imports happen
// to register the sha256 hash that go-digest needs.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
)

func main() {
	img := ociimage.Image{
		Name:       "docker.io/library/writeimage:test",
		Files:      []ociimage.File{{Path: "/hello", Data: []byte("hello\n")}},
		Entrypoint: []string{"/hello"},
	}
	if err := ociimage.Write(io.Discard, img); err != nil {
		fmt.Fprintln(os.Stderr, "writeimage:", err)
		os.Exit(1)
	}
}
