#!/usr/bin/python3
"""ICMP echo over a raw socket, IPv4 or IPv6, for machines without iputils ping.

Usage: ping.py [-c COUNT] [-i INTERVAL] [-W TIMEOUT] [-s SIZE] ADDRESS
Sends COUNT echo requests INTERVAL seconds apart, waits up to TIMEOUT seconds for each reply,
prints one summary line and exits 0 only when every request got its reply (1 otherwise, 2 on
a usage or socket error). Needs root (raw socket). Run it inside a namespace with
`ip netns exec NS /usr/bin/python3 ping.py ...` or `tools/xesp-topo exec NODE ...`.
"""
import argparse
import ipaddress
import os
import select
import socket
import struct
import sys
import time


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def echo_request(v6: bool, ident: int, seq: int, payload: bytes) -> bytes:
    # ICMPv6 checksums cover a pseudo-header: the kernel fills them in for raw ICMPv6 sockets.
    typ = 128 if v6 else 8
    hdr = struct.pack("!BBHHH", typ, 0, 0, ident, seq)
    if v6:
        return hdr + payload
    return struct.pack("!BBHHH", typ, 0, checksum(hdr + payload), ident, seq) + payload


def parse_reply(v6: bool, data: bytes):
    """Returns (ident, seq) of an echo reply, or None."""
    if not v6:
        data = data[(data[0] & 0x0F) * 4:]  # raw IPv4 sockets hand over the IP header too
    if len(data) < 8 or data[0] != (129 if v6 else 0):
        return None
    _, _, _, ident, seq = struct.unpack("!BBHHH", data[:8])
    return ident, seq


def main() -> int:
    ap = argparse.ArgumentParser(description="ICMP echo over a raw socket")
    ap.add_argument("-c", "--count", type=int, default=3)
    ap.add_argument("-i", "--interval", type=float, default=0.2)
    ap.add_argument("-W", "--timeout", type=float, default=2.0)
    ap.add_argument("-s", "--size", type=int, default=56, help="payload bytes")
    ap.add_argument("address")
    args = ap.parse_args()

    try:
        addr = ipaddress.ip_address(args.address)
    except ValueError:
        print(f"ping.py: '{args.address}' is not an IP address", file=sys.stderr)
        return 2
    v6 = addr.version == 6
    try:
        if v6:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except PermissionError:
        print("ping.py: raw sockets need root; run it as root", file=sys.stderr)
        return 2

    ident = os.getpid() & 0xFFFF
    payload = bytes(i & 0xFF for i in range(args.size))
    dest = (str(addr), 0, 0, 0) if v6 else (str(addr), 0)
    got = 0
    rtts = []
    for seq in range(1, args.count + 1):
        if seq > 1:
            time.sleep(args.interval)
        sent = time.monotonic()
        try:
            sock.sendto(echo_request(v6, ident, seq, payload), dest)
        except OSError as e:
            print(f"ping.py: send to {addr}: {e.strerror}", file=sys.stderr)
            continue
        deadline = sent + args.timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            data, src = sock.recvfrom(65535)
            if ipaddress.ip_address(src[0].split("%")[0]) != addr:
                continue
            if parse_reply(v6, data) == (ident, seq):
                got += 1
                rtts.append((time.monotonic() - sent) * 1000)
                break
    avg = f", rtt avg {sum(rtts) / len(rtts):.3f} ms" if rtts else ""
    print(f"ping {addr}: {got}/{args.count} replies{avg}")
    return 0 if got == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
