#!/bin/bash
# XskPort on a veth pair between two network namespaces.
#
#   netns $NS_A                                 netns $NS_B
#   +-----------------------------+             +------------------------------------------+
#   | xa0   2 TX / 2 RX queues    |             | xb0   2 TX / 2 RX queues                 |
#   |       XPS: tx-q on CPU q    | <- veth ->  |       XDP xsk_redirect: test EtherType   |
#   | AF_PACKET sender, capture   |             |       -> XSKMAP[rx_queue] -> XskPort q   |
#   +-----------------------------+             | test_xsk_port runs here                  |
#                                               +------------------------------------------+
#
# Usage: test_xsk_port.sh TEST_BINARY [--bench SECONDS]
# Exit status: that of test_xsk_port; 77 (skipped) without root or network namespaces.
set -u
bin=$1
shift

if [ "$(id -u)" != 0 ]; then
    echo "SKIP: needs root (network namespaces, XDP, AF_XDP)"
    exit 77
fi
if ! command -v ip >/dev/null; then
    echo "SKIP: no ip (iproute2)"
    exit 77
fi

NS_A=xesp-afxdp-a-$$
NS_B=xesp-afxdp-b-$$
cleanup() {
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! ip netns add "$NS_A" || ! ip netns add "$NS_B"; then
    echo "SKIP: cannot create network namespaces"
    exit 77
fi
ip link add xa0 numtxqueues 2 numrxqueues 2 netns "$NS_A" type veth \
    peer name xb0 numtxqueues 2 numrxqueues 2 netns "$NS_B" || exit 1
for ns in "$NS_A" "$NS_B"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip -n "$ns" link set lo up
done
ip -n "$NS_A" link set xa0 up || exit 1
ip -n "$NS_B" link set xb0 up || exit 1

# Pin the sender's TX queues to CPUs, so the test knows which RX queue a frame arrives on.
xps=
if [ "$(nproc)" -ge 2 ] &&
    ip netns exec "$NS_A" sh -c 'echo 1 > /sys/class/net/xa0/queues/tx-0/xps_cpus &&
                                 echo 2 > /sys/class/net/xa0/queues/tx-1/xps_cpus' 2>/dev/null; then
    xps=--xps
fi

ip netns exec "$NS_B" "$bin" "/run/netns/$NS_A" xb0 xa0 $xps "$@"
