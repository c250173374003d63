# Shared by the gateway tests (test_gateway.sh, test_gateway_modes.sh): xesp daemons on both
# gateways of the topology, their CLI and counters, UDP sinks and senders, and a router on the
# wire that reports a smaller path MTU. Source it after lib.sh, with XESP (the xesp binary),
# HERE, TOPO and PY set; set `start=$SECONDS` before the first check and end with `finish`.

declare -A DPID=()
cleanup() {
    local gw
    for gw in "${!DPID[@]}"; do kill -9 "${DPID[$gw]}" 2>/dev/null; done
    [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
    "$TOPO" down >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME CMD...: as check, but CMD runs in this shell (it may start daemons and keep their
# pids), its output kept in a file.
step() {
    local name=$1
    shift
    if "$@" >"$WORK/step.out" 2>&1; then
        pass "$name"
    else
        fail "$name" "$(tail -n 3 "$WORK/step.out" | tr '\n' ' ')"
    fi
}

# ---- Gateways --------------------------------------------------------------------------------

cli() { # GW ARGS...: the xesp command against GW's daemon
    local gw=$1
    shift
    XESP_SOCKET=$WORK/$gw.sock "$XESP" "$@"
}

# start_gw GW [daemon options...]: starts the daemon in GW's namespace (state file GW.state in
# $STATE_DIR, default $WORK) and waits for its socket. $XESP_DAEMON_ARGS (as --workers 2) go
# to every daemon.
start_gw() {
    local gw=$1
    shift
    "$TOPO" exec "$gw" "$XESP" daemon --socket "$WORK/$gw.sock" \
        --state "${STATE_DIR:-$WORK}/$gw.state" "$@" ${XESP_DAEMON_ARGS:-} >>"$WORK/$gw.log" 2>&1 &
    DPID[$gw]=$!
    for _ in $(seq 100); do
        cli "$gw" iface list >/dev/null 2>&1 && return 0
        kill -0 "${DPID[$gw]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "$gw: the daemon did not come up: $(tail -n 3 "$WORK/$gw.log")"
    return 1
}

stop_gw() { # GW [SIGNAL]
    local gw=$1 sig=${2:-TERM} rc pid=${DPID[$1]:-}
    [ -n "$pid" ] || return 1
    kill -"$sig" "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
    if [ "$rc" = 127 ]; then        # not this shell's child (started from a subshell)
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        rc=0
    fi
    unset "DPID[$gw]"
    return $rc
}

# A learnt path MTU lasts this long here (600 s by default): long enough for the checks that
# use it, scapy runs and all, on a loaded machine (8 s was not), short enough to see it expire.
PMTU_EXPIRES=20

# The protected interfaces' mode (`iface add ... mode xdp|tun`): XESP_PROT_MODE, default xdp.
# In tun mode the hosts keep their offloads (TSO, TX checksums), as they would behind a
# gateway that takes their super-packets.
PROT_MODE=${XESP_PROT_MODE:-xdp}
[ "$PROT_MODE" = tun ] && export XESP_TOPO_HOST_OFFLOADS=default

# prot_attached GW DEV: the protected-side program of PROT_MODE is on DEV (XDP, or tc ingress).
prot_attached() {
    if [ "$PROT_MODE" = tun ]; then
        "$TOPO" exec "$1" tc filter show dev "$2" ingress | grep -q xesp_tc_protect  # the name as the kernel keeps it (15 characters)
    else
        xdp_attached "$1" "$2"
    fi
}

# up_pair MODE-OPTIONS...: fresh daemons on both gateways with `xesp-topo config` for them.
up_pair() {
    local gw
    rm -f "$WORK"/gw?.state
    for gw in gwA gwB; do
        "$TOPO" config "$gw" "$@" >"$WORK/$gw.conf" || return 1
        start_gw "$gw" -b "$WORK/$gw.conf" --pmtu-expires "$PMTU_EXPIRES" || return 1
    done
    cli gwA iface add "$GWA_PROT_IF" role protected mode "$PROT_MODE" &&
        cli gwA iface add "$GWA_PUB_IF" role public &&
        cli gwB iface add "$GWB_PUB_IF" role public &&
        cli gwB iface add "$GWB_PROT_IF" role protected mode "$PROT_MODE"
}

down_pair() {
    stop_gw gwA
    stop_gw gwB
    return 0
}

# stat GW JQ-LIKE-PATH: one number from `xesp stats -j`, e.g. stat gwB 'drops.in-icv-fail'
# or stat gwA 'sas[spi=0x1001].packets'.
stat() {
    cli "$1" stats -j | "$PY" -c '
import json, re, sys
j = json.load(sys.stdin)
for part in sys.argv[1].split("."):
    m = re.fullmatch(r"(\w+)\[spi=(\w+)\]", part)
    if m:
        j = next(s for s in j[m.group(1)] if s["spi"] == int(m.group(2), 0))
    elif part.isdigit():
        j = j[int(part)]
    else:
        j = j[part]
print(j)' "$2"
}

# counts_are NAME "CMP CMP ..." CMD...: one comparison per filter in FILTERS, e.g. "=0 >=5".
counts_are() {
    local name=$1 want=($2) got i ok=1
    shift 2
    got=($(wire_counts "$@"))
    for i in "${!want[@]}"; do
        local w=${want[$i]} g=${got[$i]:-x} op val
        op=${w%%[0-9]*} val=${w#"$op"}
        case $op in
        "=") [ "$g" = "$val" ] || ok=0 ;;
        ">=") [ "$g" -ge "$val" ] 2>/dev/null || ok=0 ;;
        esac
    done
    if [ "$ok" = 1 ]; then
        pass "$name (${got[*]})"
    else
        fail "$name" "counts '${got[*]}', want '${want[*]}'; $(tail -n 2 "$WORK/capture.err" | tr '\n' ' ')"
    fi
}

# udp_cmd NODE DST COUNT MARKER [INTERVAL]: sets UDP to the command that sends COUNT datagrams
# carrying MARKER to DST port 5300 (for wire_capture.py).
udp_cmd() {
    UDP=("$TOPO" exec "$1" "$PY" -c "
import socket, time
fam = socket.AF_INET6 if ':' in '$2' else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
for i in range($3):
    s.sendto(b'$4 %d' % i, ('$2', 5300))
    time.sleep(${5:-0.002})")
}

# raw_cmd NODE DST COUNT MARKER [INTERVAL]: as udp_cmd, in IP datagrams of protocol 253 (for
# experiments, RFC 3692) instead: in tun mode UDP takes the local link, the rest the TUN.
raw_cmd() {
    UDP=("$TOPO" exec "$1" "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 253)
for i in range($3):
    s.sendto(b'$4 %d' % i, ('$2', 0))
    time.sleep(${5:-0.002})")
}

# udp_sink NODE ADDR SECONDS [DEV]: counts the datagrams that reach ADDR port 5300 for
# SECONDS; with DEV, ADDR is an IPv4 group the sink is a member of on DEV.
udp_sink() {
    "$TOPO" exec "$1" "$PY" -c "
import socket, struct, time
fam = socket.AF_INET6 if ':' in '$2' else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
if '${4:-}':
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton('$2') +
                 socket.inet_aton('0.0.0.0') + struct.pack('i', socket.if_nametoindex('${4:-}')))
s.bind(('$2', 5300)); s.settimeout(0.2)
n, end = 0, time.time() + $3
while time.time() < end:
    try:
        s.recv(2048); n += 1
    except socket.timeout:
        pass
print(n)"
}
# sink_start NODE ADDR SECONDS [DEV]: udp_sink in the background, bound when this returns;
# sink_count VAR then waits for it and sets VAR to its count (not in a $(...): the sink is
# this shell's child).
sink_start() {
    udp_sink "$@" >"$WORK/sink.count" &
    SINK=$!
    wait_listen "$1" 5300 udp
}
sink_count() {
    wait "$SINK"
    printf -v "$1" '%s' "$(cat "$WORK/sink.count")"
}
# nodf_send FILL [BYTES]: the script for 20 datagrams of BYTES (default 1460) from hostA to
# hostB without DF (each starts with its number, then FILL).
nodf_send() {
    echo "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 0)          # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: no DF
for i in range(20):
    s.sendto(b'%04d' % i + b'$1' * (${2:-1460} - 4), ('$HOSTB_IP4', 5300))
    time.sleep(0.01)"
}

# icmp_answers SEND: hostA runs the Python SEND, with `s` a UDP socket of its own, and prints
# the type/code of each ICMP error ("3/4", "11/0") it gets in the 2 s after, space-separated.
icmp_answers() {
    "$TOPO" exec hostA "$PY" -c "
import socket, time
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
r.settimeout(0.5)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
$1
got = []
end = time.time() + 2
while time.time() < end:
    try:
        d = r.recv(2000)
    except socket.timeout:
        continue
    h = (d[0] & 15) * 4
    if d[h] in (3, 11):
        got.append('%d/%d' % (d[h], d[h + 1]))
print(' '.join(got))"
}

xdp_attached() { # GW DEV
    "$TOPO" exec "$1" ip -d link show dev "$2" | grep -q 'prog/xdp'
}

# pmtu_learnt [BYTES]: hostA sends a DF datagram of BYTES (default 1460) that no longer fits
# once encrypted and prints the path MTU it learnt (from gwA's "fragmentation needed").
pmtu_learnt() {
    "$TOPO" exec hostA "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)          # IP_MTU_DISCOVER = IP_PMTUDISC_DO
s.connect(('$HOSTB_IP4', 5300))
for _ in range(2):      # EMSGSIZE: hostA knows the path MTU already (TCP found it earlier)
    try:
        s.send(b'x' * ${1:-1460})
    except OSError as e:
        if e.errno != 90:
            raise
    time.sleep(0.5)
print(s.getsockopt(socket.IPPROTO_IP, 14))      # IP_MTU"
}

# report_to_gwA SPI SEQ MTU [--natt]: a router on the wire (scapy) reports a smaller path MTU
# for gwA's SA SPI (IPv6 for 0x1002), quoting sequence number SEQ.
report_to_gwA() {
    local mac addrs=(192.0.2.254 "$GWA_PUB_IP4" "$GWB_PUB_IP4")
    mac=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PUB_IF/address)
    [ "$1" = 0x1002 ] && addrs=(2001:db8::fe "$GWA_PUB_IP6" "$GWB_PUB_IP6")
    "$TOPO" exec wire "$PY" "$HERE/icmp_report.py" --iface "$WIRE_A_IF" --mac "$mac" \
        --router "${addrs[0]}" --src "${addrs[1]}" --dst "${addrs[2]}" \
        --spi "$1" --seq "$2" --mtu "$3" "${@:4}" 2>/dev/null
}

# finish: the summary, the daemons' last words if a check failed, and the exit status.
finish() {
    local gw
    echo "$passed passed, $failed failed ($((SECONDS - start)) s)"
    if [ "$failed" != 0 ]; then
        for gw in gwA gwB; do echo "--- $gw log"; tail -n 20 "$WORK/$gw.log"; done
    fi
    [ "$failed" = 0 ]
}
