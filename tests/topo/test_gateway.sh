#!/bin/bash
# xesp daemon on both gateways of the standard topology: real traffic through the tunnel.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB
#   10.1.0.2   xesp      192.0.2.x   xesp      10.2.0.2
#   fd01::2    daemon    2001:db8::x daemon    fd02::2
#              gwa-prot (protected)  gwa-pub / gwb-pub (public)  gwb-prot (protected)
#                                    ^ capture on wire-a: every frame between the gateways
#
# Asserts, in tunnel mode (IPv4 in IPv4, IPv6 in IPv6, AES-128-GCM, config from
# `xesp-topo config`): ping, TCP and UDP between the hosts over IPv4 and IPv6; the wire carries
# ESP and no plaintext of the hosts' flows; tshark decrypts the wire's ESP with the configured
# keys and finds the pings inside; per-SA and per-reason counters move (`xesp stats -j`);
# forged ESP and a wrong key are dropped and counted (in-icv-fail); a DF packet too big for
# the tunnel gets "fragmentation needed" with the SA's tunnel MTU, also once a router on the
# wire has reported a smaller path MTU for the SA; SAs and policies added and
# removed under traffic lose no packet of the running flow; kill -9 of a daemon under traffic
# lets no plaintext onto the wire, and the restarted daemon resumes the flow from its state
# file (sequence numbers above what the peer has seen); SIGTERM leaves XDP attached (the
# attacks, a clean stop among them, are in test_attacks.sh). Transport mode
# and NAT-T are in test_gateway_modes.sh.
#
# Usage: bash test_gateway.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_gateway.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-g$$-

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"

# ---- Tunnel mode -----------------------------------------------------------------------------

start=$SECONDS
check "topology up" "$TOPO" up
step "daemons up with the tunnel config, interfaces added" up_pair
if [ "$failed" != 0 ]; then
    for gw in gwA gwB; do echo "--- $gw log"; tail -n 20 "$WORK/$gw.log"; done
    exit 1
fi
check "iface list shows both interfaces" bash -c "[ \$(XESP_SOCKET=$WORK/gwA.sock '$XESP' iface list | wc -l) = 2 ]"
check "XDP attached to both public interfaces" bash -c "
    '$TOPO' exec gwA ip -d link show dev $GWA_PUB_IF | grep -q prog/xdp &&
    '$TOPO' exec gwB ip -d link show dev $GWB_PUB_IF | grep -q prog/xdp"
check "the $PROT_MODE-mode program on both protected interfaces" bash -c "
    $(declare -f prot_attached xdp_attached); TOPO='$TOPO' PROT_MODE=$PROT_MODE
    prot_attached gwA $GWA_PROT_IF && prot_attached gwB $GWB_PROT_IF"
check "iface list shows the protected interface's mode" bash -c "XESP_SOCKET=$WORK/gwA.sock '$XESP' iface list | grep -q '^$GWA_PROT_IF role protected mode $PROT_MODE '"
check "iface add with an unknown mode: one line naming it, nothing added" bash -c "
    out=\$(XESP_SOCKET=$WORK/gwA.sock '$XESP' iface add lo role protected mode fast 2>&1)
    [ \$? != 0 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && echo \"\$out\" | grep -q \"mode 'fast'\" &&
    [ \$(XESP_SOCKET=$WORK/gwA.sock '$XESP' iface list | wc -l) = 2 ]"
check "iface add of the gateway's own TUN device is refused" bash -c "
    ! XESP_SOCKET=$WORK/gwA.sock '$XESP' iface add xesp-tun role protected mode tun 2>/dev/null"
if [ "$PROT_MODE" = tun ]; then
    # The TUN device has no addresses: what the kernel sends into it of its own is the report
    # of its IPv6 groups when it comes up, link-scope multicast, which is not carried.
    sleep 2
    check "tun mode: nothing from an idle TUN device is carried (only link-scope multicast read)" \
        test "$(stat gwA 'gateway.tun-pieces')" = "$(stat gwA 'gateway.drop-tun-link-scope')"
    check "tun mode: no XDP program on the protected interfaces (the hosts keep GSO)" bash -c "
        ! '$TOPO' exec gwA ip -d link show dev $GWA_PROT_IF | grep -q prog/xdp &&
        ! '$TOPO' exec gwB ip -d link show dev $GWB_PROT_IF | grep -q prog/xdp"
fi

check "hostA pings hostB over IPv4 through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "hostA pings hostB over IPv6 through the tunnel" ping_from hostA "$HOSTB_IP6" -c 3

FILTERS=("icmp host $HOSTA_IP4 host $HOSTB_IP4" "esp spi 0x1001" "esp spi 0x2001")
ping_cmd hostA "$HOSTB_IP4" -c 5 -i 0.05
counts_are "IPv4 pings cross the wire as ESP only" "=0 >=5 >=5" "${PING[@]}"
FILTERS=("icmp6 host $HOSTA_IP6 host $HOSTB_IP6" "esp spi 0x1002" "esp spi 0x2002")
ping_cmd hostB "$HOSTA_IP6" -c 5 -i 0.05
counts_are "IPv6 pings cross the wire as ESP only" "=0 >=5 >=5" "${PING[@]}"

check "TCP hostA -> hostB, IPv4 (4 MiB, SHA-256)" tcp_python a2b 4
check "TCP hostB -> hostA, IPv6 (4 MiB, SHA-256)" tcp_python b2a 6
# IPv6 with a destination options header: in tun mode the kernel hands it over as
# super-packets, which are cut with the header kept in every piece.
tcp_dstopts() {
    local before after
    before=$(stat gwA 'gateway.drop-tun-bad')
    tcp_python a2b 6 dstopts || return 1
    after=$(stat gwA 'gateway.drop-tun-bad')
    echo "drop-tun-bad $before -> $after"
    [ "$after" = "$before" ]
}
check "TCP hostA -> hostB, IPv6 with a destination options header (4 MiB, SHA-256)" tcp_dstopts

marker=xesp-secret-marker-$$
for fam in 4 6; do
    dst=$HOSTB_IP4 && [ $fam = 6 ] && dst=$HOSTB_IP6
    sink_start hostB "$dst" 3
    FILTERS=("contains $marker" "esp")
    udp_cmd hostA "$dst" 200 "$marker"
    counts_are "UDP over IPv$fam: the wire carries ESP, never the payload" "=0 >=200" "${UDP[@]}"
    sink_count got
    check "UDP over IPv$fam: hostB receives the datagrams ($got of 200)" test "${got:-0}" -ge 190
done

# tshark decrypts the wire with the configured keys and finds the pings.
tshark_decrypts() {
    local pcap=$WORK/wire.pcap key_ab key_ba
    key_ab=$(awk '/spi 0x1001/ {print $(NF-1)}' "$WORK/gwA.conf")
    key_ba=$(awk '/spi 0x2001/ {print $(NF-1)}' "$WORK/gwA.conf")
    "$TOPO" exec wire dumpcap -q -i "$WIRE_IF" -w "$pcap" -f esp >/dev/null 2>&1 &
    local cap=$!
    sleep 1
    ping_from hostA "$HOSTB_IP4" -c 3 -i 0.1 >/dev/null || { kill $cap; return 1; }
    sleep 0.3
    kill -INT $cap
    wait $cap
    local gcm="AES-GCM with 16 octet ICV [RFC4106]"
    local out
    out=$(tshark -n -r "$pcap" -o esp.enable_encryption_decode:TRUE \
        -o esp.enable_authentication_check:TRUE \
        -o "uat:esp_sa:\"IPv4\",\"$GWA_PUB_IP4\",\"$GWB_PUB_IP4\",\"0x00001001\",\"$gcm\",\"$key_ab\",\"NULL\",\"\"" \
        -o "uat:esp_sa:\"IPv4\",\"$GWB_PUB_IP4\",\"$GWA_PUB_IP4\",\"0x00002001\",\"$gcm\",\"$key_ba\",\"NULL\",\"\"" \
        -T fields -e esp.icv_good -e icmp.type -e ip.src -Y icmp 2>&1)
    echo "$out"
    [ "$(echo "$out" | grep -c "^1	8	.*$HOSTA_IP4")" -ge 3 ] &&
        [ "$(echo "$out" | grep -c "^1	0	.*$HOSTB_IP4")" -ge 3 ]
}
if command -v tshark >/dev/null && command -v dumpcap >/dev/null; then
    check "tshark decrypts the wire's ESP (ICV good) and finds the echo requests and replies" tshark_decrypts
else
    echo "skip tshark decryption: tshark/dumpcap not installed"
fi

check "stats: SA 0x1001 on gwA counted packets" test "$(stat gwA 'sas[spi=0x1001].packets')" -gt 0
if [ "$PROT_MODE" = tun ]; then
    check "stats: the tc program sent plaintext to gwA's TUN" test "$(stat gwA 'xdp.tun-encap')" -gt 0
    check "stats: the tc program sent UDP to gwA's local link" test "$(stat gwA 'xdp.tun-udp-link')" -gt 0
    check "stats: gwA read it from the TUN and cut it" test "$(stat gwA 'gateway.tun-pieces')" -gt 0
    check "stats: gwB wrote what it decrypted to its TUN" test "$(stat gwB 'gateway.tun-tx')" -gt 0
    # The TCP transfers above: each gateway joined the segments it decrypted (GRO), IPv4 on
    # gwB, IPv6 on gwA.
    check "stats: gwB joined decrypted TCP segments in its TUN writes" \
        test "$(stat gwB 'gateway.tun-joined')" -gt 0
    check "stats: gwA joined decrypted TCP segments in its TUN writes" \
        test "$(stat gwA 'gateway.tun-joined')" -gt 0
    check "stats: nothing read from a TUN was bad" test "$(stat gwA 'gateway.drop-tun-bad')" = 0
else
    check "stats: XDP redirected to encrypt on gwA" test "$(stat gwA 'xdp.redirect-encap')" -gt 0
fi
check "stats: XDP redirected to decrypt on gwB" test "$(stat gwB 'xdp.redirect-decap')" -gt 0
# With workers (XESP_DAEMON_ARGS="--workers N"), the data thread hands bursts to the others.
if [[ "${XESP_DAEMON_ARGS:-}" =~ --workers\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -gt 1 ]; then
    n=${BASH_REMATCH[1]}
    check "stats: gwA has $n workers" test "$(stat gwA 'workers' | tr -cd '{' | wc -c)" -eq "$n"
    check "stats: gwA's worker 1 encrypted bursts" test "$(stat gwA 'workers.1.packets')" -gt 0
    check "stats: gwB's worker 1 decrypted bursts" test "$(stat gwB 'workers.1.packets')" -gt 0
    check "stats text shows the workers' load" bash -c "XESP_SOCKET=$WORK/gwA.sock '$XESP' stats | grep -q 'worker 1.*ESP load'"
elif [[ "${XESP_DAEMON_ARGS:-}" =~ --workers\ 1( |$) ]] ||
    { [[ ! "${XESP_DAEMON_ARGS:-}" =~ --workers ]] && [ "$(nproc)" -lt 4 ]; }; then
    # One worker (asked for, or the default under 4 CPUs), the data thread: it did all the ESP
    # work, and says so.
    check "stats: gwA has 1 worker" test "$(stat gwA 'workers' | tr -cd '{' | wc -c)" -eq 1
    check "stats: gwA's data thread counts the packets it encrypted" test "$(stat gwA 'workers.0.packets')" -gt 0
    check "stats: gwB's data thread counts the packets it decrypted" test "$(stat gwB 'workers.0.packets')" -gt 0
    check "stats: gwA's data thread counts its time on them" test "$(stat gwA 'workers.0.busy_ns')" -gt 0
fi
tunnel_mtu=$(stat gwA 'sas[spi=0x1001].tunnel_mtu')
check "stats: tunnel MTU per SA ($tunnel_mtu for a 1500-byte link)" test "$tunnel_mtu" -gt 1400 -a "$tunnel_mtu" -lt 1500
check "stats text names the SAs" bash -c "XESP_SOCKET=$WORK/gwA.sock '$XESP' stats | grep -q 'esp spi 0x00001001'"

# A DF packet that no longer fits once encrypted: hostA learns the tunnel MTU from gwA.
got=$(pmtu_learnt 2>&1)
check "DF too big: ICMP frag-needed gives hostA the tunnel MTU ($got)" test "$got" = "$tunnel_mtu"
# Each is answered, however many come at once: as the kernel, gwA does not hold path MTU
# discovery to the ICMP rate limit (50 at once, then 1 a millisecond). PMTUDISC_PROBE (3) sets
# DF whatever hostA learnt.
too_big_burst() {
    local got
    got=$(icmp_answers "
s.setsockopt(socket.IPPROTO_IP, 10, 3)          # IP_MTU_DISCOVER = IP_PMTUDISC_PROBE
for i in range(200):
    s.sendto(b'%04d' % i + b'b' * 1456, ('$HOSTB_IP4', 5300))") || return 1
    got=$(echo "$got" | tr ' ' '\n' | grep -c '^3/4$')
    echo "hostA got $got 'fragmentation needed' for 200 datagrams"
    [ "$got" = 200 ]
}
check "DF too big, 200 at once: every one answered, not rate limited" too_big_burst

# Without DF the packet goes on: gwA fragments the outer packet, gwB's kernel reassembles it
# and gwB decrypts it.
fragmented() {
    local f_before r_before f_after r_after got
    f_before=$(stat gwA 'gateway.fragmented')
    r_before=$(stat gwB 'gateway.rx-reassembled')
    # hostA would fragment to the path MTU it learnt above: forget it.
    "$TOPO" exec hostA ip route flush cache
    sink_start hostB "$HOSTB_IP4" 3 || return 1
    "$TOPO" exec hostA "$PY" -c "$(nodf_send y)" || return 1
    sink_count got
    f_after=$(stat gwA 'gateway.fragmented')
    r_after=$(stat gwB 'gateway.rx-reassembled')
    echo "hostB got $got of 20; gwA fragmented $((f_after - f_before)), gwB reassembled $((r_after - r_before))"
    [ "$got" = 20 ] && [ $((f_after - f_before)) -ge 20 ] && [ $((r_after - r_before)) -ge 20 ]
}
check "no DF, too big: the outer packet is fragmented, reassembled and decrypted" fragmented

# Tun mode, jumbo frames: hostA's link to gwA takes 9000 bytes, more than a frame holds. A DF
# datagram of 5000 bytes is answered with "fragmentation needed" carrying the tunnel MTU; one
# without DF is fragmented into frames, each encrypted, and all arrive.
if [ "$PROT_MODE" = tun ]; then
    link_mtu() {
        "$TOPO" exec hostA ip link set "$HOSTA_IF" mtu "$1" &&
            "$TOPO" exec gwA ip link set "$GWA_PROT_IF" mtu "$1"
    }
    jumbo_df() {
        local got before
        before=$(stat gwA 'gateway.drop-tun-too-big')
        "$TOPO" exec hostA ip route flush cache
        got=$(pmtu_learnt 5000) || return 1
        echo "hostA learnt $got (tunnel MTU $tunnel_mtu); drop-tun-too-big" \
            "+$(($(stat gwA 'gateway.drop-tun-too-big') - before))"
        [ "$got" = "$tunnel_mtu" ] && [ "$(stat gwA 'gateway.drop-tun-too-big')" -gt "$before" ]
    }
    # ... unless its TTL ends at gwA: the hop comes first, as in the kernel's forwarding. One
    # time exceeded comes back, DF or not, and nothing is cut. PMTUDISC: 3 (probe) sets DF
    # whatever the path MTU, 0 (dont) leaves it clear.
    jumbo_ttl() {
        local got before after
        before=$(stat gwA 'gateway.tun-fragmented')
        "$TOPO" exec hostA ip route flush cache
        got=$(icmp_answers "
s.setsockopt(socket.IPPROTO_IP, 10, $1)         # IP_MTU_DISCOVER
s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 1)
s.sendto(b'x' * 5000, ('$HOSTB_IP4', 5300))") || return 1
        after=$(stat gwA 'gateway.tun-fragmented')
        echo "hostA got ICMP type/code: ${got:-none}; tun-fragmented +$((after - before))"
        [ "$got" = "11/0" ] && [ "$after" = "$before" ]
    }
    jumbo_nodf() {
        local got before
        before=$(stat gwA 'gateway.tun-fragmented')
        "$TOPO" exec hostA ip route flush cache
        sink_start hostB "$HOSTB_IP4" 3 || return 1
        "$TOPO" exec hostA "$PY" -c "$(nodf_send j 5000)" || return 1
        sink_count got
        echo "hostB got $got of 20; tun-fragmented +$(($(stat gwA 'gateway.tun-fragmented') - before))"
        [ "$got" = 20 ] && [ $(($(stat gwA 'gateway.tun-fragmented') - before)) -ge 20 ]
    }
    # Under a policy with ports, and only a bypass without them, every fragment cut here takes
    # its datagram's verdict: looked up with its ports, not dropped as one no port can judge.
    jumbo_ports() {
        local out="src 10.1.0.0/16 dst 10.2.0.0/16" rc=0
        local tmpl="tmpl src $GWA_PUB_IP4 dst $GWB_PUB_IP4 proto esp reqid 1 mode tunnel"
        cli gwA policy update $out dir out priority 100 $tmpl &&
            cli gwA policy add $out proto udp dport 5300 dir out priority 1 $tmpl &&
            cli gwA policy add $out proto udp dir out priority 2 action allow || rc=1
        [ "$rc" = 0 ] && jumbo_nodf || rc=1
        cli gwA policy del $out proto udp dport 5300 dir out
        cli gwA policy del $out proto udp dir out
        cli gwA policy update $out dir out $tmpl || rc=1
        return $rc
    }
    step "tun mode: a 9000-byte MTU on hostA's link" link_mtu 9000
    check "tun mode, jumbo, DF: 'fragmentation needed' gives hostA the tunnel MTU" jumbo_df
    check "tun mode, jumbo, DF, TTL 1: time exceeded, not 'fragmentation needed'" jumbo_ttl 3
    check "tun mode, jumbo, no DF, TTL 1: one time exceeded, nothing cut" jumbo_ttl 0
    check "tun mode, jumbo, no DF: fragmented into frames, encrypted, all delivered" jumbo_nodf
    check "tun mode, jumbo, no DF, a policy with ports: every fragment encrypted" jumbo_ports
    step "tun mode: hostA's link back to 1500 bytes" link_mtu 1500
    "$TOPO" exec hostA ip route flush cache
    # TCP without DF: hostA's super-packets are cut into the segments it planned, not finer
    # (finer pieces would take the ids of its next packets), and gwA fragments what does not
    # fit the tunnel once encrypted.
    tcp_nodf() {
        local before after
        before=$(stat gwA 'gateway.fragmented')
        tcp_python a2b 4 nodf || return 1
        after=$(stat gwA 'gateway.fragmented')
        echo "gwA fragmented $((after - before)) packets"
        [ $((after - before)) -ge 1000 ]
    }
    check "tun mode: TCP without DF, hostA's segments kept and fragmented (4 MiB, SHA-256)" \
        tcp_nodf
fi

# Each gateway is a hop: hostB sees TTL 64 - 2; TTL 1 goes no further than gwA, counted.
ttl_hops() {
    local before after got
    before=$(stat gwA 'gateway.drop-ttl-exceeded')
    "$TOPO" exec hostB "$PY" -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 12, 1)        # IP_RECVTTL
s.bind(('$HOSTB_IP4', 5301)); s.settimeout(3)
while True:
    data, anc, _, _ = s.recvmsg(2048, 64)
    print(data.decode(), anc[0][2][0])
    if data == b'last':
        break" >"$WORK/ttl.out" 2>&1 &
    local sink=$!
    sleep 0.3
    "$TOPO" exec hostA "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for ttl, what in ((1, b'ttl1'), (64, b'last')):
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
    s.sendto(what, ('$HOSTB_IP4', 5301))
    time.sleep(0.2)"
    wait $sink
    after=$(stat gwA 'gateway.drop-ttl-exceeded')
    got=$(tr '\n' ' ' <"$WORK/ttl.out")
    echo "hostB got: $got; drop-ttl-exceeded $before -> $after"
    [ "$got" = "last 62 " ] && [ $((after - before)) = 1 ]
}
check "each gateway decrements the TTL; TTL 1 is dropped and counted" ttl_hops

# traceroute's view: hostA's own kernel reports the ICMP time exceeded it got for a UDP probe
# (IP_RECVERR / IPV6_RECVERR: it found the quoted probe's socket and checked the checksum).
# TTL 1 ends at gwA, which answers from its protected address; TTL 2 ends at gwB, whose answer
# comes back through the tunnel.
time_exceeded() {
    local before_a before_b after_a after_b got want
    before_a=$(stat gwA 'gateway.icmp-time-exceeded')
    before_b=$(stat gwB 'gateway.icmp-time-exceeded')
    got=$("$TOPO" exec hostA "$PY" -c "
import socket, struct, time
def probe(dst, ttl):
    v6 = ':' in dst
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    if v6:
        s.setsockopt(socket.IPPROTO_IPV6, 25, 1)                    # IPV6_RECVERR
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, ttl)
    else:
        s.setsockopt(socket.IPPROTO_IP, 11, 1)                      # IP_RECVERR
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
    s.connect((dst, 33434))
    s.send(b'probe')
    for _ in range(30):
        try:
            _, anc, _, _ = s.recvmsg(512, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            time.sleep(0.1)
            continue
        for level, kind, data in anc:
            errno, origin, typ, code = struct.unpack_from('=IBBB', data)
            fam = socket.AF_INET6 if v6 else socket.AF_INET
            who = socket.inet_ntop(fam, data[16 + 8:16 + 24] if v6 else data[16 + 4:16 + 8])
            return '%d/%d/%d/%s' % (origin, typ, code, who)
    return 'none'
print(probe('$HOSTB_IP4', 1), probe('$HOSTB_IP4', 2), probe('$HOSTB_IP6', 1), probe('$HOSTB_IP6', 2))
" 2>&1)
    after_a=$(stat gwA 'gateway.icmp-time-exceeded')
    after_b=$(stat gwB 'gateway.icmp-time-exceeded')
    # origin 2 = ICMP, type 11 code 0; origin 3 = ICMPv6, type 3 code 0
    want="2/11/0/$GWA_PROT_IP4 2/11/0/$GWB_PROT_IP4 3/3/0/$GWA_PROT_IP6 3/3/0/$GWB_PROT_IP6"
    echo "hostA learnt: $got (want $want); icmp-time-exceeded gwA $before_a -> $after_a, gwB $before_b -> $after_b"
    [ "$got" = "$want" ] && [ $((after_a - before_a)) = 2 ] && [ $((after_b - before_b)) = 2 ]
}
check "TTL runs out: ICMP time exceeded from gwA, and from gwB back through the tunnel" time_exceeded

# The gateway's own traffic for a protected flow (a process on gwA with a source in the
# protected site): the tc egress guard sends it over the local link to the daemon, which
# encrypts it. hostB gets it; none of it crosses the wire in the clear.
own_sent() { # MARKER: the script for five datagrams from gwA's inside address to hostB
    echo "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$GWA_PROT_IP4', 0))
for i in range(5):
    s.sendto(b'own-$1', ('$HOSTB_IP4', 5300))
    time.sleep(0.02)"
}
own_encrypted() {
    local before after got n
    before=$(stat gwA 'xdp.egress-local')
    sink_start hostB "$HOSTB_IP4" 2 || return 1
    FILTERS=("contains own-$marker")
    got=$(wire_counts "$TOPO" exec gwA "$PY" -c "$(own_sent "$marker")")
    sink_count n
    after=$(stat gwA 'xdp.egress-local')
    echo "hostB got $n of 5; plaintext on the wire: $got; egress-local $before -> $after"
    [ "$n" = 5 ] && [ "$got" = "0 " ] && [ $((after - before)) -ge 5 ]
}
check "the gateway's own traffic for a protected flow is encrypted (local link), none in the clear" own_encrypted
own_tcp() {
    "$TOPO" exec hostB "$PY" -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$HOSTB_IP4', 5401)); s.listen(1); s.settimeout(10)
c, _ = s.accept(); n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
print(n)" >"$WORK/own_tcp.count" 2>&1 &
    local srv=$!
    wait_listen hostB 5401 || return 1
    "$TOPO" exec gwA "$PY" -c "
import socket
s = socket.create_connection(('$HOSTB_IP4', 5401), timeout=10, source_address=('$GWA_PROT_IP4', 0))
s.sendall(b'o' * (2 << 20)); s.close()" || return 1
    wait $srv
    echo "hostB got $(cat "$WORK/own_tcp.count") bytes of $((2 << 20))"
    [ "$(cat "$WORK/own_tcp.count")" = $((2 << 20)) ]
}
check "TCP from the gateway itself to hostB through the tunnel (2 MiB, path MTU learnt)" own_tcp

# IKE leaves in the clear past an out policy only from a socket with a bypass policy of its
# own (IP_XFRM_POLICY, as IKE daemons set it), as the kernel lets it. Any other process's UDP
# to port 500 meets the out policies: here a block of gwA's UDP to gwB.
ike_sent() { # MARKER: three datagrams to gwB's UDP/500 from a plain socket, three from one
    # with a bypass policy (given before the daemon's next sweep of the sockets has run)
    echo "
import socket, struct, time
def sock(bypass):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(('$GWA_PUB_IP4', 0))
    if bypass:  # struct xfrm_userpolicy_info: sel.family, dir, action (0: allow)
        for d in (1, 0):
            p = bytearray(168)
            struct.pack_into('=H', p, 40, socket.AF_INET)
            p[160] = d
            s.setsockopt(socket.SOL_IP, 17, bytes(p))  # IP_XFRM_POLICY
    return s
plain, bypass = sock(False), sock(True)
time.sleep(0.6)
for i in range(3):
    plain.sendto(b'ike-plain-$1', ('$GWB_PUB_IP4', 500))
    bypass.sendto(b'ike-bypass-$1', ('$GWB_PUB_IP4', 500))
    time.sleep(0.02)"
}
ike_bypass() {
    local own0 drop0 own1 drop1 got
    cli gwA policy add src $GWA_PUB_IP4/32 dst $GWB_PUB_IP4/32 proto udp dir out action block ||
        return 1
    own0=$(stat gwA 'xdp.pass-egress-own')
    drop0=$(stat gwA 'xdp.drop-egress-plaintext')
    # (gwB answers the datagrams that reach it with ICMP quoting them: not counted as sent)
    FILTERS=("contains ike-plain-$marker" "udp dport 500 contains ike-bypass-$marker")
    got=$(wire_counts "$TOPO" exec gwA "$PY" -c "$(ike_sent "$marker")")
    own1=$(stat gwA 'xdp.pass-egress-own')
    drop1=$(stat gwA 'xdp.drop-egress-plaintext')
    cli gwA policy del src $GWA_PUB_IP4/32 dst $GWB_PUB_IP4/32 proto udp dir out || return 1
    echo "on the wire (plain, bypass): $got; pass-egress-own $own0 -> $own1," \
        "drop-egress-plaintext $drop0 -> $drop1"
    [ "$got" = "0 3 " ] && [ $((own1 - own0)) -ge 3 ] && [ $((drop1 - drop0)) = 3 ]
}
check "IKE past a block policy only from a socket with its own bypass policy" ike_bypass

# Forged ESP for an SA gwB owns: dropped, counted as ICV failures.
forge() {
    local mac before after
    mac=$("$TOPO" exec gwB cat /sys/class/net/$GWB_PUB_IF/address)
    before=$(stat gwB 'drops.in-icv-fail')
    "$TOPO" exec wire "$PY" -c "
from scapy.all import Ether, IP, ESP, Raw, sendp
p = Ether(dst='$mac')/IP(src='$GWA_PUB_IP4', dst='$GWB_PUB_IP4')/ESP(spi=0x1001, seq=10**6)/Raw(b'\x00' * 64)
sendp(p, iface='$WIRE_B_IF', count=5, verbose=False)" || return 1
    sleep 0.3
    after=$(stat gwB 'drops.in-icv-fail')
    echo "in-icv-fail $before -> $after"
    [ $((after - before)) -ge 5 ]
}
check "forged ESP is dropped and counted (in-icv-fail)" forge

# Plaintext from the public side that a policy says must come protected: dropped and counted,
# never delivered to hostA.
# frames_to NODE IF MAC SRC DST N COUNTER SINK: N UDP datagrams to port 5300, SRC to DST, sent
# from NODE's IF in frames to MAC; sets DROPPED (how much gwA's COUNTER rose) and GOT (what the
# sink on node SINK, bound to DST, received).
frames_to() {
    local before after
    before=$(stat gwA "xdp.$7")
    sink_start "$8" "$5" 2 || return 1
    "$TOPO" exec "$1" "$PY" -c "
from scapy.all import Ether, IP, UDP, Raw, sendp
p = Ether(dst='$3')/IP(src='$4', dst='$5')/UDP(sport=5300, dport=5300)/Raw(b'frame')
sendp(p, iface='$2', count=$6, verbose=False)" 2>/dev/null || return 1
    sink_count GOT
    after=$(stat gwA "xdp.$7")
    DROPPED=$((after - before))
    echo "to $3 from $1: $7 +$DROPPED, $8 got $GOT of $6"
}
unprotected() {
    local mac
    mac=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PUB_IF/address)
    frames_to wire "$WIRE_A_IF" "$mac" "$HOSTB_IP4" "$HOSTA_IP4" 5 drop-in-unprotected hostA &&
        [ "$DROPPED" -ge 5 ] && [ "$GOT" = 0 ]
}
check "plaintext on the public side for a protected flow: dropped by XDP, counted" unprotected

# A unicast frame to another station's MAC (a promiscuous NIC, a switch flooding) is not gwA's
# to forward, as the kernel would not route it: dropped where it would be encrypted, counted.
# A MAC of a device stacked on the interface (a macvlan, as for VRRP) is gwA's own, and so is
# a changed MAC, from the link event on.
# to_mac MAC: 20 frames of a protected flow from hostA to hostB, to that MAC.
to_mac() {
    frames_to hostA "$HOSTA_IF" "$1" "$HOSTA_IP4" "$HOSTB_IP4" 20 drop-other-host hostB
}
taken() { [ "$DROPPED" = 0 ] && [ "$GOT" = 20 ]; }
refused() { [ "$DROPPED" -ge 20 ] && [ "$GOT" = 0 ]; }
# macs_shown yes|no MAC: within 5 s, gwA's `iface list` shows MAC among its protected
# interface's MACs, or does not.
macs_shown() {
    local i shown
    for i in $(seq 50); do
        shown=no
        cli gwA iface list | grep "^$GWA_PROT_IF " | grep -q "macs .*$2" && shown=yes
        [ "$shown" = "$1" ] && return 0
        sleep 0.1
    done
    echo "$2 among $GWA_PROT_IF's MACs: $shown after 5 s"
    return 1
}
other_mac() { to_mac 02:00:00:00:00:77 && refused; }
check "a frame to another station's MAC: dropped and counted, nothing reaches hostB" other_mac
# A packet to another host in a broadcast frame: the kernel takes the frame but forwards no
# such packet (ip_forward() wants PACKET_HOST), and neither does gwA.
group_mac() {
    frames_to hostA "$HOSTA_IF" ff:ff:ff:ff:ff:ff "$HOSTA_IP4" "$HOSTB_IP4" 20 drop-group-mac hostB &&
        refused
}
check "a packet to another host in a broadcast frame: dropped and counted, nothing reaches hostB" \
    group_mac
# The broadcast address of gwA's protected subnet (10.1.0.255 of 10.1.0.1/24: the kernel's
# broadcast route) is gwA's own: the kernel delivers what is sent to it to the gateway's
# sockets and forwards none of it, whatever out policy covers it (one that does is added
# here), and so does gwA, in a broadcast frame or one to its MAC: passed, counted as local.
# So are the limited broadcast, and the broadcast address of a subnet gwA is given while it
# runs (read at the address's event).
subnet_broadcast() { # MAC [ADDRESS]
    local rc=0 brd=${2:-10.1.0.255}
    local pol="src $SITE_A4 dst $brd/32 dir out"
    cli gwA policy add $pol tmpl src "$GWA_PUB_IP4" dst "$GWB_PUB_IP4" proto esp reqid 1 \
        mode tunnel || return 1
    frames_to hostA "$HOSTA_IF" "$1" "$HOSTA_IP4" "$brd" 20 pass-local gwA &&
        [ "$DROPPED" -ge 20 ] && [ "$GOT" = 20 ] || rc=1
    cli gwA policy del $pol || rc=1
    return $rc
}
check "a packet to the protected subnet's broadcast address, under an out policy: gwA's own" \
    subnet_broadcast ff:ff:ff:ff:ff:ff
check "... in a frame to gwA's MAC too" \
    subnet_broadcast "$("$TOPO" exec gwA cat /sys/class/net/"$GWA_PROT_IF"/address)"
check "... and to 255.255.255.255" subnet_broadcast ff:ff:ff:ff:ff:ff 255.255.255.255
new_subnet_broadcast() {
    local rc=0
    "$TOPO" exec gwA ip addr add 10.1.7.1/24 dev "$GWA_PROT_IF" || return 1
    sleep 1  # the address's events, then a read of the broadcast routes within 250 ms
    subnet_broadcast ff:ff:ff:ff:ff:ff 10.1.7.255 || rc=1
    "$TOPO" exec gwA ip addr del 10.1.7.1/24 dev "$GWA_PROT_IF" || rc=1
    return $rc
}
check "... and to that of a subnet added to gwA's protected interface while it runs" \
    new_subnet_broadcast
upper_mac() {
    local mv=02:00:00:00:00:79 rc=0
    "$TOPO" exec gwA ip link add link "$GWA_PROT_IF" name xesp-mv0 address $mv \
        type macvlan mode bridge || return 1
    { macs_shown no $mv && to_mac $mv && refused; } || rc=1  # down: the kernel's is not either
    "$TOPO" exec gwA ip link set xesp-mv0 up
    { macs_shown yes $mv && to_mac $mv && taken; } || rc=1
    "$TOPO" exec gwA ip link set xesp-mv0 down
    { macs_shown no $mv && to_mac $mv && refused; } || rc=1
    "$TOPO" exec gwA ip link set xesp-mv0 up
    macs_shown yes $mv || rc=1
    "$TOPO" exec gwA ip link del xesp-mv0
    { macs_shown no $mv && to_mac $mv && refused; } || rc=1
    return $rc
}
check "a macvlan's MAC on gwA's protected interface is gwA's while it is up, and only then" \
    upper_mac
new_mac() {
    local old rc=0
    old=$("$TOPO" exec gwA cat /sys/class/net/$GWA_PROT_IF/address)
    "$TOPO" exec gwA ip link set dev "$GWA_PROT_IF" address 02:00:00:00:00:78 || return 1
    { macs_shown yes 02:00:00:00:00:78 && to_mac 02:00:00:00:00:78 && taken; } || rc=1
    { to_mac "$old" && refused; } || rc=1
    "$TOPO" exec gwA ip link set dev "$GWA_PROT_IF" address "$old" || return 1
    { macs_shown yes "$old" && to_mac "$old" && taken; } || rc=1
    return $rc
}
check "gwA's protected interface takes a new MAC: frames to it are gwA's, to the old refused" \
    new_mac

# A router between the gateways with a smaller next link answers gwA's DF ESP packets with
# "fragmentation needed" / "packet too big" (scapy plays the router on the wire). gwA lowers
# the SA's path MTU, and hostA then learns the smaller tunnel MTU from gwA. A report quoting a
# sequence number the SA has not sent is ignored, and counted.
tunnel_pmtu() {
    local oseq ignored learnt got
    ping_from hostA "$HOSTB_IP6" -c 2 -i 0.1 >/dev/null || return 1     # the IPv6 SA sends
    ignored=$(stat gwA 'gateway.pmtu-ignored')
    oseq=$(stat gwA 'sas[spi=0x1001].oseq')
    report_to_gwA 0x1001 $((oseq + 1000)) 1200 || return 1              # never sent: spoofed
    oseq=$(stat gwA 'sas[spi=0x1001].oseq')
    report_to_gwA 0x1001 "$oseq" 1300 || return 1
    oseq=$(stat gwA 'sas[spi=0x1002].oseq')
    report_to_gwA 0x1002 "$oseq" 1400 || return 1
    sleep 0.5
    learnt=$(stat gwA 'gateway.pmtu-learnt')
    echo "path MTU $(stat gwA 'sas[spi=0x1001].path_mtu') / $(stat gwA 'sas[spi=0x1002].path_mtu')," \
        "tunnel MTU $(stat gwA 'sas[spi=0x1001].tunnel_mtu') (was $tunnel_mtu)," \
        "ignored $ignored -> $(stat gwA 'gateway.pmtu-ignored'), learnt $learnt"
    [ "$(stat gwA 'sas[spi=0x1001].path_mtu')" = 1300 ] &&
        [ "$(stat gwA 'sas[spi=0x1002].path_mtu')" = 1400 ] &&
        [ "$(stat gwA 'sas[spi=0x1001].tunnel_mtu')" = $((tunnel_mtu - 200)) ] &&
        [ "$(stat gwA 'gateway.pmtu-ignored')" = $((ignored + 1)) ] && [ "$learnt" -ge 2 ] || return 1
    "$TOPO" exec hostA ip route flush cache
    got=$(pmtu_learnt 2>&1)
    echo "hostA's path MTU to hostB: $got"
    [ "$got" = $((tunnel_mtu - 200)) ]
}
check "ICMP from a router on the wire lowers the SA's path MTU; hostA learns the tunnel MTU" tunnel_pmtu
check "TCP hostA -> hostB at the smaller path MTU (4 MiB, SHA-256)" tcp_python a2b 4
pmtu_expired() {
    for _ in $(seq $((PMTU_EXPIRES * 4))); do
        [ "$(stat gwA 'sas[spi=0x1001].path_mtu')" = 0 ] &&
            [ "$(stat gwA 'sas[spi=0x1002].path_mtu')" = 0 ] &&
            [ "$(stat gwA 'sas[spi=0x1001].tunnel_mtu')" = "$tunnel_mtu" ] && return 0
        sleep 0.5
    done
    echo "path MTU $(stat gwA 'sas[spi=0x1001].path_mtu') / $(stat gwA 'sas[spi=0x1002].path_mtu')"
    return 1
}
check "the learnt path MTU expires (--pmtu-expires $PMTU_EXPIRES): the link's MTU applies again" pmtu_expired

# A wrong key on gwA's outbound SA: gwB drops every packet and counts it; the right key back
# (sequence numbers above what gwB has seen) and the tunnel works again.
sa_line() { # SPI VERB KEY OSEQ
    local line
    line=$(grep "spi $1 " "$WORK/gwA.conf")
    line=${line/sa add/sa $2}
    [ -n "$3" ] && line=$(echo "$line" | sed -E "s/0x[0-9a-f]{40}/$3/")
    echo "$line replay-oseq $4"
}
wrong_key() {
    local before after
    before=$(stat gwB 'drops.in-icv-fail')
    eval "cli gwA $(sa_line 0x1001 update 0x000102030405060708090a0b0c0d0e0f10111213 100000)" || return 1
    ping_from hostA "$HOSTB_IP4" -c 3 -W 1 && { echo "pings got through with a wrong key"; return 1; }
    after=$(stat gwB 'drops.in-icv-fail')
    echo "in-icv-fail $before -> $after"
    [ $((after - before)) -ge 3 ] || return 1
    eval "cli gwA $(sa_line 0x1001 update "" 200000)" || return 1
    ping_from hostA "$HOSTB_IP4" -c 3
}
check "a wrong key is dropped and counted; the right key restores the tunnel" wrong_key

# A time limit on gwA's outbound SA: it carries traffic until then, and afterwards drops and
# counts it (out-expired); replacing the SA brings the tunnel back. Time limits are checked once
# a second, so the SA stops somewhere between 3 and 4 s after it was added: the drops are
# looked for once the daemon says the SA has expired, not after a fixed time.
expire_sa() {
    local before expired=
    eval "cli gwA $(sa_line 0x1001 update "" 300000) limit time-hard 3" || return 1
    [ "$(stat gwA 'sas[spi=0x1001].hard_lifetime_s')" -le 3 ] ||
        { echo "stats: hard_lifetime_s $(stat gwA 'sas[spi=0x1001].hard_lifetime_s')"; return 1; }
    cli gwA stats | grep -q 'spi 0x00001001 .*hard lifetime in [0-3] s' ||
        { echo "xesp stats does not show the time left"; return 1; }
    ping_from hostA "$HOSTB_IP4" -c 2 -i 0.2 >/dev/null ||
        { echo "no traffic before the limit"; return 1; }
    for _ in $(seq 40); do
        expired=$(stat gwA 'sas[spi=0x1001].hard_expired')
        [ "$expired" = True ] && break
        sleep 0.2
    done
    [ "$expired" = True ] || { echo "the SA has not expired: hard_expired $expired"; return 1; }
    before=$(stat gwA 'drops.out-expired')
    ping_from hostA "$HOSTB_IP4" -c 3 -W 1 && { echo "pings got through an expired SA"; return 1; }
    echo "hard_expired $(stat gwA 'sas[spi=0x1001].hard_expired'), out-expired $before ->" \
        "$(stat gwA 'drops.out-expired')"
    [ "$(stat gwA 'drops.out-expired')" -ge $((before + 3)) ] || return 1
    cli gwA stats | grep -q 'spi 0x00001001 .*hard lifetime reached' ||
        { echo "xesp stats does not say the SA's hard lifetime is reached"; return 1; }
}
# The SA is replaced whatever happened above: a failure there must not leave the tunnel down
# for the checks after it.
time_limit() {
    local rc=0
    expire_sa || rc=1
    eval "cli gwA $(sa_line 0x1001 update "" 400000)" || return 1
    ping_from hostA "$HOSTB_IP4" -c 3 || return 1
    return $rc
}
check "limit time-hard 3: the SA stops after 3 s, counted; a new SA restores the tunnel" time_limit

# SAs and policies come and go on both gateways while a flow runs: it loses nothing.
churn() {
    local gw i n
    for gw in gwA gwB; do
        : >"$WORK/$gw.extra"
        for i in $(seq 20); do
            n=$(printf '%02x' "$i")
            echo "sa add src 198.51.100.$i dst 203.0.113.$i proto esp spi 0x77$n reqid 9$i mode tunnel aead 'rfc4106(gcm(aes))' 0x$(printf '%040x' "$i") 128" >>"$WORK/$gw.extra"
            echo "policy add src 10.9.$i.0/24 dst 10.8.$i.0/24 dir out tmpl src 198.51.100.$i dst 203.0.113.$i proto esp reqid 9$i mode tunnel" >>"$WORK/$gw.extra"
        done
    done
    ping_cmd hostA "$HOSTB_IP4" -c 60 -i 0.05
    "${PING[@]}" >"$WORK/churn.ping" 2>&1 &
    local p=$!
    for gw in gwA gwB; do
        cli "$gw" batch "$WORK/$gw.extra" || return 1
    done
    sleep 0.5
    for gw in gwA gwB; do
        for i in $(seq 20); do
            cli "$gw" sa del src 198.51.100.$i dst 203.0.113.$i proto esp spi 0x77$(printf '%02x' "$i") || return 1
            cli "$gw" policy del src 10.9.$i.0/24 dst 10.8.$i.0/24 dir out || return 1
        done
    done
    wait $p || { cat "$WORK/churn.ping"; return 1; }
}
check "SAs and policies added and removed under traffic: no ping lost" churn

# Tun mode, the TUN device deleted under the daemon (`ip link del xesp-tun`): tun mode stops,
# said once (tun-failed), the daemon does not spin on the dead descriptor (nothing counted bad),
# the tc program drops every datagram of a protected flow that would go there (drop-tun-gone;
# not UDP, which takes the local link), none of it on the wire; and `iface del` and `add` bring
# it back.
if [ "$PROT_MODE" = tun ]; then
    tun_deleted() {
        local got before gone
        "$TOPO" exec gwA ip link del xesp-tun || return 1
        sleep 0.2
        before=$(stat gwA xdp.drop-tun-gone)
        FILTERS=("contains tundel-$marker")
        raw_cmd hostA "$HOSTB_IP4" 200 "tundel-$marker"
        got=$(wire_counts "${UDP[@]}")
        gone=$(($(stat gwA xdp.drop-tun-gone) - before))
        echo "plaintext on the wire: $got; drop-tun-gone +$gone of 200;" \
            "tun-failed $(stat gwA gateway.tun-failed), drop-tun-bad $(stat gwA gateway.drop-tun-bad)"
        [ "$got" = "0 " ] && [ "$gone" = 200 ] && [ "$(stat gwA gateway.tun-failed)" = 1 ] &&
            [ "$(stat gwA gateway.drop-tun-bad)" = 0 ]
    }
    step "tun mode: TUN device deleted: tun mode stops, said once, nothing in the clear" tun_deleted
    tun_back() {
        cli gwA iface del "$GWA_PROT_IF" || return 1
        cli gwA iface add "$GWA_PROT_IF" role protected mode tun || return 1
        for _ in $(seq 20); do
            ping_from hostA "$HOSTB_IP4" -c 1 -W 1 >/dev/null 2>&1 && break
        done
        ping_from hostA "$HOSTB_IP4" -c 3
    }
    step "tun mode: ... iface del and add bring the tunnel back" tun_back
    # `iface add` again without `mode` is refused, and the interface stays in tun mode.
    readd_no_mode() {
        ! cli gwA iface add "$GWA_PROT_IF" role protected 2>"$WORK/readd.err" || return 1
        cat "$WORK/readd.err"
        grep -q "already added as protected" "$WORK/readd.err" &&
            cli gwA iface list | grep "$GWA_PROT_IF" | grep -qw tun
    }
    step "tun mode: iface add again without mode leaves it in tun mode" readd_no_mode
    # What the kernel drops at a full TUN queue (the daemon stopped with SIGSTOP while hostA
    # sends 800 datagrams, not UDP, into a queue of 500) is counted, and the count survives the next
    # TUN device (iface del and add).
    queue_drops() {
        local q1 q2
        kill -STOP "${DPID[gwA]}" || return 1
        raw_cmd hostA "$HOSTB_IP4" 800 "queue-$marker" 0
        "${UDP[@]}"
        kill -CONT "${DPID[gwA]}"
        sleep 0.5
        q1=$(stat gwA gateway.drop-tun-queue-full)
        cli gwA iface del "$GWA_PROT_IF" || return 1
        cli gwA iface add "$GWA_PROT_IF" role protected mode tun || return 1
        q2=$(stat gwA gateway.drop-tun-queue-full)
        echo "drop-tun-queue-full $q1, after a new TUN $q2"
        [ "$q1" -ge 200 ] 2>/dev/null && [ "$q2" -ge "$q1" ]
    }
    step "tun mode: drops at a full TUN queue are counted, and survive a new TUN" queue_drops
    # UDP takes the local link. A sender's GSO packets (UDP_SEGMENT: 20 sends of ten 1,000-byte
    # datagrams) go there whole and the kernel cuts them on the way: hostB gets every datagram,
    # the tc program counts super-packets, and nothing is in the clear.
    udp_gso() {
        local before after got n
        before=$(stat gwA xdp.tun-udp-link)
        sink_start hostB "$HOSTB_IP4" 3 || return 1
        FILTERS=("contains gso-$marker")
        got=$(wire_counts "$TOPO" exec hostA "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, 1000)  # UDP_SEGMENT
for i in range(20):
    s.sendto(b''.join(b'gso-$marker %04d'.ljust(1000, b'.') % (i * 10 + k) for k in range(10)),
             ('$HOSTB_IP4', 5300))
    time.sleep(0.02)")
        sink_count n
        after=$(stat gwA xdp.tun-udp-link)
        echo "hostB got $n of 200; tun-udp-link +$((after - before)); plaintext on the wire: $got"
        [ "${n:-0}" = 200 ] && [ $((after - before)) -ge 20 ] && [ $((after - before)) -lt 200 ] &&
            [ "$got" = "0 " ]
    }
    check "tun mode: UDP GSO packets cross the local link, cut by the kernel, all delivered" udp_gso
    # What the local link's veth drops is counted: with its far end's MTU lowered under what
    # the tc program checks, every 1,300-byte datagram is dropped there, and none is in clear.
    link_drops() {
        local before after got
        "$TOPO" exec gwA ip link set xesp-local-gw mtu 1200 || return 1
        before=$(stat gwA gateway.drop-local-link)
        FILTERS=("contains linkdrop-$marker")
        got=$(wire_counts "$TOPO" exec hostA "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    s.sendto(b'linkdrop-$marker'.ljust(1300, b'.'), ('$HOSTB_IP4', 5300))
    time.sleep(0.01)")
        after=$(stat gwA gateway.drop-local-link)
        "$TOPO" exec gwA ip link set xesp-local-gw mtu 1500
        echo "drop-local-link $before -> $after; plaintext on the wire: $got"
        [ $((after - before)) = 20 ] && [ "$got" = "0 " ]
    }
    check "tun mode: what the local link drops is counted (drop-local-link), none in the clear" link_drops
fi

# A mode change in place (`iface add` again with the other mode) under a flow: not one
# plaintext packet on the wire while the programs change over; the new mode's program alone on
# the interface, the tunnel working in it; and back again.
other_mode=tun
[ "$PROT_MODE" = tun ] && other_mode=xdp
# only_mode MODE: the program of MODE on gwA's protected interface, and not the other one's.
only_mode() {
    local tc=0 xdp=0
    "$TOPO" exec gwA tc filter show dev "$GWA_PROT_IF" ingress | grep -q xesp_tc_protect && tc=1
    xdp_attached gwA "$GWA_PROT_IF" && xdp=1
    echo "tc $tc xdp $xdp"
    if [ "$1" = tun ]; then [ $tc$xdp = 10 ]; else [ $tc$xdp = 01 ]; fi
}
mode_change() {
    local got changer
    FILTERS=("contains mode-$marker")
    (sleep 0.3; cli gwA iface add "$GWA_PROT_IF" role protected mode "$1") >"$WORK/mode.out" 2>&1 &
    changer=$!
    udp_cmd hostA "$HOSTB_IP4" 400 "mode-$marker" 0.002
    got=$(wire_counts "${UDP[@]}")
    wait "$changer" || { cat "$WORK/mode.out"; return 1; }
    echo "plaintext on the wire: $got"
    [ "$got" = "0 " ] && cli gwA iface list | grep -q "^$GWA_PROT_IF role protected mode $1 " &&
        only_mode "$1"
}
step "mode change in place under a flow ($PROT_MODE to $other_mode): nothing in the clear" \
    mode_change $other_mode
check "... the tunnel carries a ping in $other_mode mode" ping_from hostA "$HOSTB_IP4" -c 2
check "... a frame to another station's MAC is refused in $other_mode mode too" other_mac
step "mode change back ($other_mode to $PROT_MODE): nothing in the clear" mode_change "$PROT_MODE"
check "... the tunnel carries a ping in $PROT_MODE mode again" ping_from hostA "$HOSTB_IP4" -c 2
check "... and refused in $PROT_MODE mode again" other_mac

# kill -9 under traffic: not one plaintext packet of the flow reaches the wire; after a restart
# from the state file the flow resumes.
crash() {
    local before_pid=${DPID[gwA]}
    FILTERS=("contains $marker" "icmp host $HOSTA_IP4 host $HOSTB_IP4")
    (sleep 1; kill -9 "$before_pid") &
    local killer=$!
    ping_cmd hostA "$HOSTB_IP4" -c 30 -i 0.1 -W 1
    "${PING[@]}" >/dev/null 2>&1 &
    local pinger=$!
    udp_cmd hostA "$HOSTB_IP4" 1500 "$marker" 0.002
    got=$(wire_counts "${UDP[@]}")
    wait "$killer" "$pinger"
    wait "$before_pid" 2>/dev/null
    unset "DPID[gwA]"
    local n_marker n_icmp
    read -r n_marker n_icmp <<<"$got"
    echo "plaintext on the wire: marker '$n_marker', icmp '$n_icmp'"
    [ "$n_marker" = 0 ] && [ "$n_icmp" = 0 ]
}
# Tun mode: the TUN's index, which the tc program redirects to, before the kill.
[ "$PROT_MODE" = tun ] && TUN_INDEX=$("$TOPO" exec gwA cat /sys/class/net/xesp-tun/ifindex)
step "kill -9 under traffic: zero plaintext packets of protected flows on the wire" crash
check "after kill -9: XDP stays attached on gwA" xdp_attached gwA "$GWA_PUB_IF"
check "after kill -9: the $PROT_MODE-mode program stays on gwA's protected interface" prot_attached gwA "$GWA_PROT_IF"
# Tun mode: the TUN outlives the daemon and keeps its index, so that no other device can take
# it (`ip link add ... index N`, or one moved into the namespace) and be handed the protected
# plaintext the tc program still redirects there.
tun_kept() {
    local idx
    idx=$("$TOPO" exec gwA cat /sys/class/net/xesp-tun/ifindex) || return 1
    echo "xesp-tun index $idx, before the kill ${TUN_INDEX:-none}"
    [ -n "$TUN_INDEX" ] && [ "$idx" = "$TUN_INDEX" ] || return 1
    if "$TOPO" exec gwA ip link add xesp-steal index "$TUN_INDEX" type dummy 2>/dev/null; then
        "$TOPO" exec gwA ip link del xesp-steal
        echo "another device took index $TUN_INDEX"
        return 1
    fi
}
[ "$PROT_MODE" = tun ] &&
    check "after kill -9: the TUN device stays, and no other device can take its index" tun_kept
check "after kill -9: the tc egress guard stays attached on gwA" bash -c "'$TOPO' exec gwA tc filter show dev $GWA_PUB_IF egress | grep -q xesp_tc_egress"
check "after kill -9: protected traffic is dropped, not forwarded" bash -c "! '$TOPO' exec hostA '$PY' '$HERE/ping.py' -c 2 -W 1 $HOSTB_IP4"
# Tun mode: what the tc program still sends to the TUN, which nobody reads, it counts
# (tun-encap, read from its own map: no daemon to ask), and the kernel drops there, counting
# it in the device's tx_dropped from Linux 6.11.
dead_tun_counted() {
    local before after sent0 sent1 dropped=/sys/class/net/xesp-tun/statistics/tx_dropped
    before=$("$TOPO" exec gwA cat $dropped) || return 1
    sent0=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" "$GWA_PROT_IF" tun-encap) || return 1
    ! "$TOPO" exec hostA "$PY" "$HERE/ping.py" -c 3 -i 0.2 -W 1 "$HOSTB_IP4" || return 1
    after=$("$TOPO" exec gwA cat $dropped) || return 1
    sent1=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" "$GWA_PROT_IF" tun-encap) || return 1
    echo "tun-encap $sent0 -> $sent1; xesp-tun tx_dropped: $before -> $after"
    [ $((sent1 - sent0)) -ge 3 ] || return 1
    # tx_dropped counts a missing qdisc's drops from 6.11 on
    local v
    v=$(uname -r | awk -F. '{print $1 * 1000 + $2}')
    [ "$v" -lt 6011 ] || [ $((after - before)) -ge 3 ]
}
[ "$PROT_MODE" = tun ] &&
    check "after kill -9: what goes to the TUN is counted, and dropped there" dead_tun_counted
# Tun mode's UDP: the local link stays, and its XDP program, with no socket behind it, drops.
dead_udp_dropped() {
    local before after got
    before=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" xesp-local-gw xsk-missing) || return 1
    FILTERS=("contains dead-udp-$marker")
    udp_cmd hostA "$HOSTB_IP4" 20 "dead-udp-$marker" 0.01
    got=$(wire_counts "${UDP[@]}")
    after=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" xesp-local-gw xsk-missing) || return 1
    echo "xsk-missing on xesp-local-gw $before -> $after; plaintext on the wire: $got"
    [ $((after - before)) -ge 20 ] && [ "$got" = "0 " ]
}
[ "$PROT_MODE" = tun ] &&
    check "after kill -9: UDP is dropped at the local link (xsk-missing), not forwarded" dead_udp_dropped
own_dropped() {
    local got
    FILTERS=("contains own-dead-$marker")
    got=$(wire_counts "$TOPO" exec gwA "$PY" -c "$(own_sent "dead-$marker")")
    echo "plaintext on the wire: $got"
    [ "$got" = "0 " ]
}
check "after kill -9: the gateway's own protected traffic is dropped, not sent in the clear" own_dropped
step "restart from the state file (no config given)" start_gw gwA
resume() {
    for _ in $(seq 20); do
        ping_from hostA "$HOSTB_IP4" -c 1 -W 1 >/dev/null 2>&1 && break
    done
    ping_from hostA "$HOSTB_IP4" -c 3
}
check "after the restart the flow resumes (gwB accepts the sequence numbers)" resume
check "after the restart a frame to another station's MAC is refused" other_mac
check "the restarted daemon has its interfaces back" bash -c "[ \$(XESP_SOCKET=$WORK/gwA.sock '$XESP' iface list | wc -l) = 2 ]"
check "... the protected one in $PROT_MODE mode" bash -c "XESP_SOCKET=$WORK/gwA.sock '$XESP' iface list | grep -q '^$GWA_PROT_IF role protected mode $PROT_MODE '"
[ "$PROT_MODE" = tun ] &&
    check "... and has taken over the TUN the dead one left, at the same index" bash -c "
        grep -q 'xesp-tun: left in place (a daemon died), taken over' '$WORK/gwA.log' &&
        [ \$('$TOPO' exec gwA cat /sys/class/net/xesp-tun/ifindex) = '$TUN_INDEX' ]"
# A TUN a dead daemon left stays while its program may still send to it, whoever takes it
# over meanwhile: here a daemon with another interface in tun mode, which it then deletes. It
# goes once no such program is left: here, once the protected interface is taken over in xdp
# mode.
tun_tidied() {
    local pid rc=0 tun_there
    tun_there() { "$TOPO" exec gwA ip link show xesp-tun >/dev/null 2>&1; }
    tun_there || {
        echo "no TUN left after kill -9"
        return 1
    }
    "$TOPO" exec gwA ip link add xs-other type veth peer name xs-otherp &&
        "$TOPO" exec gwA ip link set xs-other up || return 1
    "$TOPO" exec gwA "$XESP" daemon --socket "$WORK/tidy.sock" --no-state >>"$WORK/tidy.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        XESP_SOCKET=$WORK/tidy.sock "$XESP" iface add xs-other role protected mode tun \
            2>/dev/null && break
        sleep 0.1
    done
    XESP_SOCKET=$WORK/tidy.sock "$XESP" iface del xs-other || rc=1
    if ! tun_there; then
        echo "the TUN went while the dead daemon's program still sent to it"
        rc=1
    fi
    XESP_SOCKET=$WORK/tidy.sock "$XESP" iface add "$GWA_PROT_IF" role protected || rc=1
    if tun_there; then
        echo "xesp-tun still there: $(tail -n 3 "$WORK/tidy.log")"
        rc=1
    fi
    kill -TERM "$pid"
    wait "$pid"
    "$TOPO" exec gwA ip link del xs-other
    return $rc
}
if [ "$PROT_MODE" = tun ]; then
    stop_gw gwA KILL
    check "kill -9: the TUN left stays while its program does, then goes with it" tun_tidied
    step "restart from the state file: tun mode again" start_gw gwA
    check "... and the flow resumes" resume
fi

step "SIGTERM: the daemon exits 0" stop_gw gwA TERM
check "SIGTERM: XDP stays on gwA's interfaces (fail closed)" xdp_attached gwA "$GWA_PUB_IF"
check "SIGTERM: the tc egress guard stays too" bash -c "'$TOPO' exec gwA tc filter show dev $GWA_PUB_IF egress | grep -q xesp_tc_egress"
check "SIGTERM: the local link is gone" bash -c "! '$TOPO' exec gwA ip link show xesp-local 2>/dev/null"
check "SIGTERM: the $PROT_MODE-mode program stays on the protected interface" prot_attached gwA "$GWA_PROT_IF"
[ "$PROT_MODE" = tun ] &&
    check "SIGTERM: the TUN device is gone" bash -c "! '$TOPO' exec gwA ip link show xesp-tun 2>/dev/null"
stopped_dropped() {
    local got n
    sink_start hostB "$HOSTB_IP4" 2 || return 1
    FILTERS=("contains stopped-$marker" "esp")
    udp_cmd hostA "$HOSTB_IP4" 50 "stopped-$marker"
    got=$(wire_counts "${UDP[@]}")
    sink_count n
    echo "on the wire: plaintext, ESP: $got; hostB got ${n:-0}"
    [ "$got" = "0 0 " ] && [ "${n:-0}" = 0 ]
}
check "SIGTERM: protected traffic is dropped, nothing of it on the wire" stopped_dropped
stop_gw gwB

finish
