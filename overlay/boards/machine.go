package boards

// The DMI product names of the NVIDIA systems the SXM and superchip boards
// ship in, as /sys/class/dmi/id/product_name shows them there and GPU
// Feature Discovery labels them (nvidia.com/gpu.machine). A board that goes
// into many vendors' machines (a PCIe card) names none: no single name is
// true. Each name is the one NVIDIA's own documentation gives the system:
const (
	// DGX A100 User Guide (docs.nvidia.com/dgx/dgxa100-user-guide).
	machineDGXA100 = "DGX A100"
	// DGX H100/H200 User Guide (docs.nvidia.com/dgx/dgxh100-user-guide),
	// one guide for both systems.
	machineDGXH100 = "DGX H100"
	machineDGXH200 = "DGX H200"
	// "Introduction to NVIDIA DGX B200 Systems",
	// docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html.
	machineDGXB200 = "DGX B200"
	// "DGX SuperPOD Reference Architecture: DGX GB200",
	// docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-gb200
	// ("NVIDIA DGX GB200 systems").
	machineDGXGB200 = "DGX GB200"
	// "DGX GB300 Release Notes", docs.nvidia.com/dgx/dgxgb300nvl72-release-notes
	// ("host software versions tested with DGX GB300"), and the DGX GB
	// firmware update guide's "NVIDIA DGX GB300 systems".
	machineDGXGB300 = "DGX GB300"
	// NVIDIA sells the Vera Rubin rack as "NVIDIA Vera Rubin NVL72": the
	// "NVIDIA Vera Rubin NVL72 AI Factory" reference architecture
	// (docs.nvidia.com/reference-architectures/vera-rubin-nvl72-ai-factory,
	// "the NVIDIA Vera Rubin NVL72 system") and the "Vera-Rubin NVL72"
	// tuning guide (docs.nvidia.com/dccpu/vera-mn-perf-tuning-guide). The
	// NVL144 of its 2025 announcement is the same rack counted by dies.
	machineVeraRubinNVL72 = "Vera Rubin NVL72"
)
