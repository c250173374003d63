#!/bin/bash
# NextHops (userspace/kernel/nexthop.h) against the kernel's routes and neighbours.
#
#   netns gw: nexthop_probe           netns r1 (router)                    netns far
#   gw0 10.0.0.1   fd00::1  ------- r1a 10.0.0.2  fd00::2
#       02:..:00:10                      02:..:01:0a
#                                    r1b 10.9.0.1  fd09::1  ------------ far0 10.9.0.2  fd09::2
#                                                                          UDP listener
#   gw1 10.0.1.1   fd01::1  ------- r2a 10.0.1.2  fd01::2                 (netns r2)
#       02:..:00:11, mtu 1480            02:..:02:0a, mtu 1480
#
#   gw routes: 10.9.0.0/24 via 10.0.0.2 mtu 1400, fd09::/64 via fd00::2
#
# Asserts: an on-link neighbour is resolved with NTF_USE, without a data packet (r1 receives
# no IP packet); lookups return the device and next-hop MACs and the route or device MTU, for
# IPv4 and IPv6, on-link and through a gateway; local, broadcast and unreachable destinations
# report their state; a route change, a neighbour replaced by hand, a peer that changes its
# MAC (gratuitous ARP), a deleted neighbour and a device MTU/MAC change are picked up from
# events; the refresh leaves a permanent neighbour permanent; send_via_kernel delivers a
# hand-made UDP packet over IPv4 and IPv6 while the neighbour is being resolved, and reports
# EMSGSIZE for a packet over the MTU; the device list (links()) is read whole once and then
# kept from link events: macvlans added, down, deleted and given a new MAC, and a bridge joined
# and left, show in the MACs a device takes, as in a list read afresh; after a device left for
# another namespace, the kept list is still a list read now, device by device; a watched device
# that leaves and comes straight back is told as gone, a new device of a watched name as a
# change, both urgent; an address added is told, and an IPv4 one, a route of IPv4's local
# table or a device set down as a change of the broadcast routes (not a device made, moved or
# given another MTU, nor an IPv6 address); the broadcast addresses read from the local table
# are the kernel's broadcast routes, and only those.
#
# Usage: test_nexthop.sh PROBE_BINARY
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns or veth).
set -u
bin=$1
PY=/usr/bin/python3

source "$(dirname "$0")/../checks.sh"
require_netns "xnh-$$-probe"

P=xnh-$$-
GW=${P}gw R1=${P}r1 R2=${P}r2 FAR=${P}far
TMP=$(mktemp -d)
cleanup() {
    [ -n "${PROBE_PID:-}" ] && kill "$PROBE_PID" 2>/dev/null
    [ -n "${listener:-}" ] && kill "$listener" 2>/dev/null
    for ns in "$GW" "$R1" "$R2" "$FAR"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# require_netns found namespaces and veth pairs work: from here a failure is an error.
for ns in "$GW" "$R1" "$R2" "$FAR"; do
    ip netns add "$ns" || exit 1
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 \
        net.ipv6.conf.default.accept_dad=0 net.ipv4.conf.all.rp_filter=0 \
        net.ipv4.conf.default.rp_filter=0
    ip -n "$ns" link set lo up
done
ip link add gw0 netns "$GW" type veth peer name r1a netns "$R1" || exit 1
ip link add gw1 netns "$GW" type veth peer name r2a netns "$R2" || exit 1
ip link add r1b netns "$R1" type veth peer name far0 netns "$FAR" || exit 1
ip netns exec "$R1" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
    net.ipv4.conf.all.arp_notify=1 net.ipv4.conf.r1a.arp_notify=1

# setup NS DEV MAC MTU ADDRESS...
setup() {
    local ns=$1 dev=$2 mac=$3 mtu=$4 a
    shift 4
    ip -n "$ns" link set "$dev" address "$mac" mtu "$mtu" up || exit 1
    for a in "$@"; do
        case $a in
        *:*) ip -n "$ns" addr add "$a" dev "$dev" nodad || exit 1 ;;
        *) ip -n "$ns" addr add "$a" dev "$dev" || exit 1 ;;
        esac
    done
}
GW0=02:00:00:00:00:10 GW1=02:00:00:00:00:11 R1A=02:00:00:00:01:0a R1B=02:00:00:00:01:0b
R2A=02:00:00:00:02:0a FAR0=02:00:00:00:09:02
setup "$GW" gw0 $GW0 1500 10.0.0.1/24 fd00::1/64
setup "$GW" gw1 $GW1 1480 10.0.1.1/24 fd01::1/64
setup "$R1" r1a $R1A 1500 10.0.0.2/24 fd00::2/64
setup "$R1" r1b $R1B 1500 10.9.0.1/24 fd09::1/64
setup "$R2" r2a $R2A 1480 10.0.1.2/24 fd01::2/64
setup "$FAR" far0 $FAR0 1500 10.9.0.2/24 fd09::2/64
ip -n "$GW" route add 10.9.0.0/24 via 10.0.0.2 mtu 1400 || exit 1
ip -n "$GW" route add fd09::/64 via fd00::2 || exit 1
ip -n "$FAR" route add default via 10.9.0.1 || exit 1
ip -n "$FAR" -6 route add default via fd09::1 || exit 1

# same NAME WANT GOT
same() {
    if [ "$3" = "$2" ]; then pass "$1"; else fail "$1" "got '$3', want '$2'"; fi
}

# The probe runs in gw for the whole test, so that it sees every change as an event.
coproc PROBE { exec ip netns exec "$GW" "$bin" --refresh-ms 500; }
# ask COMMAND...: one answer in REPLY.
ask() {
    echo "$*" >&"${PROBE[1]}"
    IFS= read -r -t 10 REPLY <&"${PROBE[0]}" || REPLY="(no answer)"
}
# await NAME WANT COMMAND...: asks (every 0.1 s, up to 5 s) until the answer is WANT.
await() {
    local name=$1 want=$2 i
    shift 2
    for i in $(seq 50); do
        ask "$@"
        [ "$REPLY" = "$want" ] && break
        sleep 0.1
    done
    same "$name" "$want" "$REPLY"
}
# IP packets r1 has received (ARP is not IP).
ip_in() { ip netns exec "$R1" awk '/^Ip: [0-9]/ { print $4 }' /proc/net/snmp; }
neigh() { ip -n "$GW" neigh show "$1" dev "$2"; }

# ---- Resolution ---------------------------------------------------------------------------
same "no neighbour entry for 10.0.0.2 yet" "" "$(neigh 10.0.0.2 gw0)"
before=$(ip_in)
await "on-link IPv4: device MAC, MTU, peer MAC" "hop gw0 1500 $GW0 $R1A" lookup 10.0.0.2
same "resolved without a data packet (r1 received no IP packet)" "$before" "$(ip_in)"
case $(neigh 10.0.0.2 gw0) in
*"lladdr $R1A"*) pass "the kernel's neighbour entry was made by NTF_USE" ;;
*) fail "the kernel's neighbour entry was made by NTF_USE" "$(neigh 10.0.0.2 gw0)" ;;
esac
await "on-link IPv6" "hop gw0 1500 $GW0 $R1A" lookup fd00::2
await "IPv4 via a gateway, route MTU" "hop gw0 1400 $GW0 $R1A" lookup 10.9.0.2
await "IPv6 via a gateway" "hop gw0 1500 $GW0 $R1A" lookup fd09::2
await "second device" "hop gw1 1480 $GW1 $R2A" lookup 10.0.1.2

# ---- States -------------------------------------------------------------------------------
await "local IPv4 address" "state local" lookup 10.0.0.1
await "local IPv6 address" "state local" lookup fd00::1
await "loopback" "state local" lookup 127.0.0.1
await "broadcast" "state via-kernel" lookup 10.0.0.255
await "no route (IPv4)" "state unreachable" lookup 192.0.2.1
await "no route (IPv6)" "state unreachable" lookup 2001:db8::1
ip -n "$GW" route add unreachable 10.66.0.0/16
await "unreachable route" "state unreachable" lookup 10.66.0.1

# ---- Changes, from events -----------------------------------------------------------------
ip -n "$GW" route replace 10.9.0.0/24 via 10.0.1.2 dev gw1
ip -n "$GW" route replace fd09::/64 via fd01::2 dev gw1
await "route change (IPv4)" "hop gw1 1480 $GW1 $R2A" lookup 10.9.0.2
await "route change (IPv6)" "hop gw1 1480 $GW1 $R2A" lookup fd09::2

ip -n "$GW" neigh replace 10.0.1.2 dev gw1 lladdr 02:00:00:00:02:99 nud permanent
await "neighbour replaced by hand" "hop gw1 1480 $GW1 02:00:00:00:02:99" lookup 10.9.0.2
for i in $(seq 15); do ask lookup 10.9.0.2; sleep 0.1; done     # three refresh rounds
case $(neigh 10.0.1.2 gw1) in
*PERMANENT*) pass "refresh rounds leave a permanent neighbour permanent" ;;
*) fail "refresh rounds leave a permanent neighbour permanent" "$(neigh 10.0.1.2 gw1)" ;;
esac

ip -n "$R1" link set r1a address 02:00:00:00:01:99     # arp_notify: a gratuitous ARP
await "peer MAC change (gratuitous ARP)" "hop gw0 1500 $GW0 02:00:00:00:01:99" lookup 10.0.0.2

before=$(ip_in)
ip -n "$GW" neigh del 10.0.0.2 dev gw0
await "deleted neighbour resolved again" "hop gw0 1500 $GW0 02:00:00:00:01:99" lookup 10.0.0.2
same "... without a data packet" "$before" "$(ip_in)"

ask stats
flushes=${REPLY##*flushes=}
ip -n "$GW" link set gw0 mtu 1300
await "device MTU change" "hop gw0 1300 $GW0 02:00:00:00:01:99" lookup 10.0.0.2
ip -n "$GW" link set gw0 address 02:00:00:00:00:20
await "device MAC change" "hop gw0 1300 02:00:00:00:00:20 02:00:00:00:01:99" lookup 10.0.0.2
ask stats
same "device changes patch the entries (no flush)" "$flushes" "${REPLY##*flushes=}"

# ---- The device list (links()): listed whole once, then kept from the link events ---------
gw0_mac=$(ip -n "$GW" -o link show gw0 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
ask macs gw0
same "the MACs gw0 takes: its own, from one list of the devices" "macs $gw0_mac lists=1" "$REPLY"
for i in 1 2; do
    ip -n "$GW" link add link gw0 name mv$i address 02:00:00:00:00:3$i type macvlan mode private
    ip -n "$GW" link set mv$i up
done
await "two macvlans' MACs, from the events" \
    "macs $gw0_mac,02:00:00:00:00:31,02:00:00:00:00:32 lists=1" macs gw0
ip -n "$GW" link set mv1 down
ip -n "$GW" link del mv2
await "one down, one deleted: from the events" "macs $gw0_mac lists=1" macs gw0
ip -n "$GW" link set mv1 address 02:00:00:00:00:33
ip -n "$GW" link set mv1 up
await "a new MAC, up again" "macs $gw0_mac,02:00:00:00:00:33 lists=1" macs gw0
ask macs-dump gw0
same "... as a list read now has them" "macs $gw0_mac,02:00:00:00:00:33" "$REPLY"
ip -n "$GW" link del mv1
# A bridge joined and left: the master comes and goes with the events.
gw1_mac=$(ip -n "$GW" -o link show gw1 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
ip -n "$GW" link add br7 address 02:00:00:00:00:37 type bridge
ip -n "$GW" link set br7 up
ip -n "$GW" link set gw1 master br7
await "a bridge joined: its MAC, from the events" "macs $gw1_mac,02:00:00:00:00:37 lists=1" \
    macs gw1
ip -n "$GW" link set gw1 nomaster
await "... and left" "macs $gw1_mac lists=1" macs gw1
ip -n "$GW" link del br7
# A device that leaves for another namespace leaves what is stacked on it, and its veth peer,
# with no event: neither has a lower device here any more.
ip -n "$GW" link add xv0 type veth peer name xv1
ip -n "$GW" link add link xv0 name mvx type macvlan
ip -n "$GW" link set xv0 netns "$FAR"
ask links-match
case $REPLY in
"match "*) pass "the kept list is, device by device, a list read now ($REPLY)" ;;
*) fail "the kept list is, device by device, a list read now" "$REPLY" ;;
esac
# ... and coming back, it is their lower device again, with no event for them either.
ip -n "$FAR" link set xv0 netns "$GW"
await "a device back from another namespace: the kept list is a list read now" \
    "match 6" links-match
ip -n "$GW" link del mvx
ip -n "$GW" link del xv0
# A watched device that leaves and comes straight back, under the same index, is told as gone
# (each once); a device new here under a watched name is told as a change.
ip -n "$GW" link add xg0 type veth peer name xg1
xg0=$(ip netns exec "$GW" cat /sys/class/net/xg0/ifindex)
ask watch xg0 names xn0
ask gone  # xg0's own coming, if its event is read only now
ask gone
same "watching: nothing gone yet" "gone changed=0 urgent=0 unknown=0 addrs=0 brd=0" "$REPLY"
ip -n "$GW" link set xg0 netns "$FAR"
ip -n "$FAR" link set xg0 netns "$GW"
same "... it is back under the same index" "$xg0" "$(ip netns exec "$GW" cat /sys/class/net/xg0/ifindex)"
ask gone
same "a watched device away and back at once: told as gone, urgent" \
    "gone $xg0 changed=1 urgent=1 unknown=0 addrs=0 brd=0" "$REPLY"
ask gone
same "... once" "gone changed=0 urgent=0 unknown=0 addrs=0 brd=0" "$REPLY"
ip -n "$GW" link add xn0 type veth peer name xn1
ask gone
same "a device of a watched name made: told as an urgent change" \
    "gone changed=1 urgent=1 unknown=0 addrs=0 brd=0" "$REPLY"
ip -n "$GW" addr add 10.77.0.1/32 dev xn1
ask gone
same "an address added: told, the broadcast routes to read again too" \
    "gone changed=0 urgent=0 unknown=0 addrs=1 brd=1" "$REPLY"
ip -n "$GW" addr add fd77::1/128 dev xn1 nodad
ask gone
same "an IPv6 address: not the broadcast routes" \
    "gone changed=0 urgent=0 unknown=0 addrs=1 brd=0" "$REPLY"
ip -n "$GW" route add table local broadcast 10.77.9.255 dev lo
ask gone
same "a route of IPv4's local table: the broadcast routes to read again" \
    "gone changed=0 urgent=0 unknown=0 addrs=0 brd=1" "$REPLY"
# A device set down loses its broadcast routes with no route event; its MTU changes none.
# (Only brd= is compared: IPv6 may add addresses of its own meanwhile.)
ip -n "$GW" link set xn1 up
ask gone
ip -n "$GW" link set xn1 mtu 1400
ask gone
same "a device's MTU: not the broadcast routes" "brd=0" "${REPLY##* }"
ip -n "$GW" link set xn1 down
ask gone
same "a device set down: the broadcast routes to read again" "brd=1" "${REPLY##* }"
ask links-match
case $REPLY in
"match "*) pass "the kept list has the devices' names as a list read now ($REPLY)" ;;
*) fail "the kept list has the devices' names as a list read now" "$REPLY" ;;
esac
ip -n "$GW" link del xn0
ip -n "$GW" link del xg0

# ---- The broadcast addresses (rtnl::dump_broadcasts) ----------------------------------------
# Each subnet's under /31 and each explicit `brd`, as the kernel's broadcast routes have them;
# nothing for a /31, a `peer` or a device that is down; the main table's routes not at all.
ip -n "$GW" link add xb0 type veth peer name xb0p
ip -n "$GW" link set xb0 up
ip -n "$GW" addr add 10.60.0.1/24 dev xb0
ip -n "$GW" addr add 10.60.0.9/24 dev xb0                  # a secondary: nothing new
ip -n "$GW" addr add 10.61.0.1/28 brd 10.61.0.99 dev xb0   # 10.61.0.15 and 10.61.0.99
ip -n "$GW" addr add 10.62.0.1/31 dev xb0
ip -n "$GW" addr add 10.63.0.1 peer 10.63.0.2 dev xb0
ip -n "$GW" link add xb1 type veth peer name xb1p
ip -n "$GW" addr add 10.64.0.1/24 dev xb1                  # down
ip -n "$GW" route add 10.65.0.255/32 dev xb0               # main table, unicast
ask broadcasts
got=$(echo "${REPLY#broadcasts}" | tr ' ' '\n' | sed '/^$/d' | sort | tr '\n' ' ')
kernel=$(ip -n "$GW" route show table local type broadcast | awk '{print $2}' | sort | tr '\n' ' ')
same "the broadcast addresses are the kernel's broadcast routes" "$kernel" "$got"
want=yes
for a in 10.60.0.255 10.61.0.15 10.61.0.99 10.0.0.255 10.0.1.255; do
    case " $got" in *" $a "*) ;; *) want="no: $a missing" ;; esac
done
for a in 10.62.0.0 10.62.0.1 10.63.0.2 10.63.0.1 10.64.0.255 10.65.0.255 10.60.0.9; do
    case " $got" in *" $a "*) want="no: $a there" ;; esac
done
same "... each subnet's and brd; no /31, peer, down device or main-table route ($got)" yes "$want"
ip -n "$GW" link del xb0
ip -n "$GW" link del xb1

# ---- send_via_kernel ----------------------------------------------------------------------
ip -n "$GW" route replace 10.9.0.0/24 via 10.0.0.2 dev gw0
ip -n "$GW" route replace fd09::/64 via fd00::2 dev gw0
ip netns exec "$FAR" "$PY" -u -c '
import select, socket, sys, time
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
         socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)]
socks[0].bind(("10.9.0.2", 5555))
socks[1].bind(("fd09::2", 5555))
print("ready")
end = time.time() + 20
while time.time() < end:
    for s in select.select(socks, [], [], 0.2)[0]:
        print(s.recv(4096).decode())
' >"$TMP/rx" 2>&1 &
listener=$!
for i in $(seq 50); do
    grep -q ready "$TMP/rx" && break
    sleep 0.1
done
ip -n "$GW" neigh flush dev gw0      # the kernel queues the packets while it resolves
ask send 10.0.0.77 10.9.0.2 5555 hello-v4
same "send_via_kernel IPv4 (foreign source)" "sent" "$REPLY"
ask send fd00::77 fd09::2 5555 hello-v6
same "send_via_kernel IPv6 (foreign source)" "sent" "$REPLY"
for i in $(seq 50); do
    grep -q hello-v4 "$TMP/rx" && grep -q hello-v6 "$TMP/rx" && break
    sleep 0.1
done
grep -q '^hello-v4$' "$TMP/rx" && pass "IPv4 packet arrived at far" ||
    fail "IPv4 packet arrived at far" "$(tr '\n' ' ' <"$TMP/rx")"
grep -q '^hello-v6$' "$TMP/rx" && pass "IPv6 packet arrived at far" ||
    fail "IPv6 packet arrived at far" "$(tr '\n' ' ' <"$TMP/rx")"
ask send 10.0.0.77 10.9.0.2 5555 big df pad 1400
case $REPLY in
"error "*"Message too long") pass "IPv4 over the MTU with DF: EMSGSIZE" ;;
*) fail "IPv4 over the MTU with DF: EMSGSIZE" "$REPLY" ;;
esac
ask send fd00::77 fd09::2 5555 big pad 1400
case $REPLY in
"error "*"Message too long") pass "IPv6 over the MTU: EMSGSIZE" ;;
*) fail "IPv6 over the MTU: EMSGSIZE" "$REPLY" ;;
esac

ask stats
echo "     $REPLY"
case $REPLY in
*" sent=2 send_errors=2 "*) pass "send counters" ;;
*) fail "send counters" "$REPLY" ;;
esac
# ---- Path MTU the kernel learnt ----------------------------------------------------------
# A "fragmentation needed" for gw's own UDP socket makes the kernel cache MTU 1280 towards
# 10.9.0.5. That is for gw's own packets: forwarded ones keep the route's MTU (here gw0's
# 1300), as the kernel's forwarding does with ip_forward_use_pmtu=0.
ip netns exec "$GW" "$PY" -c '
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.0.0.1", 40000)); s.connect(("10.9.0.5", 9)); s.send(b"x"); time.sleep(1.5)' &
pmtu_sock=$!
sleep 0.3
ip netns exec "$R1" "$PY" -c '
from scapy.all import IP, ICMP, UDP, send
send(IP(src="10.0.0.2", dst="10.0.0.1") / ICMP(type=3, code=4, nexthopmtu=1280) /
     IP(src="10.0.0.1", dst="10.9.0.5") / UDP(sport=40000, dport=9), verbose=False)'
wait $pmtu_sock
case $(ip -n "$GW" route get 10.9.0.5) in
*expires*"mtu 1280"*) pass "the kernel learnt path MTU 1280 towards 10.9.0.5" ;;
*) fail "the kernel learnt path MTU 1280 towards 10.9.0.5" "$(ip -n "$GW" route get 10.9.0.5)" ;;
esac
await "a learnt path MTU is not the forwarding MTU" "hop gw0 1300 02:00:00:00:00:20 02:00:00:00:01:99" lookup 10.9.0.5
ask quit

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
