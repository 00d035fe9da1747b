package programs

// The GPU Operator's operand gate: the condition its operand DaemonSets
// (GFD, the device plugin, DCGM, dcgm-exporter, the MIG manager, the MPS
// control daemon) wait on in their toolkit-validation init container, in
// its assets/state-*/ DaemonSet manifests. Quoted from ../shared/WRITABLE.md,
// the manifests not copied; no registry serves the operator's chart or
// images. The init container loops
// `until [ -f /run/nvidia/validations/toolkit-ready ] && <condition>; do ... sleep 5; done`;
// the toolkit's file is the toolkit validator's, not the tree's, so a
// suite runs the condition alone, once: an unserved pod's loop would wait
// forever.
const (
	// OperandGate is the condition on its main branch since October 2026
	// (gpu-operator commit aa22a385, as WRITABLE.md reports it).
	OperandGate = "grep -qsx live /sys/module/nvidia/initstate"
	// OperandGateV2671 is v26.7.1's (gpu-operator #2881, backported in
	// #2896), less its `|| [ -e /dev/dxg ]` for WSL: it reads
	// /proc/modules, which no mount can serve, only the /proc hook.
	OperandGateV2671 = `grep -q '^nvidia ' /proc/modules`
)
