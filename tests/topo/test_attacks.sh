#!/bin/bash
# Attacks on a pair of running gateways, with scapy as the attacker (attacker.py), judged from
# a capture on the wire namespace, where XDP on either gateway cannot hide a frame.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB
#   10.1.0.2   xesp      192.0.2.x   xesp      10.2.0.2
#                        ^ the attacker sends on wire-a (towards gwA) and captures there
#
# The configuration is `xesp-topo config` (tunnel mode, SAs without `dir`), as the README shows.
#
#  #  attack                                           counter that must rise (gwA)   leaked delivered
#  1  gwA's own outbound ESP sent back to gwA's        xdp.drop-esp-reflected          0      -
#     public interface (reflection)
#  2  ESP on the peer's own SA whose inner packet no    drops.in-no-policy              -      0
#     policy allows (source in gwA's own site)
#  3  from hostA to hostB: IKE on 4500 and 500, ESP in  xdp.redirect-encap (encrypted;  0      -
#     UDP and raw ESP of an SPI nobody owns, an ESP     tun mode: xdp.tun-encap and,
#     fragment: the exceptions are for gwA itself only  for UDP, xdp.redirect-encap)
#  4  plaintext from site A to site B injected on the   xdp.drop-public-plaintext       0      0
#     public side, to gwA's MAC
#  5  SIGTERM of gwA's daemon, and a restart, under     xdp.xsk-missing (while stopped; 0      -
#     traffic: the classifier stays and drops          tun mode: xdp.drop-tun-gone)
#  6  through the peer's SA, to the broadcast address   gateway.drop-decrypted-broadcast -      0
#     of gwA's protected subnet (a directed broadcast,  (tun mode: the kernel's input
#     RFC 2644): not broadcast on gwA's site            takes it from the TUN; decrypted)
#  7  through the peer's SA under policies that take    drops.in-martian (and, for         0      0
#     any address: to or from loopback, from multicast  multicast, gateway.drop-decrypted-
#     or gwA's own address, to a multicast group        multicast; tun mode: the kernel)
#  8  from hostA with gwA's own LAN address as source,  xdp.drop-martian                0      0
#     under the out policy (as the kernel, not sent)
#
# With XESP_PROT_MODE=tun the protected interfaces are in tun mode (gateway_lib.sh), and the
# rows count what the tc program counts in place of XDP.
#
# "leaked": frames on the wire carrying the attack's plaintext marker (or, for 4 and 8, ESP
# that gwA made of it). "delivered": datagrams the attack got to a host. Each row also checks
# that the counter rose, and rows 2, 4, 6, 7 and 8 have a control: the same path with what the
# policies allow gets through, so the zero is not the test's own doing.
#
# Usage: bash test_attacks.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_attacks.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-a$$-

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"

ATTACKER=$HERE/attacker.py
declare -A ROW=()           # the summary: attack number -> "counter +N, leaked L, delivered D"

start=$SECONDS
check "topology up" "$TOPO" up
step "daemons up with the tunnel config, interfaces added" up_pair
if [ "$failed" != 0 ]; then
    finish
    exit 1
fi
check "the tunnel carries a ping" ping_from hostA "$HOSTB_IP4" -c 2
GWA_MAC=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PUB_IF/address)

# delta GW PATH[+PATH...] CMD...: runs CMD and sets DELTA to how much the counters PATH of GW
# rose, together.
delta() {
    local gw=$1 paths=$2 before=0 after=0 path
    shift 2
    for path in ${paths//+/ }; do before=$((before + $(stat "$gw" "$path"))); done
    "$@"
    for path in ${paths//+/ }; do after=$((after + $(stat "$gw" "$path"))); done
    DELTA=$((after - before))
}

# ---- 1: reflection ---------------------------------------------------------------------------
reflection() {
    local marker=refl$$ n=5 leaked
    "$TOPO" exec wire "$PY" "$ATTACKER" capture --iface "$WIRE_A_IF" --src "$GWA_PUB_IP4" \
        --spi 0x1001 --count $n --out "$WORK/gwA-esp.pcap" --ready "$WORK/capturing" >/dev/null &
    local cap=$!
    for _ in $(seq 200); do [ -e "$WORK/capturing" ] && break; sleep 0.1; done
    udp_cmd hostA "$HOSTB_IP4" 20 "$marker" 0.05
    "${UDP[@]}"
    wait $cap || { echo "did not capture $n of gwA's ESP frames"; return 1; }
    FILTERS=("contains $marker")
    delta gwA xdp.drop-esp-reflected wire_counts_into leaked \
        "$TOPO" exec wire "$PY" "$ATTACKER" replay --iface "$WIRE_A_IF" --mac "$GWA_MAC" \
        --pcap "$WORK/gwA-esp.pcap"
    ROW[1]="xdp.drop-esp-reflected +$DELTA, leaked $leaked, delivered -"
    echo "${ROW[1]}"
    [ "$leaked" = 0 ] && [ "$DELTA" -ge $n ]
}
# wire_counts_into VAR CMD...: wire_counts, its first count into VAR.
wire_counts_into() {
    local var=$1 got
    shift
    got=$(wire_counts "$@")
    printf -v "$var" '%s' "${got%% *}"
}
step "1 reflected ESP is not decrypted: dropped and counted, nothing in clear" reflection

# ---- 2: what comes out of an SA must match a policy ------------------------------------------
KEY_BA=$(grep -o 'spi 0x2001 .*' "$WORK/gwA.conf" | grep -o '0x[0-9a-f]\{40\}')
forge_to_hostA() { # INNER_SRC SEQ MARKER: 10 forged packets through SA 0x2001, counted at hostA
    local n
    sink_start hostA "$HOSTA_IP4" 3
    "$TOPO" exec wire "$PY" "$ATTACKER" forge --iface "$WIRE_A_IF" --mac "$GWA_MAC" \
        --src "$GWB_PUB_IP4" --dst "$GWA_PUB_IP4" --spi 0x2001 --key "$KEY_BA" --seq "$2" \
        --inner-src "$1" --inner-dst "$HOSTA_IP4" --marker "$3" --count 10 >/dev/null
    sink_count n
    DELIVERED=$n
}
no_policy() {
    forge_to_hostA "$HOSTB_IP4" 1000000 ctl$$        # control: what the fwd policy allows
    [ "$DELIVERED" = 10 ] || { echo "control: $DELIVERED of 10 allowed packets arrived"; return 1; }
    delta gwA drops.in-no-policy forge_to_hostA 10.1.0.99 1000100 forged$$
    ROW[2]="drops.in-no-policy +$DELTA, leaked -, delivered $DELIVERED (control: 10 of 10)"
    echo "${ROW[2]}"
    [ "$DELIVERED" = 0 ] && [ "$DELTA" = 10 ]
}
step "2 an inner packet no policy allows is dropped as in-no-policy" no_policy

# ---- 3: the exceptions hold for the gateway's own addresses only -----------------------------
exceptions() {
    local marker=exc$$ leaked esp
    FILTERS=("contains $marker" "esp src $GWA_PUB_IP4")
    local counter=xdp.redirect-encap
    [ "$PROT_MODE" = tun ] && counter=xdp.tun-encap+xdp.redirect-encap  # TUN; local link (UDP)
    delta gwA $counter wire_counts_into leaked \
        "$TOPO" exec hostA "$PY" "$ATTACKER" exceptions --dst "$HOSTB_IP4" --marker "$marker"
    ROW[3]="$counter +$DELTA, leaked $leaked, delivered -"
    echo "${ROW[3]}"
    [ "$leaked" = 0 ] && [ "$DELTA" -ge 5 ]
}
step "3 IKE, NAT-T and foreign ESP from a protected host are encrypted, never in clear" exceptions

# ---- 4: plaintext injected on the public side ------------------------------------------------
inject() {
    local marker=inj$$ esp n
    sink_start hostB "$HOSTB_IP4" 3
    FILTERS=("esp src $GWA_PUB_IP4 dst $GWB_PUB_IP4")
    delta gwA xdp.drop-public-plaintext wire_counts_into esp \
        "$TOPO" exec wire "$PY" "$ATTACKER" inject --iface "$WIRE_A_IF" --mac "$GWA_MAC" \
        --src "$HOSTA_IP4" --dst "$HOSTB_IP4" --marker "$marker" --count 10
    sink_count n
    ROW[4]="xdp.drop-public-plaintext +$DELTA, leaked $esp, delivered $n"
    echo "${ROW[4]}"
    [ "$esp" = 0 ] && [ "$n" = 0 ] && [ "$DELTA" = 10 ]
}
step "4 plaintext injected on the public side is dropped, never encrypted" inject
# The control: the same datagrams from hostA itself are encrypted and delivered.
control_inject() {
    local n
    sink_start hostB "$HOSTB_IP4" 2
    udp_cmd hostA "$HOSTB_IP4" 10 ctl$$ 0.02
    "${UDP[@]}"
    sink_count n
    [ "$n" = 10 ] || { echo "$n of 10 arrived"; return 1; }
}
check "4 control: the same flow from hostA is delivered" control_inject

# ---- 6: a directed broadcast from the other site ---------------------------------------------
# The broadcast address of gwA's protected subnet (10.1.0.255 of 10.1.0.1/24) is gwA's own:
# the kernel's broadcast route (made with the address, `brd` or not) delivers what comes to it
# to the gateway and forwards none of it onto the subnet (directed broadcasts, RFC 2644;
# Linux's bc_forwarding is off). Sent through the peer's SA, from a host of site B that the
# fwd policy allows, it must be decrypted and yet not reach hostA, which would take it: a sink
# bound to the wildcard address gets a subnet's broadcasts.
GWA_BRD=$("$TOPO" exec gwA ip -4 route show table local type broadcast dev "$GWA_PROT_IF" |
    awk '{print $2; exit}')
directed_broadcast() {
    local n counter=gateway.drop-decrypted-broadcast sa='sas[spi=0x2001].packets'
    [ -n "$GWA_BRD" ] || { echo "no broadcast address on $GWA_PROT_IF"; return 1; }
    [ "$PROT_MODE" = tun ] && counter=$sa  # the kernel's input takes it from the TUN
    local opened=$(stat gwA "$sa") before=$(stat gwA "$counter")
    sink_start hostA 0.0.0.0 3
    "$TOPO" exec wire "$PY" "$ATTACKER" forge --iface "$WIRE_A_IF" --mac "$GWA_MAC" \
        --src "$GWB_PUB_IP4" --dst "$GWA_PUB_IP4" --spi 0x2001 --key "$KEY_BA" --seq 1000200 \
        --inner-src "$HOSTB_IP4" --inner-dst "$GWA_BRD" --marker brd$$ --count 10 >/dev/null
    sink_count n
    opened=$(($(stat gwA "$sa") - opened))
    DELTA=$(($(stat gwA "$counter") - before))
    ROW[6]="$counter +$DELTA (decrypted $opened), leaked -, delivered $n"
    echo "${ROW[6]}"
    [ "$n" = 0 ] && [ "$opened" = 10 ] && [ "$DELTA" = 10 ]
}
step "6 a directed broadcast out of the peer's SA is not broadcast on gwA's site" \
    directed_broadcast
# The control: the same through the same SA to hostA itself arrives.
brd_control() {
    forge_to_hostA "$HOSTB_IP4" 1000300 brdctl$$
    [ "$DELIVERED" = 10 ] || { echo "$DELIVERED of 10 arrived"; return 1; }
}
check "6 control: the same to hostA's own address is delivered" brd_control

# ---- 7: addresses the kernel takes from no link ---------------------------------------------
# gwA's in and fwd policies take anything from the peer (src 0.0.0.0/0 dst 0.0.0.0/0, as a
# full-tunnel gateway has them), and gwA has a default route to the wire. After xfrm, the
# kernel's input drops as martians what comes to or from a loopback address (127/8, ::1: a
# service bound there would answer the peer), from a multicast address or from one of the
# gateway's own; it forwards no multicast without a multicast router. Handed to the kernel
# through a raw socket, each would leave as a packet the gateway made itself: over lo to the
# service, onto a link in the clear.
GWA_RR=$(grep -o "dir fwd tmpl src $GWB_PUB_IP4 dst $GWA_PUB_IP4 proto esp reqid [0-9]*" \
    "$WORK/gwA.conf" | awk '{print $NF; exit}')
wide_policies() { # add|delete: add stops at the first refusal, delete tries each
    local any dir rc=0
    for any in 0.0.0.0/0 ::/0; do
        for dir in in fwd; do
            if [ "$1" = add ]; then
                cli gwA policy add src $any dst $any dir $dir priority 100 tmpl src "$GWB_PUB_IP4" \
                    dst "$GWA_PUB_IP4" proto esp reqid "$GWA_RR" mode tunnel || return 1
            else
                cli gwA policy delete src $any dst $any dir $dir || rc=1
            fi
        done
    done
    return $rc
}
MARTIAN_SEQ=1000400
forge_cmd() { # INNER_SRC INNER_DST MARKER [ARGS...]: sets FORGE, 10 through SA 0x2001
    FORGE=("$TOPO" exec wire "$PY" "$ATTACKER" forge --iface "$WIRE_A_IF" --mac "$GWA_MAC"
        --src "$GWB_PUB_IP4" --dst "$GWA_PUB_IP4" --spi 0x2001 --key "$KEY_BA"
        --seq $MARTIAN_SEQ --inner-src "$1" --inner-dst "$2" --marker "$3" --count 10 "${@:4}")
    MARTIAN_SEQ=$((MARTIAN_SEQ + 10))
}
# to_loopback ADDR SRC: 10 to a sink on gwA bound to ADDR; sets DELIVERED.
to_loopback() {
    sink_start gwA "$1" 3
    forge_cmd "$2" "$1" lo$$
    "${FORGE[@]}" >/dev/null
    sink_count DELIVERED
}
# seen_on NS IF INNER_SRC INNER_DST [ARGS...]: how many frames IF shows of the 10 forged; sets
# SEEN.
seen_on() {
    forge_cmd "$3" "$4" m$$ "${@:5}"
    SEEN=$("$PY" "$HERE/wire_capture.py" --netns "$1" --dev "$2" --filter "contains m$$" \
        -- "${FORGE[@]}" 2>>"$WORK/capture.err")
}
martians() {
    local rc=0
    if wide_policies add && "$TOPO" exec gwA ip route add default via "$GWB_PUB_IP4"; then
        martians_under_wide_policies || rc=1
    else
        echo "the wide policies or the default route were not taken"
        rc=1
    fi
    # Whatever happened, gwA goes back to its site policies for the rows after this one.
    "$TOPO" exec gwA ip route del default via "$GWB_PUB_IP4" 2>/dev/null
    wide_policies delete 2>/dev/null
    [ "$(cli gwA policy list | grep -c '0/0')" = 0 ] || { echo "wide policies left"; rc=1; }
    return $rc
}
martians_under_wide_policies() {
    local sa='sas[spi=0x2001].packets' counter=drops.in-martian
    local mc_counter=gateway.drop-decrypted-multicast ttl=()
    # tun mode: the kernel's input takes it from the TUN. With TTL 1, as a routing protocol
    # over the tunnel sends; in xdp mode with the default TTL, that would have gone on.
    [ "$PROT_MODE" = tun ] && mc_counter= ttl=(--ttl 1)
    local opened=$(stat gwA "$sa") before=$(stat gwA $counter) mc=0
    [ -n "$mc_counter" ] && mc=$(stat gwA $mc_counter)
    local delivered=0 leaked=0 src
    to_loopback 127.0.0.1 "$HOSTB_IP4"
    echo "to 127.0.0.1: delivered $DELIVERED"
    delivered=$((delivered + ${DELIVERED:-99}))
    to_loopback ::1 "$HOSTB_IP6"
    echo "to ::1: delivered $DELIVERED"
    delivered=$((delivered + ${DELIVERED:-99}))
    for src in 127.0.0.1 224.0.0.9 "$GWA_PROT_IP4"; do
        seen_on "$NS_HOSTA" "$HOSTA_IF" "$src" "$HOSTA_IP4"
        echo "from $src to hostA: on hostA's link $SEEN"
        leaked=$((leaked + ${SEEN:-99}))
    done
    [ "$PROT_MODE" = tun ] && sink_start gwA 239.1.2.3 5 xesp-tun
    seen_on "$NS_WIRE" "$WIRE_IF" "$HOSTB_IP4" 239.1.2.3 "${ttl[@]}"
    echo "to 239.1.2.3: on the wire $SEEN"
    leaked=$((leaked + ${SEEN:-99}))
    local members=-
    if [ "$PROT_MODE" = tun ]; then
        sink_count members
        echo "to 239.1.2.3: delivered to a member on the TUN $members"
    fi
    opened=$(($(stat gwA "$sa") - opened))
    DELTA=$(($(stat gwA $counter) - before))
    [ -n "$mc_counter" ] && mc=$(($(stat gwA $mc_counter) - mc))
    local group="$mc_counter +$mc" group_ok=$((mc == 10))
    [ -z "$mc_counter" ] && group="a group member on the TUN got $members" group_ok=$((members == 10))
    ROW[7]="$counter +$DELTA, $group (decrypted $opened), leaked $leaked, delivered $delivered"
    echo "${ROW[7]}"
    [ "$delivered" = 0 ] && [ "$leaked" = 0 ] && [ "$opened" = 60 ] && [ "$DELTA" = 50 ] &&
        [ "$group_ok" = 1 ]
}
step "7 martian addresses out of the peer's SA are dropped, neither delivered nor sent" martians
martian_control() {
    forge_to_hostA "$HOSTB_IP4" $MARTIAN_SEQ m7ctl$$
    [ "$DELIVERED" = 10 ] || { echo "$DELIVERED of 10 arrived"; return 1; }
}
check "7 control: what the site policies allow still arrives" martian_control

# ---- 8: a protected host sends as the gateway ------------------------------------------------
# hostA puts gwA's own LAN address (10.1.0.1) as the source of datagrams the out policy
# protects. The kernel's input drops such a packet as a martian (fib_validate_source()); it
# must not reach site B through the tunnel as if gwA had sent it.
GWA_PROT_MAC=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PROT_IF/address)
from_hostA() { # SRC MARKER: 10 datagrams to hostB from hostA's link; sets N (at hostB), ESP
    sink_start hostB "$HOSTB_IP4" 3
    FILTERS=("esp src $GWA_PUB_IP4 dst $GWB_PUB_IP4")
    wire_counts_into ESP "$TOPO" exec hostA "$PY" "$ATTACKER" inject --iface "$HOSTA_IF" \
        --mac "$GWA_PROT_MAC" --src "$1" --dst "$HOSTB_IP4" --marker "$2" --count 10
    sink_count N
}
spoofed_gateway() {
    from_hostA "$HOSTA_IP4" own$$  # control: hostA's own address, the same way
    [ "$N" = 10 ] && [ "$ESP" -ge 10 ] ||
        { echo "control: $N of 10 arrived, $ESP ESP frames"; return 1; }
    delta gwA xdp.drop-martian from_hostA "$GWA_PROT_IP4" spoof$$
    ROW[8]="xdp.drop-martian +$DELTA, leaked $ESP (as ESP), delivered $N (control: 10 of 10)"
    echo "${ROW[8]}"
    [ "$N" = 0 ] && [ "$ESP" = 0 ] && [ "$DELTA" = 10 ]
}
step "8 a protected host sending as the gateway is dropped, not encrypted" spoofed_gateway

# ---- 5: a clean stop fails closed ------------------------------------------------------------
# term_under_traffic: 2 s of UDP from hostA to hostB; gwA's daemon gets SIGTERM after 0.5 s
# and comes back from its state file after 1.2 s. Sets LEAKED.
term_under_traffic() {
    local marker=$1 got
    (sleep 0.5; stop_gw gwA TERM; sleep 0.7; start_gw gwA >/dev/null) &
    local stopper=$!
    FILTERS=("contains $marker" "icmp host $HOSTA_IP4 host $HOSTB_IP4")
    ping_cmd hostA "$HOSTB_IP4" -c 20 -i 0.1 -W 1
    "${PING[@]}" >/dev/null 2>&1 &
    local pinger=$!
    udp_cmd hostA "$HOSTB_IP4" 1000 "$marker" 0.002
    got=$(wire_counts "${UDP[@]}")
    wait $stopper $pinger
    LEAKED=$(($(echo "$got" | tr ' ' '+' | sed 's/+$//')))
}
# The stopper runs in a subshell: its start_gw's pid is not ours. Find the daemon by socket.
adopt_gwA() {
    local pid
    pid=$(pgrep -f -- "--socket $WORK/gwA.sock" | head -n 1)
    [ -n "$pid" ] && DPID[gwA]=$pid
}
sigterm() {
    term_under_traffic stop$$
    adopt_gwA || { echo "gwA did not come back"; return 1; }
    ROW[5]="leaked $LEAKED, delivered -"
    echo "${ROW[5]}"
    [ "$LEAKED" = 0 ]
}
step "5 SIGTERM and restart under traffic: zero plaintext on the wire" sigterm
check "5 the log says the classifier stayed" grep -q "left the classifier on $GWA_PROT_IF, $GWA_PUB_IF" "$WORK/gwA.log"
resume() {
    for _ in $(seq 20); do ping_from hostA "$HOSTB_IP4" -c 1 -W 1 >/dev/null 2>&1 && return 0; done
    return 1
}
check "5 after the restart the tunnel carries traffic again" resume

step "5 SIGTERM with no daemon to follow" stop_gw gwA TERM
check "5 stopped: the classifiers stay on gwA's interfaces" bash -c "
    $(declare -f prot_attached xdp_attached); TOPO='$TOPO' PROT_MODE=$PROT_MODE
    xdp_attached gwA $GWA_PUB_IF && prot_attached gwA $GWA_PROT_IF"
check "5 stopped: the tc egress guard stays" bash -c "'$TOPO' exec gwA tc filter show dev $GWA_PUB_IF egress | grep -q xesp_tc_egress"
# With no daemon to ask, the counter is read from the classifier's own map.
stopped_drops() {
    local before after counter=xsk-missing
    [ "$PROT_MODE" = tun ] && counter=drop-tun-gone
    before=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" "$GWA_PROT_IF" $counter) || return 1
    ! "$TOPO" exec hostA "$PY" "$HERE/ping.py" -c 3 -i 0.2 -W 1 "$HOSTB_IP4" || return 1
    after=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" "$GWA_PROT_IF" $counter) || return 1
    ROW[5]="xdp.$counter +$((after - before)) (stopped), ${ROW[5]}"
    echo "${ROW[5]}"
    [ $((after - before)) -ge 3 ]
}
step "5 stopped: protected traffic is dropped and counted, not forwarded" stopped_drops
# A daemon without the state file does not know the interfaces; `iface del` hands them back.
step "5 a daemon without state" start_gw gwA --no-state
check "5 iface del hands a leftover interface back to the kernel" bash -c "
    $(declare -f prot_attached xdp_attached); TOPO='$TOPO' PROT_MODE=$PROT_MODE
    XESP_SOCKET=$WORK/gwA.sock '$XESP' iface del $GWA_PROT_IF && ! prot_attached gwA $GWA_PROT_IF"
check "5 iface del of an interface with no classifier is an error" bash -c "
    ! XESP_SOCKET=$WORK/gwA.sock '$XESP' iface del $GWA_PROT_IF"
stop_gw gwA
# --detach-on-exit: the explicit way back to the kernel, and the log says so.
step "5 a daemon with --detach-on-exit" start_gw gwA --detach-on-exit
stop_gw gwA TERM
check "5 --detach-on-exit: the classifiers are gone from gwA's interfaces" bash -c "
    $(declare -f prot_attached xdp_attached); TOPO='$TOPO' PROT_MODE=$PROT_MODE
    ! xdp_attached gwA $GWA_PUB_IF && ! prot_attached gwA $GWA_PROT_IF"
check "5 --detach-on-exit: the log says which happened" grep -q "detached from .*--detach-on-exit" "$WORK/gwA.log"
stop_gw gwB

echo "attack table (gwA):"
for i in 1 2 3 4 5 6 7 8; do echo "  $i  ${ROW[$i]:-not run}"; done
finish
