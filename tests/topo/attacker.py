#!/usr/bin/python3
"""The attacker of test_attacks.sh: scapy on the wire between the gateways, or on a host.

Usage:
  attacker.py capture --iface IF --src ADDR --spi SPI --count N --out PCAP [--timeout S]
                      [--ready FILE]
      keeps the first N ESP frames from ADDR with SPI seen on IF (the gateway's own output);
      makes FILE once it captures
  attacker.py replay --iface IF --mac MAC --pcap PCAP
      sends those frames back out of IF to MAC, unchanged but for the Ethernet header
  attacker.py forge --iface IF --mac MAC --src ADDR --dst ADDR --spi SPI --key HEX
                    --seq N --inner-src ADDR --inner-dst ADDR --marker TEXT --count N [--ttl N]
      AES-GCM tunnel-mode ESP of the given SA (the `ip xfrm` key: cipher key and salt), whose
      inner packets (IPv4 or IPv6, as the inner addresses are) are UDP to port 5300 carrying
      TEXT, sequence numbers from N
  attacker.py inject --iface IF --mac MAC --src ADDR --dst ADDR --marker TEXT --count N
      plaintext UDP to port 5300 carrying TEXT, to MAC
  attacker.py exceptions --dst ADDR --marker TEXT
      from this host to ADDR, each carrying TEXT: UDP/4500 behind the non-ESP marker (IKE),
      UDP/500 (IKE), UDP/4500 ESP of an SPI nobody owns, raw ESP of the same (5 packets)
"""
import argparse
import sys

from scapy.all import ESP, IP, IPv6, UDP, Ether, Raw, conf, rdpcap, send, sendp, sniff, wrpcap
from scapy.layers.ipsec import SecurityAssociation

conf.verb = 0
FOREIGN_SPI = 0x9999


def capture(a):
    spi = int(a.spi, 0)
    keep = lambda p: ESP in p and p[IP].src == a.src and p[ESP].spi == spi
    ready = lambda: a.ready and open(a.ready, "w").close()
    got = sniff(iface=a.iface, lfilter=keep, count=a.count, timeout=a.timeout,
                started_callback=ready)
    wrpcap(a.out, got)
    print(len(got))
    return 0 if len(got) == a.count else 1


def replay(a):
    frames = rdpcap(a.pcap)
    for f in frames:
        sendp(Ether(dst=a.mac) / f[IP], iface=a.iface)
    print(len(frames))
    return 0


def forge(a):
    sa = SecurityAssociation(ESP, spi=int(a.spi, 0), crypt_algo="AES-GCM",
                             crypt_key=bytes.fromhex(a.key.removeprefix("0x")),
                             tunnel_header=IP(src=a.src, dst=a.dst))
    for i in range(a.count):
        l3 = IPv6 if ":" in a.inner_dst else IP
        hdr = l3(src=a.inner_src, dst=a.inner_dst)
        if a.ttl is not None:
            hdr[l3].setfieldval("hlim" if l3 is IPv6 else "ttl", a.ttl)
        inner = hdr / UDP(sport=5301, dport=5300) / \
            Raw(a.marker.encode() + b" %d" % i)
        sendp(Ether(dst=a.mac) / sa.encrypt(inner, seq_num=a.seq + i), iface=a.iface)
    print(a.count)
    return 0


def inject(a):
    for i in range(a.count):
        sendp(Ether(dst=a.mac) / IP(src=a.src, dst=a.dst) / UDP(sport=5301, dport=5300) /
              Raw(a.marker.encode() + b" %d" % i), iface=a.iface)
    print(a.count)
    return 0


def exceptions(a):
    m = a.marker.encode()
    spi = FOREIGN_SPI.to_bytes(4, "big")
    pkts = [
        IP(dst=a.dst) / UDP(sport=4500, dport=4500) / Raw(b"\0\0\0\0" + m),
        IP(dst=a.dst) / UDP(sport=500, dport=500) / Raw(m),
        IP(dst=a.dst) / UDP(sport=4500, dport=4500) / Raw(spi + b"\0\0\0\1" + m),
        IP(dst=a.dst, proto=50) / Raw(spi + b"\0\0\0\1" + m),
        IP(dst=a.dst, proto=50, flags="MF", id=77) / Raw(spi + b"\0\0\0\2" + m),
    ]
    for p in pkts:
        send(p)
    print(len(pkts))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--iface", required=True)
    c.add_argument("--src", required=True)
    c.add_argument("--spi", required=True)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--timeout", type=float, default=20)
    c.add_argument("--ready", help="a file made once the capture runs")
    r = sub.add_parser("replay")
    r.add_argument("--iface", required=True)
    r.add_argument("--mac", required=True)
    r.add_argument("--pcap", required=True)
    f = sub.add_parser("forge")
    for o in ("iface", "mac", "src", "dst", "spi", "key", "inner-src", "inner-dst", "marker"):
        f.add_argument("--" + o, required=True)
    f.add_argument("--seq", type=int, required=True)
    f.add_argument("--count", type=int, required=True)
    f.add_argument("--ttl", type=int, help="the inner TTL or hop limit (scapy's default 64)")
    i = sub.add_parser("inject")
    for o in ("iface", "mac", "src", "dst", "marker"):
        i.add_argument("--" + o, required=True)
    i.add_argument("--count", type=int, required=True)
    e = sub.add_parser("exceptions")
    e.add_argument("--dst", required=True)
    e.add_argument("--marker", required=True)
    a = ap.parse_args()
    return {"capture": capture, "replay": replay, "forge": forge, "inject": inject,
            "exceptions": exceptions}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
