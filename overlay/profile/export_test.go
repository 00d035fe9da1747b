package profile

// NvmlMockKeys exposes the key list derived from nvml-mock's config types
// to the external tests, which derive it again and compare.
const NvmlMockKeys = nvmlMockKeys
