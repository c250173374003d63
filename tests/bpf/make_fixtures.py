#!/usr/bin/python3
"""Builds the frames test_xdp.cpp runs through the XDP classifier and writes them as a C++
header: make_fixtures.py OUT.h

The expected verdict, counter and metadata of each frame live in the table of test_xdp.cpp,
next to the SAs and policies it loads; the names here are the keys. Addresses used:

    192.0.2.1, 2001:db8::1     the gateway's public addresses (SAs 101-104 point at them)
    192.0.2.2                  the peer gateway: SA 105, without `dir`, is our outbound SA to it
    10.1.0.5                   a host behind us: SA 106 (`dir in`, transport) points at it
    10.1.0.0/16, fd00:1::/48   the protected side      10.1.0.1 the gateway's LAN address
    10.2.0.0/16, fd00:2::/48   the remote protected side, behind the tunnel
    10.3.0.0/16                UDP/53 protected, everything else bypassed
    203.0.113.0/24             blocked
    fd00:1::/48 -> ::/0        ICMPv6 blocked where nothing else applies
    ::/0 -> fd00:7::/48        protected, from anywhere
    2001:db8::1 (in)           plaintext to it must come as ESP, as to 192.0.2.1
"""
import struct
import sys

from scapy.all import (ARP, ESP, ICMP, ICMPv6EchoRequest, ICMPv6ND_NA, ICMPv6ND_NS,
                       ICMPv6PacketTooBig, IP, IPOption_Router_Alert, IPv6, IPv6ExtHdrDestOpt,
                       IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, TCP, UDP,
                       Dot1AD, Dot1Q, Ether, Padding, Raw, conf, raw)

conf.verb = 0

MACS = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
GW4, GW6 = "192.0.2.1", "2001:db8::1"
PEER4, PEER6 = "198.51.100.2", "2001:db8:ffff::2"
ROUTER4, ROUTER6 = "198.51.100.9", "2001:db8:ffff::9"
SA_RAW4, SA_NATT4, SA_RAW6, SA_NATT6 = 0x1000, 0x2000, 0x3000, 0x4000
PEER_GW4, SA_OUT4 = "192.0.2.2", 0x5000
HOST4, SA_IN_HOST4 = "10.1.0.5", 0x6000
FOREIGN_SPI = 0x9999


def eth(**kw):
    return Ether(**MACS, **kw)


def esp(spi, n=32):
    return ESP(spi=spi, seq=1, data=b"\x5a" * n)


def ike_natt():
    # non-ESP marker, then an IKE header (RFC 3948 2.2)
    return b"\x00\x00\x00\x00" + b"\x11" * 8 + b"\x00" * 8 + b"\x21\x20\x22\x08" + b"\x00" * 8


def tcp(dport=80):
    return TCP(sport=40000, dport=dport, flags="S")


def udp(dport=9999):
    return UDP(sport=40000, dport=dport) / Raw(b"payload!")


def cut(pkt, n):
    """The first n bytes of the frame: a header that lies about what follows."""
    return raw(pkt)[:n]


def with_ip_len(pkt, tot_len):
    """An IPv4 frame whose total length field says tot_len (checksum left as built)."""
    b = bytearray(raw(pkt))
    struct.pack_into("!H", b, 14 + 2, tot_len)
    return bytes(b)


def fixtures():
    f = []
    add = lambda name, pkt: f.append((name, pkt if isinstance(pkt, bytes) else raw(pkt)))

    # ESP and ESP-in-UDP for our SAs and others'
    add("esp4_known", eth() / IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("esp4_unknown_spi", eth() / IP(src=PEER4, dst=GW4) / esp(0x9999))
    add("esp4_other_dst", eth() / IP(src=PEER4, dst="192.0.2.77") / esp(SA_RAW4))
    add("esp4_for_natt_sa", eth() / IP(src=PEER4, dst=GW4) / esp(SA_NATT4))
    add("espinudp4_known", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500) / esp(SA_NATT4))
    add("espinudp4_for_raw_sa", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500) / esp(SA_RAW4))
    add("esp4_ip_options", eth() / IP(src=PEER4, dst=GW4, options=[IPOption_Router_Alert()]) / esp(SA_RAW4))
    add("esp4_vlan", eth() / Dot1Q(vlan=10) / IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("esp4_qinq", eth() / Dot1AD(vlan=5) / Dot1Q(vlan=10) / IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("esp4_three_tags", eth() / Dot1AD(vlan=5) / Dot1Q(vlan=10) / Dot1Q(vlan=11) /
        IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("esp4_eth_padding", eth() / IP(src=PEER4, dst=GW4) / esp(SA_RAW4, 0) / Padding(b"\x00" * 30))
    add("esp6_known", eth() / IPv6(src=PEER6, dst=GW6) / esp(SA_RAW6))
    add("esp6_ext_headers", eth() / IPv6(src=PEER6, dst=GW6) / IPv6ExtHdrHopByHop() /
        IPv6ExtHdrRouting() / IPv6ExtHdrDestOpt() / esp(SA_RAW6))
    add("espinudp6_known", eth() / IPv6(src=PEER6, dst=GW6) / UDP(sport=4500, dport=4500) / esp(SA_NATT6))
    add("esp6_vlan", eth() / Dot1Q(vlan=10) / IPv6(src=PEER6, dst=GW6) / esp(SA_RAW6))

    # IKE and NAT keepalives (RFC 3948)
    add("ike4_natt", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500) / Raw(ike_natt()))
    add("ike4_500", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=500, dport=500) / Raw(b"\x11" * 28))
    add("ike6_natt", eth() / IPv6(src=PEER6, dst=GW6) / UDP(sport=4500, dport=4500) / Raw(ike_natt()))
    add("keepalive4", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500) / Raw(b"\xff"))
    add("keepalive4_eth_padding", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500) /
        Raw(b"\xff") / Padding(b"\x00" * 17))
    add("udp4500_empty", eth() / IP(src=PEER4, dst=GW4) / UDP(sport=4500, dport=4500))

    # fragments of ESP: the kernel reassembles them first
    add("esp4_fragment", eth() / IP(src=PEER4, dst=GW4, flags="MF", id=7) / esp(SA_RAW4))
    add("esp6_fragment", eth() / IPv6(src=PEER6, dst=GW6) / IPv6ExtHdrFragment(m=1, id=7) / esp(SA_RAW6))

    # malformed: truncated and lying headers
    add("esp4_truncated", cut(eth() / IP(src=PEER4, dst=GW4, len=20 + 6) / esp(SA_RAW4), 14 + 20 + 6))
    add("esp4_no_spi", cut(eth() / IP(src=PEER4, dst=GW4, len=20 + 2) / esp(SA_RAW4), 14 + 20 + 2))
    add("esp4_len_beyond_frame", with_ip_len(eth() / IP(src=PEER4, dst=GW4) / esp(SA_RAW4), 400))
    add("esp4_len_beyond_frame_foreign", with_ip_len(eth() / IP(src=PEER4, dst=GW4) / esp(0x9999), 400))
    add("espinudp4_len_beyond_frame", with_ip_len(eth() / IP(src=PEER4, dst=GW4) /
        UDP(sport=4500, dport=4500) / esp(SA_NATT4), 400))
    add("ip4_len_below_header", with_ip_len(eth() / IP(src="10.1.0.5", dst="10.2.0.7") / tcp(), 12))
    add("ip4_ihl_beyond_frame", cut(eth() / IP(src=PEER4, dst=GW4, ihl=15) / esp(SA_RAW4), 14 + 30))
    add("ip4_ihl_too_small", eth() / IP(src="10.1.0.5", dst="10.2.0.7", ihl=4) / tcp())
    add("ip4_truncated", cut(eth() / IP(src=PEER4, dst=GW4) / esp(SA_RAW4), 14 + 10))
    add("eth_only", cut(eth() / IP(), 14))       # test_run takes no frame below 14 bytes
    add("vlan_truncated", cut(eth() / Dot1Q(vlan=10) / IP(), 16))
    add("ip6_ext_truncated", cut(eth() / IPv6(src=PEER6, dst=GW6) /
        IPv6ExtHdrHopByHop(len=10, options=[]) / esp(SA_RAW6), 14 + 40 + 16))
    add("ip6_ext_too_many", eth() / IPv6(src=PEER6, dst=GW6) /
        IPv6ExtHdrDestOpt() / IPv6ExtHdrDestOpt() / IPv6ExtHdrDestOpt() / IPv6ExtHdrDestOpt() /
        IPv6ExtHdrDestOpt() / IPv6ExtHdrDestOpt() / IPv6ExtHdrDestOpt() / esp(SA_RAW6))

    # not IP, neighbour discovery
    # Attacks. Our own outbound ESP sent back to us; ESP of an SA with `dir in` to a host
    # behind us. From a protected host to the remote site: ESP of an SPI we do not own, ESP
    # fragments, IKE and NAT-T keepalives are plaintext like any other (an out policy
    # protects them); from the gateway itself they are its own.
    add("esp4_reflected", eth() / IP(src=GW4, dst=PEER_GW4) / esp(SA_OUT4))
    add("esp4_dir_in_host", eth() / IP(src="10.2.0.7", dst=HOST4) / esp(SA_IN_HOST4))
    add("esp4_transit", eth() / IP(src=HOST4, dst="10.2.0.7") / esp(FOREIGN_SPI))
    add("esp6_transit", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7") / esp(FOREIGN_SPI))
    add("esp4_fragment_transit", eth() / IP(src=HOST4, dst="10.2.0.7", flags="MF", id=7) / esp(FOREIGN_SPI))
    add("espinudp4_transit", eth() / IP(src=HOST4, dst="10.2.0.7") / UDP(sport=4500, dport=4500) /
        esp(FOREIGN_SPI))
    add("ike4_natt_transit", eth() / IP(src=HOST4, dst="10.2.0.7") / UDP(sport=4500, dport=4500) /
        Raw(ike_natt()))
    add("keepalive4_transit", eth() / IP(src=HOST4, dst="10.2.0.7") / UDP(sport=4500, dport=4500) /
        Raw(b"\xff"))
    add("ike4_500_transit", eth() / IP(src=HOST4, dst="10.2.0.7") / UDP(sport=500, dport=500) /
        Raw(b"\x11" * 28))
    add("esp4_gw_to_subnet", eth() / IP(src=GW4, dst="192.0.2.9") / esp(FOREIGN_SPI))
    add("ike4_gw_to_subnet", eth() / IP(src=GW4, dst="192.0.2.9") / UDP(sport=500, dport=500) /
        Raw(b"\x11" * 28))
    add("esp4_host_to_subnet", eth() / IP(src=HOST4, dst="192.0.2.9") / esp(FOREIGN_SPI))
    # Plaintext to protect from or to what the kernel takes as a martian: never forwarded
    # into a tunnel. The gateway's own addresses are its own to send from, over its local link.
    add("plain4_from_loopback", eth() / IP(src="127.0.0.1", dst="192.0.2.9") / udp())
    add("plain4_from_multicast", eth() / IP(src="224.0.0.9", dst="192.0.2.9") / udp())
    add("plain4_from_zero", eth() / IP(src="0.0.0.0", dst="192.0.2.9") / udp())
    add("plain4_from_gw_lan", eth() / IP(src="10.1.0.1", dst="10.2.0.7") / udp())
    add("plain6_from_link_local", eth() / IPv6(src="fe80::5", dst="fd00:7::1") / udp())
    add("plain6_from_loopback", eth() / IPv6(src="::1", dst="fd00:7::1") / udp())
    add("plain6_to_any_protect", eth() / IPv6(src="fd00:1::5", dst="fd00:7::1") / udp())

    add("arp", eth(type=0x0806) / ARP(psrc="10.1.0.5", pdst="10.1.0.1"))
    add("arp_vlan", eth() / Dot1Q(vlan=10) / ARP(psrc="10.1.0.5", pdst="10.1.0.1"))

    # Neighbour discovery (RFC 4861) is the kernel's when it is for the link or the gateway and
    # comes with hop limit 255, as ndisc_rcv takes it. Anything else of those ICMPv6 types is
    # plaintext like the rest: an out policy protects or blocks it.
    add("nd6_ns_multicast", eth() / IPv6(src="fd00:1::5", dst="ff02::1:ff00:7", hlim=255) /
        ICMPv6ND_NS(tgt="fd00:1::7"))
    add("nd6_ns_multicast_hlim64", eth() / IPv6(src="fd00:1::5", dst="ff02::1:ff00:7", hlim=64) /
        ICMPv6ND_NS(tgt="fd00:1::7"))
    add("nd6_ns_multicast_code1", eth() / IPv6(src="fd00:1::5", dst="ff02::1:ff00:7", hlim=255) /
        ICMPv6ND_NS(tgt="fd00:1::7", code=1))  # ndisc_rcv drops a code other than 0
    add("nd6_ns_site_multicast", eth() / IPv6(src="fd00:1::5", dst="ff05::1:3", hlim=255) /
        ICMPv6ND_NS(tgt="fd00:1::7"))  # multicast, but beyond the link (ff05::/16)
    add("nd6_na_link_local", eth() / IPv6(src="fd00:1::5", dst="fe80::7", hlim=255) /
        ICMPv6ND_NA(tgt="fd00:1::5"))
    add("nd6_ns_site_local", eth() / IPv6(src="fd00:1::5", dst="fec0::7", hlim=255) /
        ICMPv6ND_NS(tgt="fec0::7"))    # fec0::/10, just outside fe80::/10
    add("nd6_ns_to_protected", eth() / IPv6(src="fd00:1::5", dst="fd00:2::1", hlim=255) /
        ICMPv6ND_NS(tgt="fd00:2::1"))
    add("nd6_ns_to_blocked", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7", hlim=255) /
        ICMPv6ND_NS(tgt="fd00:9::7"))
    add("nd6_ns_to_gateway", eth() / IPv6(src=PEER6, dst=GW6, hlim=255) / ICMPv6ND_NS(tgt=GW6))
    add("nd6_ns_to_gateway_hlim64", eth() / IPv6(src=PEER6, dst=GW6, hlim=64) / ICMPv6ND_NS(tgt=GW6))

    # plaintext, protected side
    add("plain4_protect_tcp", eth() / IP(src="10.1.0.5", dst="10.2.0.7") / tcp())
    # ... to another station's MAC (a promiscuous NIC, a switch flooding), to a multicast MAC,
    # to the second MAC the interface takes (a macvlan's, see test_xdp.cpp's kUpperMac)
    other = dict(src=MACS["src"], dst="02:00:00:00:00:77")
    add("plain4_protect_other_mac", Ether(**other) / IP(src="10.1.0.5", dst="10.2.0.7") / tcp())
    add("plain4_protect_multicast_mac", Ether(src=MACS["src"], dst="01:00:5e:00:00:01") /
        IP(src="10.1.0.5", dst="10.2.0.7") / tcp())
    # to a unicast address in a multicast or broadcast frame; to a group address in one
    bcast = dict(src=MACS["src"], dst="ff:ff:ff:ff:ff:ff")
    add("plain6_protect_multicast_mac", Ether(src=MACS["src"], dst="33:33:00:00:00:01") /
        IPv6(src="fd00:1::5", dst="fd00:2::7") / udp())
    add("plain4_protect_vlan_broadcast_mac", Ether(**bcast) / Dot1Q(vlan=10) /
        IP(src="10.1.0.5", dst="10.2.0.7") / udp())
    add("plain4_mcast_protect", Ether(src=MACS["src"], dst="01:00:5e:01:02:03") /
        IP(src="10.1.0.5", dst="239.1.2.3") / udp())
    add("esp4_known_broadcast_mac", Ether(**bcast) / IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("esp4_dir_in_host_broadcast_mac", Ether(**bcast) / IP(src="10.2.0.7", dst=HOST4) /
        esp(SA_IN_HOST4))
    add("plain4_protect_upper_mac", Ether(src=MACS["src"], dst="02:00:00:00:00:03") /
        IP(src="10.1.0.5", dst="10.2.0.7") / tcp())
    add("plain4_unmatched_other_mac", Ether(**other) / IP(src="10.9.0.1", dst="8.8.8.8") / udp())
    add("esp4_known_other_mac", Ether(**other) / IP(src=PEER4, dst=GW4) / esp(SA_RAW4))
    add("ike4_500_other_mac", Ether(**other) / IP(src=PEER4, dst=GW4) / UDP(sport=500, dport=500) /
        Raw(b"\x11" * 28))
    add("plain4_protect_ip_options", eth() / IP(src="10.1.0.5", dst="10.2.0.7",
        options=[IPOption_Router_Alert()]) / tcp())
    add("plain4_protect_vlan_udp", eth() / Dot1Q(vlan=10) / IP(src="10.1.0.5", dst="10.2.0.7") / udp())
    # tun mode sends UDP to the local link with its hop taken, when it fits the link's MTU
    add("plain4_protect_udp", eth() / IP(src="10.1.0.5", dst="10.2.0.7", ttl=64) / udp())
    add("plain4_protect_udp_ttl1", eth() / IP(src="10.1.0.5", dst="10.2.0.7", ttl=1) / udp())
    add("plain4_protect_udp_1500", eth() / IP(src="10.1.0.5", dst="10.2.0.7") /
        UDP(sport=40000, dport=9999) / Raw(b"x" * (1500 - 28)))
    add("plain4_protect_udp_1501", eth() / IP(src="10.1.0.5", dst="10.2.0.7") /
        UDP(sport=40000, dport=9999) / Raw(b"x" * (1501 - 28)))
    add("plain6_protect_udp", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7", hlim=64) / udp())
    add("plain6_protect_udp_hlim1", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7", hlim=1) / udp())
    add("plain4_protect_qinq", eth() / Dot1AD(vlan=5) / Dot1Q(vlan=10) / IP(src="10.1.0.5", dst="10.2.0.7") / udp())
    add("plain4_bypass_ssh", eth() / IP(src="10.1.0.5", dst="10.2.0.7") / tcp(22))
    add("plain4_block", eth() / IP(src="10.1.0.5", dst="203.0.113.9") / udp())
    add("plain4_unmatched", eth() / IP(src="10.9.0.1", dst="8.8.8.8") / udp())
    add("plain4_to_gateway", eth() / IP(src="10.1.0.5", dst=GW4) / tcp(22))
    add("plain4_to_gw_subnet", eth() / IP(src="10.1.0.5", dst="192.0.2.9") / tcp(22))
    add("plain4_udp53_protect", eth() / IP(src="10.1.0.5", dst="10.3.0.7") / udp(53))
    add("plain4_udp54_bypass", eth() / IP(src="10.1.0.5", dst="10.3.0.7") / udp(54))
    add("plain4_udp_short_l4", cut(eth() / IP(src="10.1.0.5", dst="10.3.0.7", len=22) / udp(53), 14 + 22))
    add("plain4_tcp_short_l4", cut(eth() / IP(src="10.1.0.5", dst="10.3.0.7", len=22) / tcp(53), 14 + 22))
    add("plain4_len_beyond_frame", with_ip_len(eth() / IP(src="10.1.0.5", dst="10.2.0.7") / udp(), 400))
    add("plain4_fragment_protect", eth() / IP(src="10.1.0.5", dst="10.2.0.7", flags="MF", id=9) / udp())
    add("plain4_fragment_unsure", eth() / IP(src="10.1.0.5", dst="10.3.0.7", frag=64, id=9, proto=17) / Raw(b"x" * 24))
    add("plain4_fragment_block", eth() / IP(src="10.1.0.5", dst="203.0.113.9", frag=64, id=9, proto=17) / Raw(b"x" * 24))
    add("plain4_fragment_unmatched", eth() / IP(src="10.9.0.1", dst="8.8.8.8", flags="MF", id=9) / udp())
    add("plain6_protect_tcp", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7") / tcp())
    add("plain6_protect_ext_headers", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7") /
        IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / tcp())
    add("plain6_fragment_protect", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7") /
        IPv6ExtHdrFragment(m=1, id=9) / udp())
    add("plain6_unmatched", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7") / tcp())
    # behind a Fragment header: more extension headers, then the protocol (or no way to know it)
    add("plain6_frag_destopt_icmp", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7") /
        IPv6ExtHdrFragment(m=1, id=9) / IPv6ExtHdrDestOpt() / ICMPv6EchoRequest())
    add("plain6_frag_destopt_protect", eth() / IPv6(src="fd00:1::5", dst="fd00:2::7") /
        IPv6ExtHdrFragment(m=1, id=9) / IPv6ExtHdrDestOpt() / tcp())
    add("plain6_frag_later_destopt", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7") /
        IPv6ExtHdrFragment(offset=3, m=1, id=9, nh=60) / Raw(b"x" * 24))
    add("plain6_frag_chain_cut", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7") /
        IPv6ExtHdrFragment(m=1, id=9, nh=60) / Raw(bytes([58, 5]) + b"\0" * 6))
    # the options header whole in the frame, but past the datagram's length (padding after it)
    add("plain6_frag_chain_padded", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7", nh=44, plen=16) /
        Raw(struct.pack("!BBHI", 60, 0, 1, 9) + bytes([58, 3]) + b"\0" * 30))
    add("plain6_frag_chain_padded_from_remote", eth() /
        IPv6(src="fd00:2::7", dst="fd00:1::5", nh=44, plen=16) /
        Raw(struct.pack("!BBHI", 60, 0, 1, 9) + bytes([6, 3]) + b"\0" * 30))
    add("plain6_frag_later_udp", eth() / IPv6(src="fd00:1::5", dst="fd00:9::7") /
        IPv6ExtHdrFragment(offset=3, m=1, id=9, nh=17) / Raw(b"x" * 24))
    # DCCP has ports, and policies may name them (RFC 4340 5.1: they come first, as UDP's)
    add("plain4_dccp_protect", eth() / IP(src="10.1.0.5", dst="10.4.0.7", proto=33) /
        Raw(struct.pack("!HH", 40000, 5000) + b"\0" * 12))
    add("plain4_dccp_other_port", eth() / IP(src="10.1.0.5", dst="10.4.0.7", proto=33) /
        Raw(struct.pack("!HH", 40000, 5001) + b"\0" * 12))

    # plaintext arriving on the public side
    add("plain4_from_remote", eth() / IP(src="10.2.0.7", dst="10.1.0.5") / tcp())
    add("plain4_from_remote_blocked_net", eth() / IP(src="10.2.9.4", dst="10.1.0.5") / tcp())
    add("plain6_from_remote", eth() / IPv6(src="fd00:2::7", dst="fd00:1::5") / tcp())
    add("plain4_from_remote_fragment", eth() / IP(src="10.2.0.7", dst="10.1.0.5", frag=64, id=9, proto=17) /
        Raw(b"x" * 24))
    add("plain4_tcp_to_gateway", eth() / IP(src=PEER4, dst=GW4) / tcp(22))
    add("plain4_bcast_from_remote", eth() / IP(src="10.2.0.7", dst="255.255.255.255") / udp())
    add("plain6_mcast_from_remote", eth() / IPv6(src="fd00:2::7", dst="ff05::1:3") / udp())
    add("plain4_public_unmatched", eth() / IP(src=PEER4, dst="10.9.0.1") / tcp())

    # ICMP too-big from a router, quoting a host's ESP (transport mode) or something else
    host_esp4 = IP(src="10.1.0.5", dst="10.2.0.7", flags="DF", len=1500) / esp(0x5000)
    host_esp6 = IPv6(src="fd00:1::5", dst="fd00:2::7", plen=1460) / esp(0x6000)
    add("too_big4_for_host", eth() / IP(src=ROUTER4, dst="10.1.0.5") /
        ICMP(type=3, code=4, nexthopmtu=1300) / host_esp4)
    add("too_big4_for_host_broadcast_mac", Ether(src=MACS["src"], dst="ff:ff:ff:ff:ff:ff") /
        IP(src=ROUTER4, dst="10.1.0.5") / ICMP(type=3, code=4, nexthopmtu=1300) / host_esp4)
    add("too_big4_natt_for_host", eth() / IP(src=ROUTER4, dst="10.1.0.5") /
        ICMP(type=3, code=4, nexthopmtu=1300) /
        IP(src="10.1.0.5", dst="10.2.0.7", flags="DF", len=1500) /
        UDP(sport=4500, dport=4500) / esp(0x5000))
    add("too_big4_quotes_tcp", eth() / IP(src=ROUTER4, dst="10.1.0.5") /
        ICMP(type=3, code=4, nexthopmtu=1300) /
        IP(src="10.1.0.5", dst="10.2.0.7", flags="DF") / tcp())
    add("too_big4_port_unreachable", eth() / IP(src=ROUTER4, dst="10.1.0.5") /
        ICMP(type=3, code=3) / host_esp4)
    add("too_big4_to_gateway", eth() / IP(src=ROUTER4, dst="10.1.0.1") /
        ICMP(type=3, code=4, nexthopmtu=1300) /
        IP(src="10.1.0.1", dst="10.2.0.7", flags="DF", len=1500) / esp(0x5000))
    add("too_big4_from_protected_net", eth() / IP(src="10.2.0.9", dst="10.1.0.5") /
        ICMP(type=3, code=4, nexthopmtu=1300) / host_esp4)
    add("too_big4_cut_short", eth() / IP(src=ROUTER4, dst="10.1.0.5") /
        ICMP(type=3, code=4, nexthopmtu=1300) / Raw(raw(host_esp4)[:9]))   # no protocol byte
    add("too_big6_for_host", eth() / IPv6(src=ROUTER6, dst="fd00:1::5") /
        ICMPv6PacketTooBig(mtu=1400) / host_esp6)
    return f


def main():
    out = sys.argv[1]
    fx = fixtures()
    names = [n for n, _ in fx]
    assert len(names) == len(set(names)), "duplicate fixture name"
    lines = ["// Generated by tests/bpf/make_fixtures.py. Do not edit.", "#pragma once",
             "#include <cstddef>", "#include <cstdint>", "",
             "struct XdpFixturePacket {", "    const char *name;", "    const uint8_t *data;",
             "    size_t len;", "};", ""]
    for i, (name, b) in enumerate(fx):
        body = ",".join("0x%02x" % x for x in b)
        lines.append("static const uint8_t kXdpPkt%d[] = {%s}; // %s" % (i, body, name))
    lines.append("")
    lines.append("static const XdpFixturePacket kXdpFixturePackets[] = {")
    for i, (name, _) in enumerate(fx):
        lines.append('    {"%s", kXdpPkt%d, sizeof kXdpPkt%d},' % (name, i, i))
    lines.append("};")
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
