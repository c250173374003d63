#!/usr/bin/python3
"""Sends, from a wire, what a router between the gateways sends when an ESP packet is too big
for its next link: ICMP "fragmentation needed" (IPv4, RFC 792/1191) or ICMPv6 "packet too big"
(RFC 4443), to the packet's source (a gateway; in transport mode a host), quoting its outer
header and ESP header.
scapy builds the message, independently of the gateway's parser.

usage: icmp_report.py --iface DEV --mac MAC --router ADDR --src ADDR --dst ADDR
                      --spi N --seq N --mtu N [--natt]
src/dst are the quoted (ESP) packet's addresses: src is where the report goes.
"""
import argparse
import ipaddress

from scapy.all import ESP, ICMP, IP, UDP, Ether, ICMPv6PacketTooBig, IPv6, Raw, sendp


def main():
    ap = argparse.ArgumentParser()
    for opt in ("--iface", "--mac", "--router", "--src", "--dst"):
        ap.add_argument(opt, required=True)
    for opt in ("--spi", "--seq", "--mtu"):
        ap.add_argument(opt, required=True, type=lambda s: int(s, 0))
    ap.add_argument("--natt", action="store_true")
    a = ap.parse_args()

    esp = ESP(spi=a.spi, seq=a.seq) / Raw(b"\x00" * 32)
    if a.natt:
        esp = UDP(sport=4500, dport=4500, chksum=0) / esp
    if ipaddress.ip_address(a.src).version == 4:
        quoted = IP(src=a.src, dst=a.dst, flags="DF", len=1500) / esp
        msg = IP(src=a.router, dst=a.src) / ICMP(type=3, code=4, nexthopmtu=a.mtu) / quoted
    else:
        quoted = IPv6(src=a.src, dst=a.dst, plen=1460) / esp
        msg = IPv6(src=a.router, dst=a.src) / ICMPv6PacketTooBig(mtu=a.mtu) / quoted
    sendp(Ether(dst=a.mac) / msg, iface=a.iface, verbose=False)


if __name__ == "__main__":
    main()
