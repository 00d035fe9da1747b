package cdispec_test

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// Their served namespaces must leave nothing in the host's root.
func TestMain(m *testing.M) { os.Exit(overlaytest.KeepHostRoot(m.Run)) }
