module nvml-mock-sysfs.test/nvml-list

go 1.26.0

require github.com/NVIDIA/go-nvml v0.13.3-1
