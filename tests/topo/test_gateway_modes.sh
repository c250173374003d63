#!/bin/bash
# xesp daemon on both gateways of the standard topology, in the modes besides the tunnel of
# test_gateway.sh: transport mode (SAs between hostA and hostB, the gateways as bumps in the
# wire) and NAT-T (ESP in UDP/4500).
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB
#   10.1.0.2   xesp      192.0.2.x   xesp      10.2.0.2
#   fd01::2    daemon    2001:db8::x daemon    fd02::2
#                                    ^ capture on wire-a: every frame between the gateways
#
# Asserts: in transport mode, ESP between the hosts' addresses and no plaintext on the wire
# (IPv4, IPv6), TCP through it, and a router's "fragmentation needed" sent to hostA lowering
# gwA's path MTU for the SA; with NAT-T, only ESP in UDP/4500 on the wire, TCP through it, no
# DF datagrams too big for the tunnel split before encryption (no outer fragments), outer
# fragments from a peer reassembled and decrypted, and a reported path MTU used by the split.
#
# Usage: bash test_gateway_modes.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_gateway_modes.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-m$$-

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"

start=$SECONDS
check "topology up" "$TOPO" up

# ---- Transport mode and NAT-T ----------------------------------------------------------------

step "transport mode: daemons up" up_pair transport
FILTERS=("icmp host $HOSTA_IP4 host $HOSTB_IP4" "esp host $HOSTA_IP4 host $HOSTB_IP4")
ping_cmd hostA "$HOSTB_IP4" -c 5 -i 0.05
counts_are "transport mode IPv4: ESP between the hosts' addresses, no plaintext" "=0 >=10" "${PING[@]}"
FILTERS=("icmp6 host $HOSTA_IP6 host $HOSTB_IP6" "esp host $HOSTA_IP6 host $HOSTB_IP6")
ping_cmd hostA "$HOSTB_IP6" -c 5 -i 0.05
counts_are "transport mode IPv6: ESP between the hosts' addresses, no plaintext" "=0 >=10" "${PING[@]}"
check "transport mode: TCP hostA -> hostB (4 MiB)" tcp_python a2b 4
# In transport mode the SA's addresses are the hosts': a router's too-big report about gwA's
# ESP goes to hostA, which has no such SA. gwA's XDP program hands it to the daemon on the
# way, which learns the path MTU and keeps the report; hostA then learns the smaller tunnel
# MTU from gwA. A report about ESP that is not gwA's goes on to hostA through the kernel.
report_to_hostA() { # SPI SEQ MTU
    local mac
    mac=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PUB_IF/address)
    "$TOPO" exec wire "$PY" "$HERE/icmp_report.py" --iface "$WIRE_A_IF" --mac "$mac" \
        --router 192.0.2.254 --src "$HOSTA_IP4" --dst "$HOSTB_IP4" --spi "$1" --seq "$2" \
        --mtu "$3" 2>/dev/null
}
transport_pmtu() {
    local mtu oseq kept ignored via_kernel got
    ping_from hostA "$HOSTB_IP4" -c 2 -i 0.1 >/dev/null || return 1
    mtu=$(stat gwA 'sas[spi=0x1001].tunnel_mtu')
    kept=$(stat gwA 'gateway.pmtu-reports-kept')
    ignored=$(stat gwA 'gateway.pmtu-ignored')
    via_kernel=$(stat gwA 'gateway.tx-via-kernel')
    report_to_hostA 0x9999 1 1200 || return 1                           # not gwA's ESP
    oseq=$(stat gwA 'sas[spi=0x1001].oseq')
    report_to_hostA 0x1001 "$oseq" 1300 || return 1
    sleep 0.5
    echo "path MTU $(stat gwA 'sas[spi=0x1001].path_mtu'), tunnel MTU" \
        "$(stat gwA 'sas[spi=0x1001].tunnel_mtu') (was $mtu); reports kept" \
        "$kept -> $(stat gwA 'gateway.pmtu-reports-kept'), ignored $ignored ->" \
        "$(stat gwA 'gateway.pmtu-ignored'), via kernel $via_kernel ->" \
        "$(stat gwA 'gateway.tx-via-kernel')"
    [ "$(stat gwA 'sas[spi=0x1001].path_mtu')" = 1300 ] &&
        [ "$(stat gwA 'sas[spi=0x1001].tunnel_mtu')" = $((mtu - 200)) ] &&
        [ "$(stat gwA 'gateway.pmtu-reports-kept')" = $((kept + 1)) ] &&
        [ "$(stat gwA 'gateway.pmtu-ignored')" = $((ignored + 1)) ] &&
        [ "$(stat gwA 'gateway.tx-via-kernel')" -gt "$via_kernel" ] || return 1
    "$TOPO" exec hostA ip route flush cache
    got=$(pmtu_learnt 2>&1)
    echo "hostA's path MTU to hostB: $got"
    [ "$got" = $((mtu - 200)) ]
}
check "transport mode: a router's report to hostA lowers gwA's path MTU; hostA learns it" \
    transport_pmtu
down_pair

step "NAT-T: daemons up" up_pair natt
FILTERS=("icmp host $HOSTA_IP4 host $HOSTB_IP4" "udp port 4500" "esp")
ping_cmd hostA "$HOSTB_IP4" -c 5 -i 0.05
counts_are "NAT-T: ESP in UDP/4500 on the wire, no plaintext" "=0 >=10 >=10" "${PING[@]}"
check "NAT-T: TCP hostB -> hostA over IPv6 (4 MiB)" tcp_python b2a 6
# Too big without DF: split before encryption, since the far gateway could not reassemble
# fragments of ESP in UDP. No IP fragment crosses the wire, and hostB gets every datagram.
# split_before_encryption FILL [BYTES]: 20 datagrams without DF from hostA (nodf_send); each
# must be split by gwA before encryption, no IP fragment may cross the wire, hostB gets all.
split_before_encryption() {
    local before after got wire
    before=$(stat gwA 'gateway.fragmented-before-encryption')
    "$TOPO" exec hostA ip route flush cache
    sink_start hostB "$HOSTB_IP4" 3 || return 1
    FILTERS=("frag" "esp")
    wire=$(wire_counts "$TOPO" exec hostA "$PY" -c "$(nodf_send "$@")")
    sink_count got
    after=$(stat gwA 'gateway.fragmented-before-encryption')
    echo "hostB got $got of 20; on the wire: $wire(IP fragments, ESP); split $((after - before))"
    [ "$got" = 20 ] && [ "${wire%% *}" = 0 ] && [ $((after - before)) = 20 ]
}
check "NAT-T, too big, no DF: split before encryption, no outer fragments, all delivered" \
    split_before_encryption n
# The same under a protect policy with a port and a bypass without ports: each piece takes its
# datagram's verdict, looked up with its ports, not dropped as one that no port can judge. TCP
# from a raw socket, without DF (hostA's own TCP would set DF): in tun mode the gateway reads
# it from the TUN, where UDP would take the local link and the classifier's verdict; in xdp
# mode the classifier hands it over.
split_ports() {
    local out="src $SITE_A4 dst $SITE_B4" rc=0 before after got wire sink
    local tmpl="tmpl src $GWA_PUB_IP4 dst $GWB_PUB_IP4 proto esp reqid 1 mode tunnel"
    cli gwA policy update $out dir out priority 100 $tmpl &&
        cli gwA policy add $out proto tcp dport 5300 dir out priority 1 $tmpl &&
        cli gwA policy add $out proto tcp dir out priority 2 action allow || rc=1
    before=$(stat gwA 'gateway.fragmented-before-encryption')
    "$TOPO" exec hostA ip route flush cache
    rm -f "$WORK/split.ready"
    "$TOPO" exec hostB "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
s.settimeout(0.2)
open('$WORK/split.ready', 'w').close()
seen, end = set(), time.time() + 4
while time.time() < end:
    try:
        d = s.recv(4000)
    except socket.timeout:
        continue
    h = (d[0] & 15) * 4
    if len(d) == 1460 and d[h + 2:h + 4] == b'\\x14\\xb4' and d[h + 20:h + 30] == b'xesp-split':
        seen.add(d[h + 30:h + 34])
print(len(seen))" >"$WORK/split.count" &
    sink=$!
    for _ in $(seq 50); do [ -e "$WORK/split.ready" ] && break; sleep 0.1; done
    FILTERS=("frag" "esp" "contains xesp-split")
    wire=$(wire_counts "$TOPO" exec hostA "$PY" -c "
import socket, struct, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
s.setsockopt(socket.IPPROTO_IP, 10, 0)          # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: no DF
for i in range(20):
    data = b'xesp-split%04d' % i + b'p' * (1440 - 20 - 14)
    s.sendto(struct.pack('!HHIIBBHHH', 40000, 5300, i, 0, 0x50, 0x18, 65535, 0, 0) + data,
             ('$HOSTB_IP4', 0))
    time.sleep(0.01)") || rc=1
    wait $sink
    got=$(cat "$WORK/split.count")
    after=$(stat gwA 'gateway.fragmented-before-encryption')
    echo "hostB got $got of 20; on the wire: $wire(IP fragments, ESP, plaintext);" \
        "split $((after - before))"
    cli gwA policy del $out proto tcp dport 5300 dir out
    cli gwA policy del $out proto tcp dir out
    cli gwA policy update $out dir out $tmpl || rc=1
    wire=($wire)
    [ "$rc" = 0 ] && [ "$got" = 20 ] && [ "${wire[0]}" = 0 ] && [ "${wire[1]}" -ge 40 ] &&
        [ "${wire[2]}" = 0 ] && [ $((after - before)) = 20 ]
}
check "NAT-T, too big, no DF, a policy with ports: every piece encrypted, all delivered" \
    split_ports
# A peer that fragments the outer packet instead (the Linux kernel does): scapy encrypts with
# gwA's SA and sends the fragments to gwB, whose kernel reassembles them; the gateway takes
# the datagram from its raw UDP socket, decrypts it and hostB gets it.
natt_reassembled() {
    local key mac before after got
    key=$(grep 'spi 0x1001 ' "$WORK/gwA.conf" | grep -o '0x[0-9a-f]\{40\}')
    mac=$("$TOPO" exec gwB cat /sys/class/net/$GWB_PUB_IF/address)
    before=$(stat gwB 'gateway.rx-reassembled')
    sink_start hostB "$HOSTB_IP4" 3 || return 1
    "$TOPO" exec wire "$PY" -c "
from scapy.all import Ether, IP, UDP, Raw, fragment, sendp
from scapy.layers.ipsec import SecurityAssociation, ESP
sa = SecurityAssociation(ESP, spi=0x1001, crypt_algo='AES-GCM', crypt_key=bytes.fromhex('${key#0x}'),
                         tunnel_header=IP(src='$GWA_PUB_IP4', dst='$GWB_PUB_IP4'),
                         nat_t_header=UDP(sport=4500, dport=4500))
for i in range(5):
    inner = IP(src='$HOSTA_IP4', dst='$HOSTB_IP4', ttl=64) / UDP(sport=4242, dport=5300) / Raw(b'r' * 1400)
    outer = sa.encrypt(inner, seq_num=1000000 + i)
    outer[UDP].len = None           # scapy leaves the NAT-T UDP length at 8
    outer[UDP].chksum = 0
    outer = IP(bytes(outer))
    sendp([Ether(dst='$mac') / f for f in fragment(outer, fragsize=800)], iface='$WIRE_B_IF', verbose=False)
" || return 1
    sink_count got
    after=$(stat gwB 'gateway.rx-reassembled')
    echo "hostB got $got of 5; gwB rx-reassembled $before -> $after"
    [ "$got" = 5 ] && [ $((after - before)) = 5 ]
}
check "NAT-T: outer fragments from a peer are reassembled by the kernel and decrypted" natt_reassembled
# A router reports a smaller path MTU for the NAT-T SA (quoting ESP in UDP; a report quoting
# plain ESP for it is ignored). Datagrams without DF that fit the link but not the path are
# then split before encryption too.
natt_pmtu() {
    local oseq
    oseq=$(stat gwA 'sas[spi=0x1001].oseq')
    report_to_gwA 0x1001 "$oseq" 1300 || return 1                   # plain ESP: not this SA's
    sleep 0.3
    [ "$(stat gwA 'sas[spi=0x1001].path_mtu')" = 0 ] || { echo "a plain ESP report was believed"; return 1; }
    report_to_gwA 0x1001 "$oseq" 1300 --natt || return 1
    sleep 0.3
    [ "$(stat gwA 'sas[spi=0x1001].path_mtu')" = 1300 ] || { echo "path MTU not learnt"; return 1; }
    split_before_encryption p 1300
}
check "NAT-T: a reported path MTU applies to the split before encryption" natt_pmtu
down_pair

finish
