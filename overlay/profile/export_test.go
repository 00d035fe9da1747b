package profile

import "testing"

// NvmlMockKeys exposes the key list derived from nvml-mock's config types
// to the external tests, which derive it again and compare.
const NvmlMockKeys = nvmlMockKeys

// SharedProfilesDir is how the internal tests find nvml-mock's profiles
// beside the repository: the external tests set it to
// overlaytest.SharedTestdata, which fails under make where ../shared is
// absent and otherwise skips saying why. The internal tests cannot import
// overlaytest themselves (it imports this package).
var SharedProfilesDir = &sharedProfilesDir

var sharedProfilesDir func(testing.TB) string
