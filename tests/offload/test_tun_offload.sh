#!/usr/bin/env bash
# TCP between two network namespaces over two TUN devices with vnet headers, joined by
# tun_relay (offload/tun.h, offload/gso.h): the sending kernel hands over super-packets (TSO),
# the relay passes them, or cuts them to 1400 bytes (gso_split), or cuts and joins them again
# (Gro), and the receiving kernel checks what it writes: 16 MiB must arrive intact (SHA-256),
# with no TCP checksum error counted, over IPv4 and IPv6.
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

# transfer FAMILY: 16 MiB from C to S, compared by SHA-256.
transfer() {
    local dst=10.9.2.1 fam=""
    [ "$1" = 6 ] && dst=fd00:9:2::1 fam=6
    ip netns exec $S "$PY" -c "import hashlib,socket
s=socket.create_server(('$dst',5201),family=socket.AF_INET$fam); c,_=s.accept(); h=hashlib.sha256()
while (b:=c.recv(1<<20)): h.update(b)
print(h.hexdigest())" >"$WORK/got" 2>&1 &
    local server=$!
    for _ in $(seq 50); do
        ip netns exec $S ss -Hltn "sport = :5201" | grep -q . && break
        sleep 0.1
    done
    local sent
    sent=$(ip netns exec $C timeout 60 "$PY" -c "import hashlib,os,socket
d=os.urandom(16<<20); c=socket.create_connection(('$dst',5201)); c.sendall(d); c.close()
print(hashlib.sha256(d).hexdigest())")
    wait $server
    [ -n "$sent" ] && [ "$sent" = "$(cat "$WORK/got")" ] ||
        { echo "sent '$sent', received '$(cat "$WORK/got")'"; return 1; }
}

stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$WORK/stats"; }

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
    ip netns exec $S nstat -n >/dev/null
    check "$mode: 16 MiB over IPv4 arrive intact" transfer 4
    check "$mode: 16 MiB over IPv6 arrive intact" transfer 6
    csum_errors=$(ip netns exec $S nstat -az TcpInCsumErrors | awk '/TcpInCsumErrors/ { print $2 }')
    check "$mode: no TCP checksum error at the receiver" [ "${csum_errors:-x}" = 0 ]
    kill -TERM $relay_pid
    wait $relay_pid
    relay_pid=
    check "$mode: the sender's kernel hands over super-packets (TSO)" [ "$(stat_of super)" -gt 0 ]
    check "$mode: every write taken" [ "$(stat_of write_errors)" = 0 ]
    if [ $mode != pass ]; then
        check "$mode: every super-packet cut" [ "$(stat_of split_errors)" = 0 ]
        check "$mode: more pieces than packets read" [ "$(stat_of pieces)" -gt "$(stat_of reads)" ]
    fi
    if [ $mode = split-join ]; then
        check "$mode: pieces joined again (GRO)" [ "$(stat_of joined)" -gt 0 ]
        check "$mode: fewer writes than pieces" [ "$(stat_of writes)" -lt "$(stat_of pieces)" ]
    fi
    echo "   $mode: $(tr '\n' ' ' <"$WORK/stats")"
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
