# Shared by the topology tests: the checks every test script makes before it starts, the
# pass/fail bookkeeping, and helpers that run traffic between the hosts and count what crosses
# the wire. Source it after setting HERE (this directory), TOPO, PY and XESP_TOPO_PREFIX; it
# reads the topology's names (xesp-topo names) and makes WORK, a scratch directory.

source "$HERE/../checks.sh"
require_netns "${XESP_TOPO_PREFIX}probe"

# ping_cmd NODE ADDRESS [ping.py options]: sets PING to the command line (for wire_capture.py).
ping_cmd() {
    PING=("$TOPO" exec "$1" "$PY" "$HERE/ping.py" -W 2 "${@:3}" "$2")
}
ping_from() {
    ping_cmd "$@"
    "${PING[@]}"
}

wait_listen() { # NODE PORT [udp]: until a TCP (or UDP) socket is bound to PORT in NODE
    local kind=-Hltn
    [ "${3:-}" = udp ] && kind=-Hlun
    for _ in $(seq 50); do
        "$TOPO" exec "$1" ss $kind "sport = :$2" | grep -q . && return 0
        sleep 0.1
    done
    echo "nothing listens on port $2 in $1"
    return 1
}

# 4 MiB of random bytes over TCP from one host to the other, compared by SHA-256. Direction
# "a2b" sends from hostA to hostB, "b2a" the reverse; FAMILY 4 (default) or 6. "dstopts"
# third: the sender's IPv6 packets carry a destination options header (IPV6_DSTOPTS).
tcp_python() {
    local dir=$1 fam=${2:-4} src=hostA dst=hostB dst_ip=$HOSTB_IP4 sum_sent sum_got opts=
    # IPV6_DSTOPTS (59): 8 bytes, a PadN option; the kernel writes the next header.
    [ "${3:-}" = dstopts ] && opts="c.setsockopt(socket.IPPROTO_IPV6,59,bytes([0,0,1,4,0,0,0,0]))"
    # IP_MTU_DISCOVER (10) = IP_PMTUDISC_DONT: IPv4 segments without DF.
    [ "${3:-}" = nodf ] && opts="c.setsockopt(socket.IPPROTO_IP,10,0)"
    [ "$fam" = 6 ] && dst_ip=$HOSTB_IP6
    if [ "$dir" = b2a ]; then
        src=hostB dst=hostA dst_ip=$HOSTA_IP4
        [ "$fam" = 6 ] && dst_ip=$HOSTA_IP6
    fi
    local sink="import hashlib,socket
s=socket.create_server(('$dst_ip',5201),family=socket.AF_INET$([ "$fam" = 6 ] && echo 6)); c,_=s.accept(); h=hashlib.sha256()
while (b:=c.recv(65536)): h.update(b)
print(h.hexdigest())"
    local source="import hashlib,os,socket
d=os.urandom(4<<20); c=socket.socket(socket.AF_INET$([ "$fam" = 6 ] && echo 6))
${opts}
c.connect(('$dst_ip',5201)); c.sendall(d); c.close()
print(hashlib.sha256(d).hexdigest())"
    "$TOPO" exec "$dst" "$PY" -c "$sink" >"$WORK/got" 2>&1 &
    server_pid=$!
    wait_listen "$dst" 5201 || return 1
    sum_sent=$("$TOPO" exec "$src" "$PY" -c "$source") || return 1
    wait "$server_pid"
    server_pid=
    sum_got=$(cat "$WORK/got")
    [ "$sum_sent" = "$sum_got" ] || { echo "sent $sum_sent, received $sum_got"; return 1; }
}

# wire_counts CMD...: prints one count per filter in $FILTERS for frames on the wire during CMD.
wire_counts() {
    local args=() f
    for f in "${FILTERS[@]}"; do args+=(--filter "$f"); done
    "$PY" "$HERE/wire_capture.py" --netns "$NS_WIRE" --dev "$WIRE_IF" "${args[@]}" -- "$@" \
        2>"$WORK/capture.err" | tr '\n' ' '
}

expect_counts() { # NAME WANT CMD...: the counts must read WANT ("6 0 " style)
    local name=$1 want=$2 got
    shift 2
    got=$(wire_counts "$@")
    if [ "$got" = "$want" ]; then
        pass "$name"
    else
        fail "$name" "counts '$got', want '$want'; $(tail -n 2 "$WORK/capture.err" | tr '\n' ' ')"
    fi
}


WORK=$(mktemp -d /tmp/xesp-topo-test.XXXXXX)
eval "$("$TOPO" names)"
