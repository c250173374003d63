#!/usr/bin/env bash
# The gateway subset (guest_gateway.sh) on a Debian kernel under qemu: XDP fixtures through
# bpf_prog_test_run, two gateways and two hosts in network namespaces, ping, TCP and UDP through
# the tunnel, ESP only on the wire, kill -9 under traffic. See vm_run.sh for the VM.
#
# Usage: bash test_vm_gateway.sh KERNEL XESP TEST_XDP     (KERNEL: 6.1, 6.12, or a release)
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, or no qemu/busybox-static),
# anything else: the VM could not be run (see vm_run.sh).
set -u
KERNEL=${1:?usage: test_vm_gateway.sh KERNEL XESP TEST_XDP}
XESP=$(realpath "${2:?usage: test_vm_gateway.sh KERNEL XESP TEST_XDP}")
TEST_XDP=$(realpath "${3:?usage: test_vm_gateway.sh KERNEL XESP TEST_XDP}")
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)

if [ "$(id -u)" != 0 ]; then
    echo "SKIP: needs root (qemu's kernel cache, and the guest runs as root)"
    exit 77
fi
need=()
for c in ip ethtool tcpdump; do
    p=$(command -v "$c") || { echo "SKIP: $c not found on the host, to carry into the guest"; exit 77; }
    need+=("$p")
done

# xfrm_user: sockets' own xfrm policies (IP_XFRM_POLICY), which test_xdp sets.
exec "$HERE/vm_run.sh" -t "${XESP_VM_TIMEOUT:-600}" -m xfrm_user \
    -e XESP="$XESP" -e TEST_XDP="$TEST_XDP" \
    -e TOPO="$TOP/tools/xesp-topo" -e CHECKS="$TOP/tests/checks.sh" \
    "$KERNEL" "$HERE/guest_gateway.sh" \
    "$XESP" "$TEST_XDP" "$TOP/tools/xesp-topo" "$TOP/tests/checks.sh" "${need[@]}"
