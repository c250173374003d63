#!/bin/bash
# `xesp iface add` on a protected veth whose peer hands over unfinished TCP/UDP checksums (its
# TX checksum offload on, the veth default), or a tap with a vnet header: the daemon's log,
# `iface list` and `iface list -j` say so and give the fix; with the offload off, or a plain
# tap, they say nothing.
#
#   hostA ---- gwA (xesp daemon)            chk0 -- chk1: a veth pair inside gwA
#   hosta0     gwa-prot: protected          chk0: protected, its peer in the same namespace
#   (its peer, in the hostA namespace)      chktap0, chktap1: taps with and without a vnet
#                                           header, protected
#
# Usage: bash test_iface_checks.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_iface_checks.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-c$$-

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"

start=$SECONDS
check "topology up" "$TOPO" up
step "daemon up" start_gw gwA --no-state

# readd IF: adds IF to gwA as protected, after taking it off if it was there.
readd() {
    cli gwA iface del "$1" >/dev/null 2>&1
    cli gwA iface add "$1" role protected
}

# warned IF WANT: `iface list` shows WANT in the warning line under IF, and `iface list -j`
# carries it in IF's "warning".
warned() {
    local text json
    text=$(cli gwA iface list) || return 1
    json=$(cli gwA iface list -j) || return 1
    echo "$text"
    echo "$text" | grep -A1 "^$1 role protected" | grep "^  warning: " | grep -qF "$2" ||
        return 1
    echo "$json" | "$PY" -c '
import json, sys
want, name = sys.argv[1], sys.argv[2]
i = [i for i in json.load(sys.stdin) if i["name"] == name][0]
sys.exit(0 if want in i.get("warning", "") else 1)' "$2" "$1"
}

not_warned() {
    local text json
    text=$(cli gwA iface list) || return 1
    json=$(cli gwA iface list -j) || return 1
    echo "$text"
    ! echo "$text" | grep -q warning && ! echo "$json" | grep -q '"warning"'
}

"$TOPO" exec hostA ethtool -K "$HOSTA_IF" tx on >/dev/null
check "peer in another namespace, TX checksum offload on: iface add succeeds" readd "$GWA_PROT_IF"
check "iface list names the peer, its namespace and the fix" \
    warned "$GWA_PROT_IF" "veth peer $HOSTA_IF (namespace $NS_HOSTA) has TX checksum offload on"
check "iface list gives the command" \
    warned "$GWA_PROT_IF" "ip netns exec $NS_HOSTA ethtool -K $HOSTA_IF tx off"
check "the daemon logs it" grep -q "$GWA_PROT_IF: veth peer $HOSTA_IF" "$WORK/gwA.log"

"$TOPO" exec hostA ethtool -K "$HOSTA_IF" tx off >/dev/null
check "TX checksum offload off: iface add" readd "$GWA_PROT_IF"
check "... and no warning" not_warned

"$TOPO" exec gwA ip link add chk0 type veth peer name chk1
"$TOPO" exec gwA ip link set chk0 up
"$TOPO" exec gwA ip link set chk1 up
check "peer in the same namespace: iface add" readd chk0
check "iface list names the peer and the fix" \
    warned chk0 "veth peer chk1 has TX checksum offload on: TCP and UDP from it are forwarded with unfinished checksums; run \`ethtool -K chk1 tx off\`"
"$TOPO" exec gwA ip tuntap add dev chktap0 mode tap vnet_hdr
"$TOPO" exec gwA ip tuntap add dev chktap1 mode tap
"$TOPO" exec gwA ip link set chktap0 up
"$TOPO" exec gwA ip link set chktap1 up
check "a tap with a vnet header: iface add" readd chktap0
check "iface list says its writer must finish checksums" \
    warned chktap0 "tap with a vnet header: its writer may hand over TCP and UDP with unfinished checksums"
check "a tap without one: iface add" readd chktap1
check "... no warning under it" eval "! cli gwA iface list | grep -A1 '^chktap1' | grep -q warning"
check "a public interface is not checked" cli gwA iface add "$GWA_PUB_IF" role public
check "... no warning under it" eval "! cli gwA iface list | grep -A1 '^$GWA_PUB_IF' | grep -q warning"

# refused_one_line NAME ARGS...: `xesp ARGS` against gwA fails with one line that says NAME
# (control characters shown escaped) and nothing on stdout.
refused_one_line() {
    local want=$1 out err
    shift
    if out=$(cli gwA "$@" 2>"$WORK/err"); then
        echo "accepted"
        return 1
    fi
    err=$(cat "$WORK/err")
    echo "$err"
    [ -z "$out" ] && [ "$(wc -l <"$WORK/err")" = 1 ] && grep -qF "$want" "$WORK/err"
}
check "a device name with a newline is refused in one line" \
    refused_one_line "'bad\x0aname': not an interface name" iface add $'bad\nname' role protected
check "... and so is one too long for the kernel" \
    refused_one_line "not an interface name" iface del abcdefghijklmnop
check "a mode with a newline is refused in one line" \
    refused_one_line "mode 'x\x0ay': expected xdp or tun" iface add chk0 role protected mode $'x\ny'
check "... and nothing changed" eval "cli gwA iface list | grep -q '^chk0 role protected'"

stop_gw gwA
finish
