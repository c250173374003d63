#!/bin/bash
# tools/xesp-topo: the standard topology comes up, forwards, and goes away.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB
#   10.1.0.2   10.1.0.1  192.0.2.1  192.0.2.2  10.2.0.1   10.2.0.2
#   fd01::2    fd01::1   2001:db8::1 2001:db8::2 fd02::1   fd02::2
#
#   netns hostA   netns gwA              netns wire                 netns gwB              netns hostB
#   hosta0 ------ gwa-prot  gwa-pub ---- wire-a [bridge] wire-b ---- gwb-pub  gwb-prot ---- hostb0
#                                          ^ wire_capture.py
#
# Asserts: hostA reaches hostB over IPv4 and IPv6; TCP works both ways (iperf3 -t 2, or a
# Python transfer with a checksum without it); the gateways' veths have the queues asked for,
# GRO on and forwarding on; a capture on the wire sees the plaintext pings and a TCP payload
# between the hosts (no gateway daemon runs here, so nothing is encrypted; the ESP tests expect
# the opposite with the same helper) and nothing of hostA-gwA traffic; `up` twice rebuilds;
# `down` removes every namespace, and says nothing when run again.
#
# Namespaces are named with a per-run prefix so parallel runs do not collide.
# Usage: bash test_topo.sh
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns or veth).
# Environment: IPERF3= (empty) forces the Python transfer even when iperf3 is installed.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
IPERF3=${IPERF3-$(command -v iperf3)}
export XESP_TOPO_PREFIX=xesp-t$$-

source "$HERE/lib.sh"

cleanup() {
    [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
    "$TOPO" down >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

our_namespaces() {
    ip netns list | awk '{print $1}' | grep -c "^$XESP_TOPO_PREFIX"
}

# queues_are NODE DEV N: DEV has N RX and N TX queues, read from /sys inside the namespace
# (ip netns exec remounts /sys, so this is the namespace's own view).
queues_are() {
    local got
    got=$("$TOPO" exec "$1" sh -c "ls /sys/class/net/$2/queues | grep -c rx-; ls /sys/class/net/$2/queues | grep -c tx-" |
        tr '\n' ' ')
    [ "$got" = "$3 $3 " ] || { echo "$1 $2: rx tx queues $got, want $3 $3"; return 1; }
}

gateway_veths_have() { # N: queues, GRO and forwarding on all four gateway veths
    local node_dev node dev bad=0
    for node_dev in "gwA $GWA_PROT_IF" "gwA $GWA_PUB_IF" "gwB $GWB_PUB_IF" "gwB $GWB_PROT_IF"; do
        read -r node dev <<<"$node_dev"
        queues_are "$node" "$dev" "$1" || bad=1
        "$TOPO" exec "$node" ethtool -k "$dev" | grep -q '^generic-receive-offload: on' ||
            { echo "$node $dev: GRO off"; bad=1; }
        [ "$("$TOPO" exec "$node" cat /proc/sys/net/ipv4/conf/"$dev"/forwarding \
            /proc/sys/net/ipv6/conf/"$dev"/forwarding | tr -d '\n')" = 11 ] ||
            { echo "$node $dev: forwarding off"; bad=1; }
    done
    return $bad
}

# iperf3 -t 2 hostA -> hostB, then the reverse (-R): both must move data and exit 0.
tcp_iperf3() {
    local dir=$1 out
    "$TOPO" exec hostB "$IPERF3" -s -1 -B "$HOSTB_IP4" >/dev/null 2>&1 &
    server_pid=$!
    wait_listen hostB 5201 || return 1
    out=$("$TOPO" exec hostA "$IPERF3" -c "$HOSTB_IP4" -t 2 $dir -f m 2>&1) || { echo "$out"; return 1; }
    wait "$server_pid"
    server_pid=
    echo "$out" | grep -E 'receiver$' | tail -n 1
    echo "$out" | grep -qE ' [1-9][0-9.]* Mbits/sec +receiver$'
}

trap 'cleanup; rm -rf "$WORK"' EXIT

start=$SECONDS
echo "# topology with prefix $XESP_TOPO_PREFIX, 3 queues per veth"
check "up" env XESP_TOPO_QUEUES=3 "$TOPO" up
check "status reports up" "$TOPO" status
check "names carry the prefix" test "$NS_HOSTA" = "${XESP_TOPO_PREFIX}hostA" -a "$NS_WIRE" = "${XESP_TOPO_PREFIX}wire"
check "gateway veths: 3 queues, GRO, forwarding" gateway_veths_have 3

check "hostA pings hostB over IPv4" ping_from hostA "$HOSTB_IP4" -c 3
check "hostA pings hostB over IPv6" ping_from hostA "$HOSTB_IP6" -c 3
check "hostB pings hostA over IPv6" ping_from hostB "$HOSTA_IP6" -c 1

if [ -n "$IPERF3" ]; then
    check "TCP hostA -> hostB (iperf3 -t 2)" tcp_iperf3 ""
    check "TCP hostB -> hostA (iperf3 -t 2 -R)" tcp_iperf3 -R
else
    check "TCP hostA -> hostB (4 MiB, SHA-256)" tcp_python a2b
    check "TCP hostB -> hostA (4 MiB, SHA-256)" tcp_python b2a
fi

# Plain forwarding puts the hosts' traffic on the wire in clear: 3 echo requests + 3 replies,
# no ESP.
FILTERS=("icmp host $HOSTA_IP4 host $HOSTB_IP4" "esp")
ping_cmd hostA "$HOSTB_IP4" -c 3 -i 0.05
expect_counts "wire sees the IPv4 pings in plaintext, no ESP" "6 0 " "${PING[@]}"
FILTERS=("icmp6 host $HOSTA_IP6 host $HOSTB_IP6" "esp")
ping_cmd hostA "$HOSTB_IP6" -c 3 -i 0.05
expect_counts "wire sees the IPv6 pings in plaintext, no ESP" "6 0 " "${PING[@]}"
FILTERS=("host $HOSTA_IP4" "host $GWA_PROT_IP4")
ping_cmd hostA "$GWA_PROT_IP4" -c 2 -i 0.05
expect_counts "wire sees nothing of hostA <-> gwA" "0 0 " "${PING[@]}"

# A TCP payload crosses the wire readable: the check the ESP tests turn around for data.
marker=xesp-plaintext-marker-$$
"$TOPO" exec hostB "$PY" -c "import socket
s=socket.create_server(('$HOSTB_IP4',5202)); c,_=s.accept()
while c.recv(65536): pass" >/dev/null 2>&1 &
server_pid=$!
if wait_listen hostB 5202 >/dev/null; then
    FILTERS=("tcp port 5202 contains $marker" "tcp port 5202")
    got=$(wire_counts "$TOPO" exec hostA bash -c "exec 3<>/dev/tcp/$HOSTB_IP4/5202 && echo $marker >&3")
    read -r n_marker n_tcp <<<"$got"
    if [ "${n_marker:-0}" -ge 1 ] && [ "${n_tcp:-0}" -gt "$n_marker" ]; then
        pass "wire sees a TCP payload in plaintext ($n_marker of $n_tcp segments)"
    else
        fail "wire sees a TCP payload in plaintext" "counts '$got'; $(tail -n 2 "$WORK/capture.err" | tr '\n' ' ')"
    fi
else
    fail "wire sees a TCP payload in plaintext" "no listener on hostB port 5202"
fi
wait "$server_pid" 2>/dev/null
server_pid=

echo "# up again over the running topology, 2 queues (the default)"
check "up twice" "$TOPO" up
check "gateway veths: 2 queues after the second up" gateway_veths_have 2
check "hostA pings hostB after the second up" ping_from hostA "$HOSTB_IP4" -c 1
check "one set of namespaces" test "$(our_namespaces)" = 5

echo "# down"
check "down" "$TOPO" down
check "down removes every namespace" test "$(our_namespaces)" = 0
check "down again is silent" test -z "$("$TOPO" down 2>&1)"
check "status reports down" bash -c "! '$TOPO' status"

echo "$passed passed, $failed failed ($((SECONDS - start)) s)"
[ "$failed" = 0 ]
