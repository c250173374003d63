#!/usr/bin/python3
"""Counts the frames on an interface that match filters while a command runs.

Usage: wire_capture.py [--netns NS] --dev IF [--filter EXPR]... [--settle SEC] [--show]
                       [--esp-seq FILE] -- CMD...

Opens an AF_PACKET socket on IF (inside network namespace NS when given, the caller's own
otherwise) before CMD starts, runs CMD in the caller's namespace, keeps reading for SEC seconds
after it ends (default 0.2), then prints one count per --filter, one per line, in order. CMD's
stdout goes to stderr, so stdout holds only the counts. Exit status: CMD's, or 2 when the
capture itself fails. Frames in both directions are seen (received and sent by IF).

The plaintext test and the ESP tests use the same filters with opposite expectations:

  counts=$(wire_capture.py --netns "$NS_WIRE" --dev "$WIRE_IF" \
             --filter 'icmp host 10.1.0.2 host 10.2.0.2' --filter 'esp' \
             -- tools/xesp-topo exec hostA /usr/bin/python3 ping.py -c3 10.2.0.2)

A filter is a list of terms that must all hold (tcpdump-like, AND only):
  ip ip6 icmp icmp6 tcp udp esp    protocol; esp also matches ESP in UDP/4500 (RFC 3948)
  host ADDR  src ADDR  dst ADDR    outer IP addresses; 'host A host B' = between A and B
  port N  sport N  dport N         TCP/UDP ports
  spi N                            ESP SPI (decimal or 0x hex)
  frag                             an IP fragment, first or later (IPv4 MF or offset; IPv6
                                   Fragment header)
  contains TEXT                    TEXT's bytes appear anywhere in the frame (plaintext leaks)
  not TERM                         negates the next term
An empty filter counts every frame.

--esp-seq FILE writes one line per ESP frame (RFC 3948 ESP in UDP too): "SRC SPI SEQ", the
outer source address, the SPI and the sequence number in decimal, for tests that look for a
(SPI, sequence number) pair sent twice.

Where the receiving veth has GRO on, TCP segments arrive merged: count TCP by bytes or by
'contains', not by segments. Frames the socket could not keep up with are reported on stderr.
"""
import argparse
import ctypes
import ipaddress
import os
import socket
import struct
import subprocess
import sys
import threading
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6
CLONE_NEWNET = 0x40000000
PROTO_WORDS = {"ip", "ip6", "icmp", "icmp6", "tcp", "udp", "esp", "frag"}
ARG_WORDS = {"host", "src", "dst", "port", "sport", "dport", "spi", "contains"}
IPV6_EXT_HEADERS = {0, 43, 60, 135}  # hop-by-hop, routing, destination options, mobility


class Packet:
    """The outer headers of one Ethernet frame, decoded as far as the filters need."""

    def __init__(self, frame: bytes):
        self.frame = frame
        self.family = None
        self.src = self.dst = None
        self.proto = None
        self.sport = self.dport = None
        self.spi = None
        self.seq = None
        self.fragment = False
        off = 12
        ethertype = struct.unpack_from("!H", frame, off)[0] if len(frame) >= 14 else 0
        off = 14
        while ethertype in (0x8100, 0x88A8) and len(frame) >= off + 4:
            ethertype = struct.unpack_from("!H", frame, off + 2)[0]
            off += 4
        if ethertype == 0x0800 and len(frame) >= off + 20:
            self._ipv4(off)
        elif ethertype == 0x86DD and len(frame) >= off + 40:
            self._ipv6(off)

    def _ipv4(self, off):
        f = self.frame
        self.family = 4
        self.src = ipaddress.IPv4Address(f[off + 12:off + 16])
        self.dst = ipaddress.IPv4Address(f[off + 16:off + 20])
        self.proto = f[off + 9]
        flags = struct.unpack_from("!H", f, off + 6)[0]
        frag_offset = flags & 0x1FFF
        self.fragment = (flags & 0x3FFF) != 0      # MF or an offset
        if frag_offset == 0:
            self._l4(off + (f[off] & 0x0F) * 4)

    def _ipv6(self, off):
        f = self.frame
        self.family = 6
        self.src = ipaddress.IPv6Address(f[off + 8:off + 24])
        self.dst = ipaddress.IPv6Address(f[off + 24:off + 40])
        nh, off = f[off + 6], off + 40
        while nh in IPV6_EXT_HEADERS and len(f) >= off + 8:
            nh, off = f[off], off + (f[off + 1] + 1) * 8
        if nh == 44 and len(f) >= off + 8:  # fragment header: only the first fragment has L4
            self.fragment = True
            first = struct.unpack_from("!H", f, off + 2)[0] & 0xFFF8 == 0
            nh, off = f[off], off + 8
            if not first:
                self.proto = nh
                return
        self.proto = nh
        self._l4(off)

    def _l4(self, off):
        f = self.frame
        if self.proto in (6, 17) and len(f) >= off + 4:
            self.sport, self.dport = struct.unpack_from("!HH", f, off)
            # RFC 3948: ESP in UDP/4500, told apart from IKE by a non-zero first word.
            if self.proto == 17 and 4500 in (self.sport, self.dport) and len(f) >= off + 12:
                spi, seq = struct.unpack_from("!II", f, off + 8) if len(f) >= off + 16 else (
                    struct.unpack_from("!I", f, off + 8)[0], None)
                if spi != 0:
                    self.spi, self.seq = spi, seq
        elif self.proto == 50 and len(f) >= off + 4:
            self.spi = struct.unpack_from("!I", f, off)[0]
            if len(f) >= off + 8:
                self.seq = struct.unpack_from("!I", f, off + 4)[0]

    def has(self, word):
        if word == "ip":
            return self.family == 4
        if word == "ip6":
            return self.family == 6
        if word == "icmp":
            return self.family == 4 and self.proto == 1
        if word == "icmp6":
            return self.family == 6 and self.proto == 58
        if word == "tcp":
            return self.proto == 6
        if word == "udp":
            return self.proto == 17
        if word == "esp":
            return self.spi is not None
        if word == "frag":
            return self.fragment
        raise ValueError(word)


def compile_filter(expr: str):
    """Turns a filter string into a predicate over Packet."""
    words = expr.split()
    terms = []
    i = 0
    while i < len(words):
        negate = words[i] == "not"
        if negate:
            i += 1
        if i >= len(words):
            raise ValueError(f"filter '{expr}': 'not' needs a term after it")
        w = words[i]
        if w in PROTO_WORDS:
            test = (lambda w: lambda p: p.has(w))(w)
            i += 1
        elif w in ARG_WORDS:
            if i + 1 >= len(words):
                raise ValueError(f"filter '{expr}': '{w}' needs a value")
            test = arg_term(w, words[i + 1], expr)
            i += 2
        else:
            raise ValueError(f"filter '{expr}': unknown term '{w}'; "
                             f"known: not {' '.join(sorted(PROTO_WORDS | ARG_WORDS))}")
        terms.append((lambda t, n: lambda p: t(p) != n)(test, negate))
    return lambda p: all(t(p) for t in terms)


def arg_term(word, value, expr):
    try:
        if word in ("host", "src", "dst"):
            a = ipaddress.ip_address(value)
            return {"host": lambda p: a in (p.src, p.dst),
                    "src": lambda p: p.src == a,
                    "dst": lambda p: p.dst == a}[word]
        if word in ("port", "sport", "dport"):
            n = int(value, 0)
            return {"port": lambda p: n in (p.sport, p.dport),
                    "sport": lambda p: p.sport == n,
                    "dport": lambda p: p.dport == n}[word]
        if word == "spi":
            n = int(value, 0)
            return lambda p: p.spi == n
    except ValueError:
        raise ValueError(f"filter '{expr}': bad value '{value}' for '{word}'") from None
    text = value.encode()
    return lambda p: text in p.frame


def enter_netns(name):
    """Switches this thread to network namespace NAME; returns an fd of the one it left."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    path = name if "/" in name else f"/run/netns/{name}"
    target = os.open(path, os.O_RDONLY)
    if libc.setns(target, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns {path}")
    os.close(target)
    return own


def leave_netns(own):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(own, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns back")
    os.close(own)


def open_capture(dev):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE: root may exceed rmem_max
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    sock.bind((dev, 0))
    # Frames queued between socket() and bind() may come from any interface: drop them.
    sock.setblocking(False)
    try:
        while True:
            sock.recv(65535)
    except BlockingIOError:
        pass
    sock.settimeout(0.05)
    return sock


def reader(sock, filters, counts, stop, show, esp_out):
    while not stop.is_set():
        try:
            frame = sock.recv(65535)
        except socket.timeout:
            continue
        p = Packet(frame)
        if esp_out is not None and p.spi is not None and p.seq is not None:
            esp_out.write(f"{p.src} {p.spi} {p.seq}\n")
        for i, f in enumerate(filters):
            if f(p):
                counts[i] += 1
        if show:
            print(f"wire_capture: {len(frame)} B v{p.family} {p.src} -> {p.dst} proto {p.proto} "
                  f"ports {p.sport}/{p.dport} spi {p.spi}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--netns", help="network namespace (name in /run/netns or a path)")
    ap.add_argument("--dev", required=True, help="interface to capture on")
    ap.add_argument("--filter", action="append", default=None, help="filter; repeatable")
    ap.add_argument("--settle", type=float, default=0.2, help="seconds to read after CMD ends")
    ap.add_argument("--show", action="store_true", help="describe every frame on stderr")
    ap.add_argument("--esp-seq", help="write 'SRC SPI SEQ' of every ESP frame to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given after --")
    try:
        filters = [compile_filter(f) for f in (args.filter if args.filter is not None else [""])]
    except ValueError as e:
        print(f"wire_capture: {e}", file=sys.stderr)
        return 2

    try:
        own = enter_netns(args.netns) if args.netns else None
        try:
            sock = open_capture(args.dev)
        finally:
            if own is not None:
                leave_netns(own)
    except OSError as e:
        where = f" in netns {args.netns}" if args.netns else ""
        print(f"wire_capture: cannot capture on {args.dev}{where}: {e}; "
              "needs root and an existing interface", file=sys.stderr)
        return 2

    counts = [0] * len(filters)
    stop = threading.Event()
    esp_out = open(args.esp_seq, "w") if args.esp_seq else None
    t = threading.Thread(target=reader, args=(sock, filters, counts, stop, args.show, esp_out))
    t.start()
    try:
        rc = subprocess.call(cmd, stdout=sys.stderr)
    except OSError as e:
        print(f"wire_capture: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        rc = 2
    time.sleep(args.settle)
    stop.set()
    t.join()
    if esp_out is not None:
        esp_out.close()
    stats = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
    _, drops = struct.unpack("II", stats)
    if drops:
        print(f"wire_capture: {drops} frames dropped by the socket: counts are low", file=sys.stderr)
    for c in counts:
        print(c)
    return rc


if __name__ == "__main__":
    sys.exit(main())
