package profile

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// nvmlMockKeys lists every key path of nvml-mock's profile schema, one per
// line: a.b for a mapping's key, a[] for the items of a sequence. The first
// block is derived from the JSON tags of nvml-mock's own config types
// (YAMLConfig in k8s-test-infra's pkg/gpu/mocknvml/engine/config_types.go,
// which it decodes with sigs.k8s.io/yaml); TestKnownKeysMatchNvmlMock
// derives it again from the vendored source and compares. A devices[] item
// embeds device_defaults' whole schema (nvml-mock's DeviceOverride inlines
// DeviceConfig), so only its own extra keys are listed; knownKeys adds the
// rest.
const nvmlMockKeys = `
version
system.driver_version
system.nvml_version
system.cuda_version
system.cuda_version_major
system.cuda_version_minor
system.num_devices
device_defaults.name
device_defaults.brand
device_defaults.serial
device_defaults.board_part_number
device_defaults.vbios_version
device_defaults.architecture
device_defaults.compute_capability.major
device_defaults.compute_capability.minor
device_defaults.num_gpu_cores
device_defaults.inforom.image_version
device_defaults.inforom.oem_object
device_defaults.inforom.ecc_object
device_defaults.inforom.pwr_object
device_defaults.memory.total_bytes
device_defaults.memory.reserved_bytes
device_defaults.memory.free_bytes
device_defaults.memory.used_bytes
device_defaults.memory.memory_bus_width
device_defaults.bar1_memory.total_bytes
device_defaults.bar1_memory.free_bytes
device_defaults.bar1_memory.used_bytes
device_defaults.pci.device_id
device_defaults.pci.subsystem_id
device_defaults.pci.bus_id
device_defaults.pcie.max_link_gen
device_defaults.pcie.current_link_gen
device_defaults.pcie.max_link_width
device_defaults.pcie.current_link_width
device_defaults.pcie.replay_counter
device_defaults.pcie.tx_throughput_kbps
device_defaults.pcie.rx_throughput_kbps
device_defaults.power.management_supported
device_defaults.power.management_mode
device_defaults.power.default_limit_mw
device_defaults.power.enforced_limit_mw
device_defaults.power.min_limit_mw
device_defaults.power.max_limit_mw
device_defaults.power.current_draw_mw
device_defaults.power.power_state
device_defaults.power.total_energy_consumption_mj
device_defaults.thermal.temperature_gpu_c
device_defaults.thermal.temperature_memory_c
device_defaults.thermal.shutdown_threshold_c
device_defaults.thermal.slowdown_threshold_c
device_defaults.thermal.max_operating_c
device_defaults.thermal.target_temperature_c
device_defaults.fan.count
device_defaults.fan.speed_percent
device_defaults.fan.target_speed_percent
device_defaults.clocks.graphics_current
device_defaults.clocks.graphics_max
device_defaults.clocks.graphics_app
device_defaults.clocks.graphics_app_default
device_defaults.clocks.sm_current
device_defaults.clocks.sm_max
device_defaults.clocks.memory_current
device_defaults.clocks.memory_max
device_defaults.clocks.memory_app
device_defaults.clocks.memory_app_default
device_defaults.clocks.video_current
device_defaults.clocks.video_max
device_defaults.clocks_throttle_reasons.gpu_idle
device_defaults.clocks_throttle_reasons.applications_clocks_setting
device_defaults.clocks_throttle_reasons.sw_power_cap
device_defaults.clocks_throttle_reasons.hw_slowdown
device_defaults.clocks_throttle_reasons.hw_thermal_slowdown
device_defaults.clocks_throttle_reasons.hw_power_brake_slowdown
device_defaults.clocks_throttle_reasons.sync_boost
device_defaults.clocks_throttle_reasons.sw_thermal_slowdown
device_defaults.clocks_throttle_reasons.display_clocks_setting
device_defaults.clocks_throttle_reasons.counters.sw_power_cap_us
device_defaults.clocks_throttle_reasons.counters.sync_boost_us
device_defaults.clocks_throttle_reasons.counters.sw_thermal_slowdown_us
device_defaults.clocks_throttle_reasons.counters.hw_thermal_slowdown_us
device_defaults.clocks_throttle_reasons.counters.hw_power_brake_slowdown_us
device_defaults.supported_clocks.memory_clocks[].freq_mhz
device_defaults.supported_clocks.memory_clocks[].graphics_clocks[]
device_defaults.performance_state
device_defaults.utilization.gpu
device_defaults.utilization.memory
device_defaults.utilization.encoder
device_defaults.utilization.decoder
device_defaults.utilization.jpeg
device_defaults.utilization.ofa
device_defaults.encoder_stats.session_count
device_defaults.encoder_stats.average_fps
device_defaults.encoder_stats.average_latency_us
device_defaults.fbc_stats.session_count
device_defaults.fbc_stats.average_fps
device_defaults.fbc_stats.average_latency_us
device_defaults.ecc.mode_current
device_defaults.ecc.mode_pending
device_defaults.ecc.default_mode
device_defaults.ecc.errors.volatile.single_bit.device_memory
device_defaults.ecc.errors.volatile.single_bit.l1_cache
device_defaults.ecc.errors.volatile.single_bit.l2_cache
device_defaults.ecc.errors.volatile.single_bit.register_file
device_defaults.ecc.errors.volatile.single_bit.texture_memory
device_defaults.ecc.errors.volatile.single_bit.total
device_defaults.ecc.errors.volatile.double_bit.device_memory
device_defaults.ecc.errors.volatile.double_bit.l1_cache
device_defaults.ecc.errors.volatile.double_bit.l2_cache
device_defaults.ecc.errors.volatile.double_bit.register_file
device_defaults.ecc.errors.volatile.double_bit.texture_memory
device_defaults.ecc.errors.volatile.double_bit.total
device_defaults.ecc.errors.aggregate.single_bit.device_memory
device_defaults.ecc.errors.aggregate.single_bit.l1_cache
device_defaults.ecc.errors.aggregate.single_bit.l2_cache
device_defaults.ecc.errors.aggregate.single_bit.register_file
device_defaults.ecc.errors.aggregate.single_bit.texture_memory
device_defaults.ecc.errors.aggregate.single_bit.total
device_defaults.ecc.errors.aggregate.double_bit.device_memory
device_defaults.ecc.errors.aggregate.double_bit.l1_cache
device_defaults.ecc.errors.aggregate.double_bit.l2_cache
device_defaults.ecc.errors.aggregate.double_bit.register_file
device_defaults.ecc.errors.aggregate.double_bit.texture_memory
device_defaults.ecc.errors.aggregate.double_bit.total
device_defaults.ecc.sram.volatile.correctable
device_defaults.ecc.sram.volatile.uncorrectable_parity
device_defaults.ecc.sram.volatile.uncorrectable_secded
device_defaults.ecc.sram.aggregate.correctable
device_defaults.ecc.sram.aggregate.uncorrectable_parity
device_defaults.ecc.sram.aggregate.uncorrectable_secded
device_defaults.ecc.sram.uncorrectable_sources.l2
device_defaults.ecc.sram.uncorrectable_sources.sm
device_defaults.ecc.sram.uncorrectable_sources.microcontroller
device_defaults.ecc.sram.uncorrectable_sources.pcie
device_defaults.ecc.sram.uncorrectable_sources.other
device_defaults.ecc.sram.threshold_exceeded
device_defaults.retired_pages.single_bit_retirement.count
device_defaults.retired_pages.single_bit_retirement.addresses[]
device_defaults.retired_pages.double_bit_retirement.count
device_defaults.retired_pages.double_bit_retirement.addresses[]
device_defaults.retired_pages.pending_blacklist
device_defaults.retired_pages.pending_retirement
device_defaults.remapped_rows.correctable
device_defaults.remapped_rows.uncorrectable
device_defaults.remapped_rows.pending
device_defaults.remapped_rows.failure_occurred
device_defaults.remapped_rows.availability_histogram.max
device_defaults.remapped_rows.availability_histogram.high
device_defaults.remapped_rows.availability_histogram.partial
device_defaults.remapped_rows.availability_histogram.low
device_defaults.remapped_rows.availability_histogram.none
device_defaults.display.mode
device_defaults.display.active
device_defaults.persistence_mode
device_defaults.compute_mode
device_defaults.mig.mode_current
device_defaults.mig.mode_pending
device_defaults.mig.max_gpu_instances
device_defaults.gpu_operation_mode.current
device_defaults.gpu_operation_mode.pending
device_defaults.driver_model.current
device_defaults.driver_model.pending
device_defaults.accounting.mode
device_defaults.accounting.buffer_size
device_defaults.virtualization.mode
device_defaults.virtualization.host_vgpu_mode
device_defaults.gsp_firmware.mode
device_defaults.gsp_firmware.version
device_defaults.features.transformer_engine
device_defaults.features.fp4_support
device_defaults.features.fp8_support
device_defaults.features.confidential_compute
device_defaults.features.nvlink_c2c
device_defaults.features.decompression_engine
device_defaults.features.fifth_gen_tensor_cores
device_defaults.grace_superchip.enabled
device_defaults.grace_superchip.cpu_cores
device_defaults.grace_superchip.cpu_memory_gb
device_defaults.grace_superchip.coherent_memory
device_defaults.topology.default_level
device_defaults.processes[].pid
device_defaults.processes[].type
device_defaults.processes[].name
device_defaults.processes[].used_memory_mib
device_defaults.processes[].sm_util
device_defaults.processes[].mem_util
device_defaults.processes[].enc_util
device_defaults.processes[].dec_util
device_defaults.dynamic_metrics.seed
device_defaults.dynamic_metrics.temperature.base_c
device_defaults.dynamic_metrics.temperature.variance_c
device_defaults.dynamic_metrics.temperature.ramp_c
device_defaults.dynamic_metrics.temperature.ramp_period_sec
device_defaults.dynamic_metrics.power.base_mw
device_defaults.dynamic_metrics.power.variance_mw
device_defaults.dynamic_metrics.utilization.pattern
device_defaults.dynamic_metrics.utilization.gpu_min
device_defaults.dynamic_metrics.utilization.gpu_max
device_defaults.dynamic_metrics.utilization.memory_min
device_defaults.dynamic_metrics.utilization.memory_max
device_defaults.dynamic_metrics.utilization.burst_period_sec
device_defaults.gpm.supported
device_defaults.gpm.pcie_tx_mib_per_sec
device_defaults.gpm.pcie_rx_mib_per_sec
device_defaults.failure.mode
device_defaults.failure.probability
device_defaults.failure.after_calls
device_defaults.failure.seed
device_defaults.failure.xid.code
device_defaults.fabric.cluster_uuid
device_defaults.fabric.clique_id
device_defaults.fabric.state
device_defaults.fabric.health_summary
device_defaults.fabric.health.degraded_bandwidth
device_defaults.fabric.health.route_recovery
device_defaults.fabric.health.route_unhealthy
device_defaults.fabric.health.access_timeout_recovery
device_defaults.fabric.health.incorrect_configuration
device_defaults.fabric.health_mask
device_defaults.nvlink_error.rate
device_defaults.nvlink_error.links[]
device_defaults.platform.chassis_serial_number
device_defaults.platform.slot_number
device_defaults.platform.tray_index
device_defaults.platform.host_id
device_defaults.platform.peer_type
device_defaults.platform.module_id
devices[].index
devices[].uuid
devices[].minor_number
devices[].grace_cpu_pair
nvlink.version
nvlink.links_per_gpu
nvlink.bandwidth_per_link_mbps
nvlink.c2c_enabled
nvlink.links[].link
nvlink.links[].state
nvlink.links[].remote_device_type
nvlink.links[].remote_pci_bus_id
nvlink.links[].remote_index
nvlink.switches[].bdf
nvlink.switches[].uuid
nvlink.defaults.state
nvlink.defaults.duty_cycle
nvlink.defaults.counter_seed
nvlink.defaults.error_rate
nvlink.device_links[].index
nvlink.device_links[].links[].link
nvlink.device_links[].links[].state
nvlink.device_links[].links[].remote_device_type
nvlink.device_links[].links[].remote_pci_bus_id
nvlink.device_links[].links[].remote_index
pcie_topology.root_complexes[].id
pcie_topology.root_complexes[].numa_node
pcie_topology.root_complexes[].devices[]
pcie_topology.root_complexes[].cpu_affinity
pcie_topology.cores_per_numa
`

// nvmlMockHelmKeys are keys nvml-mock's profiles carry that its Helm chart
// or other components read, not the NVML engine's config types.
const nvmlMockHelmKeys = `
infiniband.enabled
infiniband.hca_type
infiniband.fw_version
infiniband.hw_rev
infiniband.board_id
infiniband.link_layer
infiniband.rate_gbps
infiniband.port_state
infiniband.phys_state
infiniband.hcas_per_gpu
infiniband.guid_prefix
infiniband.node_desc_template
`

// nvmlMockNewerKeys are keys of nvml-mock's current profiles that its
// vendored source (k8s-test-infra 3b2b865d, whose config types
// nvmlMockKeys matches) predates: the cpu block of its vr200 and vrnvl72
// (a Vera CPU beside the GPUs), and the fp6_support its gb300 claims.
// They are written from those profiles as issue 25 describes them: the
// vendored tree ships only the a100, gb200, h100 and t4 configs, so
// TestKnownKeysMatchNvmlMock cannot derive them and does not check them.
const nvmlMockNewerKeys = `
device_defaults.cpu.type
device_defaults.cpu.coherent_memory
device_defaults.features.fp6_support
`

// extensionKeys are this tool's own additions to the schema.
// nvlink.switches[].device_id is one that nvml-mock's current profiles
// name too (its vrnvl72 leaves it off the switches of its switch trays).
const extensionKeys = `
device_defaults.pci.class
device_defaults.pci.driver
nvlink.switches[].device_id
infiniband.sriov_totalvfs
infiniband.gpus
nvlink.switches[].driver
pcie_topology.hierarchy
system.product_name
`

// keyAliases maps a path to the path whose schema it shares.
func keyAliases() map[string]string {
	return map[string]string{
		// nvml-mock's DeviceOverride inlines DeviceConfig.
		"devices[]": "device_defaults",
		// The Helm chart's defaults for device_defaults.dynamic_metrics
		// (nvml-mock's profiles say the engine ignores this key).
		"dynamic_metrics_defaults": "device_defaults.dynamic_metrics",
	}
}

// keySchema knows, for each path, the keys its mapping may hold.
type keySchema struct {
	children map[string][]string // parent path -> known keys, sorted
	aliases  map[string]string
}

func knownKeys() *keySchema {
	s := &keySchema{children: map[string][]string{}, aliases: keyAliases()}
	add := func(p string) {
		for p != "" {
			parent, key := splitPath(p)
			if key == "" {
				return
			}
			if slices.Contains(s.children[parent], key) {
				return
			}
			s.children[parent] = append(s.children[parent], key)
			p = parent
		}
	}
	for _, list := range []string{nvmlMockKeys, nvmlMockHelmKeys, nvmlMockNewerKeys, extensionKeys} {
		for _, p := range strings.Fields(list) {
			add(strings.TrimSuffix(p, "[]"))
		}
	}
	for alias := range s.aliases {
		add(strings.TrimSuffix(alias, "[]"))
	}
	for _, keys := range s.children {
		slices.Sort(keys)
	}
	return s
}

// splitPath splits a.b[].c into a.b[] and c.
func splitPath(p string) (parent, key string) {
	i := strings.LastIndexByte(p, '.')
	if i < 0 {
		return "", strings.TrimSuffix(p, "[]")
	}
	return p[:i], strings.TrimSuffix(p[i+1:], "[]")
}

// keysOf returns the known keys of the mapping at path p, following an
// alias for p or any of its parents.
func (s *keySchema) keysOf(p string) []string {
	keys := s.children[p]
	for alias, target := range s.aliases {
		if p == alias || strings.HasPrefix(p, alias+".") {
			keys = append(slices.Clip(keys), s.children[target+strings.TrimPrefix(p, alias)]...)
		}
	}
	return keys
}

// unknownKeys returns one error for each key of the document that
// nvml-mock's profile schema does not know, naming the path, the line and
// the nearest known key: a typo such as subsytem_id would otherwise be
// ignored, like the fields nvml-mock knows and sysfs does not need, and the
// device rendered with a default. Below an unknown key nothing more is
// reported.
func unknownKeys(source string, top *yaml.Node) []*Error {
	s := knownKeys()
	var out []*Error
	var walk func(n *yaml.Node, field, schemaPath string)
	walk = func(n *yaml.Node, field, schemaPath string) {
		switch n.Kind {
		case yaml.AliasNode:
			walk(n.Alias, field, schemaPath)
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", field, i), schemaPath+"[]")
			}
		case yaml.MappingNode:
			known := s.keysOf(schemaPath)
			for i := 0; i+1 < len(n.Content); i += 2 {
				key, value := n.Content[i], n.Content[i+1]
				if key.Value == "<<" && key.Tag == "!!merge" {
					walk(value, field, schemaPath) // a merge adds keys here
					continue
				}
				if !slices.Contains(known, key.Value) {
					out = append(out, unknownKey(source, join(field, key.Value), key, known))
					continue
				}
				walk(value, join(field, key.Value), join(schemaPath, key.Value))
			}
		}
	}
	walk(top, "", "")
	return out
}

func unknownKey(source, field string, key *yaml.Node, known []string) *Error {
	msg := fmt.Sprintf("unknown key (line %d), not in nvml-mock's profile schema", key.Line)
	if near := nearest(key.Value, known); near != "" {
		msg += "; nearest known key: " + near
	}
	return &Error{Source: source, Field: field, Err: fmt.Errorf("%s", msg)}
}

// nearest returns the known key with the smallest edit distance to key.
func nearest(key string, known []string) string {
	best, bestDist := "", -1
	for _, k := range known {
		if d := editDistance(key, k); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
