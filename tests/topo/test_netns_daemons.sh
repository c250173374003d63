#!/bin/bash
# Several gateways on one host: `xesp daemon` with default options in two named network
# namespaces. Each takes the control socket and state file of its namespace
# (/run/xesp/xesp-NS.sock, /var/lib/xesp/xesp-NS.state), the CLI run in a namespace reaches
# that namespace's daemon and no other, and a daemon refuses a state file written in another
# namespace. Without a daemon the CLI fails naming the socket it tried.
#
#   namespace A: xesp daemon     namespace B: xesp daemon     namespace C: none
#   xesp sa add ... (to A)       xesp sa list (empty)         xesp sa list: error
#
# Usage: bash test_netns_daemons.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns).
set -u

XESP=${1:?usage: test_netns_daemons.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../checks.sh"
P=xesp-n$$-
require_netns "${P}probe"

A=${P}a B=${P}b C=${P}c
WORK=$(mktemp -d /tmp/xesp-netns-test.XXXXXX)
declare -A DPID=()
cleanup() {
    local ns
    for ns in "${!DPID[@]}"; do kill -9 "${DPID[$ns]}" 2>/dev/null; done
    for ns in $A $B $C; do
        ip netns del "$ns" 2>/dev/null
        rm -f "/run/xesp/xesp-$ns.sock" "/var/lib/xesp/xesp-$ns.state" \
            "/var/lib/xesp/xesp-$ns.state.journal"
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_ns() { # NS CMD...: the command in NS, with no $XESP_SOCKET to point it elsewhere
    local ns=$1
    shift
    env -u XESP_SOCKET ip netns exec "$ns" "$@"
}

start_daemon() { # NS [options]: the daemon in NS, with its defaults; waits for its socket
    local ns=$1
    shift
    # Not through in_ns: a function in the background is a subshell, and its pid is not the
    # daemon's.
    env -u XESP_SOCKET ip netns exec "$ns" "$XESP" daemon "$@" >>"$WORK/$ns.log" 2>&1 &
    DPID[$ns]=$!
    for _ in $(seq 100); do
        in_ns "$ns" "$XESP" iface list >/dev/null 2>&1 && return 0
        kill -0 "${DPID[$ns]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "$ns: the daemon did not come up: $(tail -n 3 "$WORK/$ns.log")"
    return 1
}

# step NAME CMD...: as check, but CMD runs in this shell, so that the daemons' pids stay known.
step() {
    local name=$1
    shift
    if "$@" >"$WORK/step.out" 2>&1; then
        pass "$name"
    else
        fail "$name" "$(tail -n 3 "$WORK/step.out" | tr '\n' ' ')"
    fi
}

stop_daemon() { # NS
    [ -n "${DPID[$1]:-}" ] || return 0
    kill -TERM "${DPID[$1]}" 2>/dev/null
    wait "${DPID[$1]}" 2>/dev/null
    unset "DPID[$1]"
}

KEY=0x00112233445566778899aabbccddeeff01020304
SA="src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000 reqid 1 mode tunnel aead rfc4106(gcm(aes)) $KEY 128"

start=$SECONDS
for ns in $A $B $C; do
    check "namespace $ns" ip netns add "$ns"
    ip -n "$ns" link set lo up
done
step "a daemon with default options in $A" start_daemon $A
step "a daemon with default options in $B" start_daemon $B
check "its socket is its namespace's" test -S "/run/xesp/xesp-$A.sock"
check "... in both" test -S "/run/xesp/xesp-$B.sock"
check "iface list answers in $A" in_ns $A "$XESP" iface list
check "iface list answers in $B" in_ns $B "$XESP" iface list
check "sa add in $A goes to $A's daemon" in_ns $A "$XESP" sa add $SA
check "sa list in $A shows it" bash -c "ip netns exec $A env -u XESP_SOCKET '$XESP' sa list | grep -q 'spi 0x0*1000'"
check "sa list in $B answers, without it" \
    bash -c "out=\$(ip netns exec $B env -u XESP_SOCKET '$XESP' sa list) && [ -z \"\$out\" ]"
check "the state files are two" test -f "/var/lib/xesp/xesp-$A.state" -a -f "/var/lib/xesp/xesp-$B.state"
check "$A's holds the SA, $B's not" \
    bash -c "cat /var/lib/xesp/xesp-$A.state* | grep -q 'spi 0x0*1000' && ! cat /var/lib/xesp/xesp-$B.state* | grep -q 'spi 0x0*1000'"
check "each records its namespace" \
    bash -c "grep -q '\"netns\": \"$A\"' /var/lib/xesp/xesp-$A.state && grep -q '\"netns\": \"$B\"' /var/lib/xesp/xesp-$B.state"

check "no daemon in $C: sa list fails" bash -c "! ip netns exec $C env -u XESP_SOCKET '$XESP' sa list 2>'$WORK/err'"
check "naming the socket it tried" grep -q "/run/xesp/xesp-$C.sock" "$WORK/err"
check "and no state or socket appears for $C" \
    test ! -e "/var/lib/xesp/xesp-$C.state" -a ! -e "/var/lib/xesp/xesp-$C.state.journal"

stop_daemon $A
refused() {
    ! in_ns $B "$XESP" daemon --socket "$WORK/other.sock" --state "/var/lib/xesp/xesp-$A.state" \
        >"$WORK/refused.log" 2>&1 || return 1
    cat "$WORK/refused.log"
    grep -q "written in network namespace $A" "$WORK/refused.log" &&
        grep -q "runs in network namespace $B" "$WORK/refused.log"
}
check "a daemon in $B refuses $A's state file" refused
step "$A's daemon restarts on its own state" start_daemon $A
check "... with its SA" bash -c "ip netns exec $A env -u XESP_SOCKET '$XESP' sa list | grep -q 'spi 0x0*1000'"
stop_daemon $A
stop_daemon $B

echo "$passed passed, $failed failed ($((SECONDS - start)) s)"
if [ "$failed" != 0 ]; then
    for ns in $A $B; do echo "--- $ns log"; tail -n 10 "$WORK/$ns.log"; done
fi
[ "$failed" = 0 ]
