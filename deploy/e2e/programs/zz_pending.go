package programs

// Placeholders until the stand-in lands (helper).
func GFD() Program                                             { return Program{Name: "gpu-feature-discovery"} }
func NVMLStandIn() Program                                     { return Program{Name: "nvml-stand-in"} }
func WriteStandInConfig(path string, nvmlProfile []byte) error { return nil }
