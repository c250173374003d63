# The gateway subset, run inside a Debian kernel by test_vm_gateway.sh (through vm_run.sh):
# busybox, the real `ip`, ethtool, tcpdump and xesp only, no python.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB        (tools/xesp-topo, one queue per veth)
#   10.1.0.2   xesp      192.0.2.x   xesp      10.2.0.2
#                        ^ tcpdump on wire-a: every frame between the gateways
#
# Asserts: the XDP fixture table and the other bpf_prog_test_run cases (test_xdp) pass on this
# kernel; `xesp daemon --check` finds what the daemon needs; both daemons come up with the
# tunnel config and attach XDP; ping (IPv4 and IPv6), TCP (busybox nc, 1 MiB, SHA-256) and
# UDP cross the tunnel, and the wire carries ESP and no plaintext of the hosts' flows;
# after kill -9 of gwA's daemon under a running ping, the wire carries none of that ping.
# Environment (vm_run.sh -e): XESP, TEST_XDP, TOPO (tools/xesp-topo), CHECKS (tests/checks.sh).
set -u
source "$CHECKS"
export XESP_TOPO_PREFIX=vm- XESP_TOPO_QUEUES=1
WORK=/tmp/gw
mkdir -p "$WORK"
eval "$("$TOPO" names)"
start=$SECONDS
echo "== $(uname -r)"

check "xesp daemon --check" "$XESP" daemon --check
# The scale case (100,000 SAs and policies) takes minutes under emulation; the host runs it.
check "XDP fixtures and test_run cases (test_xdp)" "$TEST_XDP" '~scale*'

# ---- The gateways ----------------------------------------------------------------------------

declare -A DPID=()
cli() { XESP_SOCKET=$WORK/$1.sock "$XESP" "${@:2}"; }
start_gw() { # GW
    "$TOPO" config "$1" >"$WORK/$1.conf" || return 1
    "$TOPO" exec "$1" "$XESP" daemon --socket "$WORK/$1.sock" --state "$WORK/$1.state" \
        -b "$WORK/$1.conf" >>"$WORK/$1.log" 2>&1 &
    DPID[$1]=$!
    for _ in $(seq 100); do
        cli "$1" iface list >/dev/null 2>&1 && return 0
        kill -0 "${DPID[$1]}" 2>/dev/null || break
        sleep 0.2
    done
    echo "$1: the daemon did not come up: $(tail -n 3 "$WORK/$1.log")"
    return 1
}
up_pair() {
    start_gw gwA && start_gw gwB &&
        cli gwA iface add "$GWA_PROT_IF" role protected &&
        cli gwA iface add "$GWA_PUB_IF" role public &&
        cli gwB iface add "$GWB_PUB_IF" role public &&
        cli gwB iface add "$GWB_PROT_IF" role protected
}

# ---- The wire --------------------------------------------------------------------------------

# capture_start / capture_stop: tcpdump on wire-a; count FILTER then counts frames in it.
capture_start() {
    rm -f "$WORK/wire.pcap" "$WORK/tcpdump.err"      # no "listening on" of the last capture
    "$TOPO" exec wire tcpdump -Z root -n -U --immediate-mode -i "$WIRE_IF" -w "$WORK/wire.pcap" \
        2>"$WORK/tcpdump.err" &
    CAP=$!
    for _ in $(seq 50); do
        grep -q 'listening on' "$WORK/tcpdump.err" && return 0
        sleep 0.1
    done
    echo "tcpdump did not start: $(cat "$WORK/tcpdump.err")"
    return 1
}
capture_stop() {
    sleep 0.5
    kill "$CAP" && wait "$CAP"
    return 0
}
count() { tcpdump -Z root -n -r "$WORK/wire.pcap" "$@" 2>/dev/null | wc -l; }

# wire_is NAME PLAIN-FILTER MIN-ESP CMD...: during CMD, no frame matches PLAIN-FILTER and at
# least MIN-ESP frames are ESP.
wire_is() {
    local name=$1 plain_filter=$2 min_esp=$3 plain esp
    shift 3
    capture_start || { fail "$name" "no capture"; return; }
    "$@" >"$WORK/cmd.out" 2>&1
    local rc=$?
    capture_stop
    plain=$(count "$plain_filter")
    esp=$(count esp)
    if [ "$rc" = 0 ] && [ "$plain" = 0 ] && [ "$esp" -ge "$min_esp" ]; then
        pass "$name (plaintext $plain, ESP $esp)"
    else
        fail "$name" "exit $rc, plaintext $plain, ESP $esp; $(tail -n 2 "$WORK/cmd.out" | tr '\n' ' ')"
    fi
}

# ---- Traffic ---------------------------------------------------------------------------------

# 1 MiB over TCP from hostA to hostB with busybox nc, compared by SHA-256. The receiving end is
# cat on the accepted socket: a listening nc would close its side at once (its stdin is empty),
# and the sender's nc stops when it sees that.
tcp_1m() {
    head -c 1048576 /dev/urandom >"$WORK/tx"
    rm -f "$WORK/rx"
    "$TOPO" exec hostB timeout 60 nc -l -p 5201 -e sh -c "cat >$WORK/rx" &
    local srv=$!
    sleep 0.5
    "$TOPO" exec hostA timeout 60 nc "$HOSTB_IP4" 5201 <"$WORK/tx" || return 1
    wait "$srv"
    local a b
    a=$(sha256sum <"$WORK/tx") b=$(sha256sum <"$WORK/rx")
    [ "$a" = "$b" ] || { echo "sent $(wc -c <"$WORK/tx") bytes, received $(wc -c <"$WORK/rx")"; return 1; }
}

# 50 UDP datagrams carrying a marker from hostA (bash's /dev/udp); hostB's own tcpdump counts
# those that arrive.
udp_50() {
    rm -f "$WORK/tcpdump-b.err"
    "$TOPO" exec hostB tcpdump -Z root -n -U --immediate-mode -i "$HOSTB_IF" -w "$WORK/hostb.pcap" \
        "udp port 5300" 2>"$WORK/tcpdump-b.err" &
    local cap=$!
    for _ in $(seq 50); do grep -q 'listening on' "$WORK/tcpdump-b.err" && break; sleep 0.1; done
    "$TOPO" exec hostA bash -c "for i in \$(seq 50); do echo $MARKER-\$i >/dev/udp/$HOSTB_IP4/5300; sleep 0.01; done"
    sleep 0.5
    kill "$cap"
    wait "$cap"
    local got
    got=$(tcpdump -Z root -n -A -r "$WORK/hostb.pcap" 2>/dev/null | grep -c "$MARKER")
    [ "$got" -ge 48 ] || { echo "hostB received $got of 50"; return 1; }
}

# ---- The checks ------------------------------------------------------------------------------

check "topology up" "$TOPO" up
if ! up_pair >"$WORK/up.out" 2>&1; then
    fail "daemons up, interfaces added" "$(tail -n 3 "$WORK/up.out" | tr '\n' ' ')"
    for gw in gwA gwB; do echo "--- $gw log"; tail -n 20 "$WORK/$gw.log"; done
    exit 1
fi
pass "daemons up, interfaces added"
check "XDP attached on gwA and gwB" bash -c "
    '$TOPO' exec gwA ip -d link show dev $GWA_PROT_IF | grep -q prog/xdp &&
    '$TOPO' exec gwA ip -d link show dev $GWA_PUB_IF | grep -q prog/xdp &&
    '$TOPO' exec gwB ip -d link show dev $GWB_PUB_IF | grep -q prog/xdp &&
    '$TOPO' exec gwB ip -d link show dev $GWB_PROT_IF | grep -q prog/xdp"

HOSTS4="host $HOSTA_IP4 and host $HOSTB_IP4"
HOSTS6="host $HOSTA_IP6 and host $HOSTB_IP6"
wire_is "IPv4 ping through the tunnel, ESP only on the wire" "$HOSTS4" 10 \
    "$TOPO" exec hostA ping -c 5 -i 0.2 -W 3 "$HOSTB_IP4"
wire_is "IPv6 ping through the tunnel, ESP only on the wire" "$HOSTS6" 10 \
    "$TOPO" exec hostA ping -c 5 -i 0.2 -W 3 "$HOSTB_IP6"
wire_is "TCP hostA -> hostB (1 MiB, SHA-256), ESP only on the wire" "$HOSTS4" 100 tcp_1m
MARKER=xesp-vm-marker-$$
wire_is "UDP hostA -> hostB (50 datagrams arrive), ESP only on the wire" \
    "$HOSTS4 or udp port 5300" 50 udp_50
check "the wire never carried the UDP payload" bash -c "
    ! tcpdump -Z root -n -A -r '$WORK/wire.pcap' 2>/dev/null | grep -q '$MARKER'"

# kill -9 under a running ping: XDP stays attached and drops what it cannot hand over.
kill9_gwA() {
    "$TOPO" exec hostA ping -c 30 -i 0.1 -W 1 "$HOSTB_IP4" >"$WORK/ping.out" 2>&1 &
    local p=$!
    sleep 1
    kill -9 "${DPID[gwA]}"
    wait "${DPID[gwA]}" 2>/dev/null
    unset "DPID[gwA]"
    capture_start || return 1
    wait "$p"
    capture_stop
}
kill9_gwA
plain=$(count "$HOSTS4") esp_a=$(count "esp and src host $GWA_PUB_IP4")
if [ "$plain" = 0 ] && [ "$esp_a" = 0 ]; then
    pass "kill -9 of gwA's daemon under ping: nothing of the ping on the wire (plaintext $plain, ESP from gwA $esp_a)"
else
    fail "kill -9 of gwA's daemon under ping" "plaintext $plain, ESP from gwA $esp_a"
fi
check "XDP still attached to gwA's protected interface" bash -c \
    "'$TOPO' exec gwA ip -d link show dev $GWA_PROT_IF | grep -q prog/xdp"

for gw in "${!DPID[@]}"; do kill "${DPID[$gw]}" 2>/dev/null; done
echo "$passed passed, $failed failed ($((SECONDS - start)) s)"
if [ "$failed" != 0 ]; then
    for gw in gwA gwB; do echo "--- $gw log"; tail -n 20 "$WORK/$gw.log"; done
fi
[ "$failed" = 0 ]
