#!/usr/bin/env bash
# TCP and UDP between two network namespaces over two TUN devices with vnet headers, joined by
# tun_relay (offload/tun.h, offload/gso.h): the sending kernel hands over super-packets (TSO,
# USO), the relay passes them, or cuts them to 1400 bytes (gso_split), or cuts and joins them
# again (Gro), and the receiving kernel checks what it writes. Over IPv4 and IPv6, each way:
# 16 MiB of TCP must arrive intact (SHA-256), and so must every UDP datagram (1 to 4000
# bytes, the biggest fragmented by the sender, and a USO send cut into datagrams), with no
# TCP or UDP checksum error counted.
#
#   ns xesptunc                    tun_relay (in xesptunc)                    ns xesptuns
#   10.9.1.1       +------+   read one, gso_split, Gro,    +------+       10.9.2.1
#   fd00:9:1::1    | tunc | <-----  write the other  -----> | tuns |    fd00:9:2::1
#                  +------+       (MTU 1400 for both)      +------+
#
#   test_tun_offload.sh TUN_RELAY
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
RELAY=$1
PY=/usr/bin/python3
source "$HERE/../checks.sh"
require_netns xesptunprobe
if [ ! -c /dev/net/tun ]; then
    echo "SKIP: no /dev/net/tun"
    exit 77
fi

C=xesptunc S=xesptuns
WORK=$(mktemp -d)
relay_pid=
cleanup() {
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null
    ip netns del $C 2>/dev/null
    ip netns del $S 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

# addr NS FAMILY: the address of the namespace's end of the wire.
addr() {
    local n=1
    [ "$1" = $S ] && n=2
    if [ "$2" = 6 ]; then echo "fd00:9:$n::1"; else echo "10.9.$n.1"; fi
}

# listening NS PROTO PORT: waits (up to 5 s) for a socket bound to PORT in NS (ss -t or -u).
listening() {
    for _ in $(seq 50); do
        ip netns exec "$1" ss -Hln"$2" "sport = :$3" | grep -q . && return 0
        sleep 0.1
    done
    return 1
}

# transfer FAMILY FROM TO: 16 MiB over TCP, compared by SHA-256.
transfer() {
    local dst fam=""
    dst=$(addr "$3" "$1")
    [ "$1" = 6 ] && fam=6
    ip netns exec "$3" timeout 15 "$PY" -c "import hashlib,socket
s=socket.create_server(('$dst',5201),family=socket.AF_INET$fam); c,_=s.accept(); h=hashlib.sha256()
while (b:=c.recv(1<<20)): h.update(b)
print(h.hexdigest())" >"$WORK/got" 2>&1 &
    local server=$!
    listening "$3" t 5201
    local sent
    sent=$(ip netns exec "$2" timeout 15 "$PY" -c "import hashlib,os,socket
d=os.urandom(16<<20); c=socket.create_connection(('$dst',5201)); c.sendall(d); c.close()
print(hashlib.sha256(d).hexdigest())")
    wait $server
    [ -n "$sent" ] && [ "$sent" = "$(cat "$WORK/got")" ] ||
        { echo "sent '$sent', received '$(cat "$WORK/got")'"; return 1; }
}

# The datagrams a UDP check sends, the same code for sender and receiver: each payload
# different (its index first, then bytes drawn from it), of sizes that take in the smallest,
# 64 bytes, a packet of exactly the MTU (1400 - headers), 1400 bytes of payload and 4000 (both
# fragmented by the sender), each 3 times; and one USO send (UDP_SEGMENT, 1000 bytes each) of
# 5300 bytes, which arrives as 6 datagrams.
UDP_GEN='import random,socket
def datagrams(fam):
    exact = 1400 - (28 if fam == socket.AF_INET else 48)
    out = []
    for size in (1, 64, 1000, exact, 1400, 4000):
        for _ in range(3):
            i = len(out)
            out.append(bytes([i]) + random.Random(i).randbytes(size - 1))
    return out
def uso(fam):
    return random.Random(1000).randbytes(5300)'

# udp FAMILY FROM TO: every datagram of UDP_GEN arrives, intact and once.
udp() {
    local dst fam=""
    dst=$(addr "$3" "$1")
    [ "$1" = 6 ] && fam=6
    ip netns exec "$3" timeout 15 "$PY" -c "$UDP_GEN
fam = socket.AF_INET$fam
want = datagrams(fam)
whole = uso(fam)
want += [whole[k:k + 1000] for k in range(0, len(whole), 1000)]
s = socket.socket(fam, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind(('$dst', 5301))
s.settimeout(3)
got = []
try:
    while len(got) < len(want):
        got.append(s.recv(65536))
except socket.timeout:
    pass
missing = [len(d) for d in want if d not in got]
extra = [len(d) for d in got if d not in want]
if missing or extra or len(got) != len(want):
    print(f'{len(got)} of {len(want)} datagrams; missing (sizes) {missing}; '
          f'received but not sent (sizes) {extra}')
else:
    print(f'ok {len(got)}')" >"$WORK/udp.got" 2>&1 &
    local server=$!
    listening "$3" u 5301
    ip netns exec "$2" timeout 15 "$PY" -c "$UDP_GEN
import time
fam = socket.AF_INET$fam
s = socket.socket(fam, socket.SOCK_DGRAM)
for d in datagrams(fam):
    s.sendto(d, ('$dst', 5301))
    time.sleep(0.002)
s.setsockopt(socket.SOL_UDP, 103, 1000)  # UDP_SEGMENT
s.sendto(uso(fam), ('$dst', 5301))" || { echo "sender failed"; kill $server; return 1; }
    wait $server
    grep -q '^ok ' "$WORK/udp.got" || { cat "$WORK/udp.got"; return 1; }
}

stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$WORK/stats"; }

# csum_errors: fails on a TCP or UDP checksum error counted in either namespace (since it was
# made), or on a counter not there to read.
csum_errors() {
    local ns bad=0
    for ns in $C $S; do
        ip netns exec "$ns" nstat -az TcpInCsumErrors UdpInCsumErrors Udp6InCsumErrors |
            awk -v ns="$ns" '/CsumErrors/ { n++; if ($2 != 0) { print ns ": " $1 " " $2; bad = 1 } }
                END { if (n != 3) print ns ": " n + 0 " of 3 counters"; exit bad || n != 3 }' ||
            bad=1
    done
    return $bad
}

for mode in pass split split-join; do
    ip netns del $C 2>/dev/null
    ip netns del $S 2>/dev/null
    ip netns add $C
    ip netns add $S
    rm -f "$WORK/stats"
    ip netns exec $C "$RELAY" tunc tuns $mode 1400 "$WORK/stats" >"$WORK/relay.out" 2>&1 &
    relay_pid=$!
    for _ in $(seq 50); do
        grep -q ready "$WORK/relay.out" && break
        sleep 0.1
    done
    if ! grep -q ready "$WORK/relay.out"; then
        fail "$mode: relay starts" "$(cat "$WORK/relay.out")"
        continue
    fi
    ip -n $C link set tuns netns $S
    for ns in $C $S; do
        ip -n $ns link set lo up
    done
    ip -n $C addr add 10.9.1.1 peer 10.9.2.1 dev tunc
    ip -n $S addr add 10.9.2.1 peer 10.9.1.1 dev tuns
    ip -n $C -6 addr add fd00:9:1::1 peer fd00:9:2::1 dev tunc nodad
    ip -n $S -6 addr add fd00:9:2::1 peer fd00:9:1::1 dev tuns nodad
    ip -n $C link set tunc mtu 1400 up
    ip -n $S link set tuns mtu 1400 up
    ip -n $C -6 route replace fd00:9:2::1 dev tunc
    ip -n $S -6 route replace fd00:9:1::1 dev tuns
    for fam in 4 6; do
        check "$mode: 16 MiB of TCP over IPv$fam arrive intact, C to S" transfer $fam $C $S
        check "$mode: 16 MiB of TCP over IPv$fam arrive intact, S to C" transfer $fam $S $C
        check "$mode: UDP datagrams over IPv$fam arrive intact, C to S" udp $fam $C $S
        check "$mode: UDP datagrams over IPv$fam arrive intact, S to C" udp $fam $S $C
    done
    check "$mode: no TCP or UDP checksum error at either end" csum_errors
    kill -TERM $relay_pid
    wait $relay_pid
    relay_pid=
    check "$mode: the senders' kernels hand over super-packets (TSO)" [ "$(stat_of super)" -gt 0 ]
    # USO (TUN_F_USO4, 0x20) where the kernel has it (6.2 on): the UDP_SEGMENT sends come whole.
    if (($(sed -n 's/^ready offloads //p' "$WORK/relay.out" | grep . || echo 0) & 0x20)); then
        check "$mode: and UDP super-packets (USO)" [ "$(stat_of super_udp)" -gt 0 ]
    fi
    check "$mode: every read a packet" [ "$(stat_of read_errors)/$(stat_of read_empty)" = 0/0 ]
    check "$mode: every write taken" [ "$(stat_of write_errors)" = 0 ]
    if [ $mode != pass ]; then
        check "$mode: every super-packet cut" [ "$(stat_of split_errors)" = 0 ]
        check "$mode: more pieces than packets read" [ "$(stat_of pieces)" -gt "$(stat_of reads)" ]
    fi
    if [ $mode = split-join ]; then
        check "$mode: pieces joined again (GRO)" [ "$(stat_of joined)" -gt 0 ]
        if (($(sed -n 's/^ready offloads //p' "$WORK/relay.out" | grep . || echo 0) & 0x20)); then
            check "$mode: and UDP datagrams joined again (USO)" [ "$(stat_of joined_udp)" -gt 0 ]
        fi
        check "$mode: fewer writes than pieces" [ "$(stat_of writes)" -lt "$(stat_of pieces)" ]
    fi
    echo "   $mode: $(tr '\n' ' ' <"$WORK/stats")"
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
