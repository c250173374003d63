"""Fragments made by userspace/esp/fragment.h, checked by scapy (run by test_fragment.sh).

    scapy: plain IPv4/IPv6 --+
                             +--> in.pcap --[fragment_tool MTU]--> out.pcap --> scapy
    xesp pcap: ESP ----------+

For every packet and MTU (one output line each):
  - a packet that fits comes back as it was, one that may not be fragmented (IPv4 with DF, an
    MTU below the family's minimum) is refused;
  - otherwise every fragment is at most MTU bytes, and, but for the last, within 8 bytes of
    it and carrying a multiple of 8; scapy parses it, its lengths and (IPv4) the checksum
    scapy computes are right; offsets follow on, MF/M is set on all but the last, the IPv4
    Identification is the packet's and the IPv6 one the driver's; the IPv6 Fragment header
    sits behind hop-by-hop and routing headers but in front of destination options that
    follow the last routing header (RFC 8200 4.5); later IPv4 fragments carry only the
    options with the copied flag (RFC 791 3.1);
  - scapy's defragment (IPv4) or defragment6 (IPv6) gives back the packet byte for byte;
  - the ESP packets are xesp's own output (`xesp pcap`, outbound SA, every layout of
    esp_cases.py with and without NAT-T): after reassembly scapy decrypts them to the
    plaintext that went in. IPv6 inside IPv4 leaves xesp with DF set: refused.

Usage: check_fragment.py XESP FRAGMENT_TOOL WORK_DIR
Prints one line a case, then `N passed, M failed`; exits 1 if any failed.
"""

import os
import struct
import subprocess
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import esp_cases as ec  # noqa: E402
import run_interop  # noqa: E402
from scapy.layers.inet import IP, UDP, IPOption_Router_Alert, IPOption_Timestamp  # noqa: E402
from scapy.layers.inet import defragment  # noqa: E402
from scapy.layers.inet6 import (IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,  # noqa: E402
                                IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, defragment6)
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.packet import Raw  # noqa: E402

IDENT_BASE = 0x7E570000
WHOLE, REFUSED, SPLIT = "whole", "refused", "split"


@dataclass
class Packet:
    name: str
    ip: bytes                   # the IP packet
    mtu: int
    expect: str
    before_frag: type = IPv6    # IPv6: the layer the Fragment header must follow
    esp_case: object = None     # ESP from xesp: the esp_cases.Case, and the plaintext
    inner: bytes = b""


def pattern(n):
    return bytes((i * 7 + 3) & 0xFF for i in range(n))


def udp4(size, flags=0, options=None):
    hdr = IP(src="192.0.2.1", dst="192.0.2.2", id=0x4242, flags=flags, options=options or [])
    hl = len(hdr)
    return bytes(hdr / UDP(sport=1000, dport=2000) / Raw(pattern(size - hl - 8)))


def udp6(size, *exts):
    hdr = IPv6(src="2001:db8::1", dst="2001:db8::2")
    for e in exts:
        hdr = hdr / e
    return bytes(hdr / UDP(sport=1000, dport=2000) / Raw(pattern(size - len(hdr) - 8)))


def plain_packets():
    ra_ts = [IPOption_Router_Alert(), IPOption_Timestamp(flg=0)]
    hbh, dst = IPv6ExtHdrHopByHop(), IPv6ExtHdrDestOpt()
    rt = IPv6ExtHdrRouting(addresses=["2001:db8::3"])
    return [
        Packet("v4 1500 fits 1500", udp4(1500), 1500, WHOLE),
        Packet("v4 1501 at 1500", udp4(1501), 1500, SPLIT),
        Packet("v4 2981 at 1500", udp4(2981), 1500, SPLIT),
        Packet("v4 DF 2000 at 1500", udp4(2000, flags="DF"), 1500, REFUSED),
        Packet("v4 1281 at 1280", udp4(1281), 1280, SPLIT),
        Packet("v4 3000 at 1280", udp4(3000), 1280, SPLIT),
        Packet("v4 577 at 576", udp4(577), 576, SPLIT),
        Packet("v4 1500 at 576", udp4(1500), 576, SPLIT),
        Packet("v4 router alert + timestamp 1500 at 576", udp4(1500, options=ra_ts), 576, SPLIT),
        Packet("v4 300 at 68", udp4(300), 68, SPLIT),
        Packet("v4 300 at 67", udp4(300), 67, REFUSED),
        Packet("v6 1280 fits 1280", udp6(1280), 1280, WHOLE),
        Packet("v6 1281 at 1280", udp6(1281), 1280, SPLIT),
        Packet("v6 2505 at 1280", udp6(2505), 1280, SPLIT),
        Packet("v6 3000 at 1500", udp6(3000), 1500, SPLIT),
        Packet("v6 2000 at 576", udp6(2000), 576, REFUSED),
        Packet("v6 hop-by-hop 3000 at 1280", udp6(3000, hbh), 1280, SPLIT, IPv6ExtHdrHopByHop),
        Packet("v6 destination options 3000 at 1280", udp6(3000, dst), 1280, SPLIT, IPv6),
        Packet("v6 hbh, dest opts, routing, dest opts 3000 at 1280",
               udp6(3000, hbh, dst, rt, IPv6ExtHdrDestOpt()), 1280, SPLIT, IPv6ExtHdrRouting),
    ]


def inner_for(case):
    """A 3000-byte UDP packet the outbound policy of the case covers; IPv4 without DF."""
    src, dst = case.inner_addrs("out")
    if case.inner == 4:
        hdr = IP(src=src, dst=dst, id=0x1234, flags=0)
    else:
        hdr = IPv6(src=src, dst=dst)
    return bytes(hdr / UDP(sport=1000, dport=2000) / Raw(pattern(3000 - len(hdr) - 8)))


def esp_packets(xesp, work):
    """ESP from `xesp pcap` for each layout, with and without NAT-T, one transform."""
    cases, _ = ec.build_matrix()
    cases = [c for c in cases if c.xf is ec.TRANSFORMS[0] and not c.esn and
             c.linktype == ec.LINKTYPE_ETHERNET]
    x = run_interop.Xesp(xesp, work, keep=True, verbose=False)
    out = []
    for case in cases:
        inner = inner_for(case)
        frames, _ = x.run(case, "esp", "openssl", ec.conf_text(case, "out"),
                          [ec.frame(case, inner, "out")])
        if len(frames) != 1:
            raise SystemExit(f"xesp pcap wrote {len(frames)} frames for {case.name}")
        esp = frames[0][ec.l3_offset(case.linktype):]
        v6_in_v4 = case.outer == 4 and case.inner == 6
        for mtu in ((1280, 576) if case.outer == 4 else (1280, 1500)):
            out.append(Packet(f"ESP {case.name} at {mtu}", esp, mtu,
                              REFUSED if v6_in_v4 else SPLIT, esp_case=case, inner=inner))
    return out


def eth_frame(ip):
    ethertype = ec.ETH_IPV4 if ip[0] >> 4 == 4 else ec.ETH_IPV6
    return ec.REMOTE_MAC + ec.LOCAL_MAC + struct.pack("!H", ethertype) + ip


def run_tool(tool, work, mtu, pkts):
    """fragment_tool over pkts at mtu: the list of frames written for each packet."""
    stem = os.path.join(work, f"frag-{mtu}")
    ec.write_pcap(stem + "-in.pcap", [eth_frame(p.ip) for p in pkts], ec.LINKTYPE_ETHERNET)
    r = subprocess.run([tool, stem + "-in.pcap", stem + "-out.pcap", str(mtu), str(IDENT_BASE)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"fragment_tool exited {r.returncode}: {r.stderr.strip()}")
    counts = [int(line) for line in r.stdout.split()]
    _, frames = ec.read_pcap(stem + "-out.pcap")
    if len(counts) != len(pkts) or sum(counts) != len(frames):
        raise SystemExit(f"fragment_tool: {len(counts)} counts for {len(pkts)} packets, "
                         f"{sum(counts)} fragments for {len(frames)} frames written")
    groups, at = [], 0
    for n in counts:
        groups.append(frames[at:at + n])
        at += n
    return groups


def scapy_checksum_ok(ip_bytes):
    """The checksum scapy computes for the header, compared with the one on the wire."""
    pkt = IP(ip_bytes)
    want = pkt.chksum
    del pkt.chksum
    return IP(bytes(pkt)).chksum == want


def copied_options(ip_bytes):
    """RFC 791 3.1: the options a later fragment carries, padded to 4 bytes."""
    opts, out, i = ip_bytes[20:ec.ip_header_len(ip_bytes)], b"", 0
    while i < len(opts) and opts[i] != 0:
        if opts[i] == 1:
            i += 1
            continue
        if opts[i] & 0x80:
            out += opts[i:i + opts[i + 1]]
        i += opts[i + 1]
    return out + bytes(-len(out) % 4)


def check_v4_fragment(p, k, ip, last, at, problems):
    """One IPv4 fragment; returns the bytes of data it carries."""
    pkt = IP(ip)
    hl = pkt.ihl * 4
    if not scapy_checksum_ok(ip) or not ec.ipv4_checksum_ok(ip):
        problems.append(f"fragment {k}: bad header checksum")
    if pkt.len != len(ip):
        problems.append(f"fragment {k}: total length {pkt.len}, {len(ip)} bytes")
    if pkt.id != IP(p.ip).id or pkt.flags.DF:
        problems.append(f"fragment {k}: id 0x{pkt.id:04x} flags {pkt.flags}")
    if bool(pkt.flags.MF) == last:
        problems.append(f"fragment {k}: MF {pkt.flags.MF}, last {last}")
    if pkt.frag * 8 != at:
        problems.append(f"fragment {k}: offset {pkt.frag * 8}, expected {at}")
    want_opts = p.ip[20:ec.ip_header_len(p.ip)] if k == 0 else copied_options(p.ip)
    if ip[20:hl] != want_opts:
        problems.append(f"fragment {k}: options {ip[20:hl].hex()}, expected {want_opts.hex()}")
    return len(ip) - hl


def check_v6_fragment(p, k, ip, last, at, ident, problems):
    """One IPv6 fragment; returns the bytes of data it carries."""
    pkt = IPv6(ip)
    if pkt.plen != len(ip) - 40:
        problems.append(f"fragment {k}: payload length {pkt.plen}, {len(ip)} bytes")
    if IPv6ExtHdrFragment not in pkt:
        problems.append(f"fragment {k}: no Fragment header")
        return 0
    fh = pkt[IPv6ExtHdrFragment]
    if type(fh.underlayer) is not p.before_frag:
        problems.append(f"fragment {k}: Fragment header behind {type(fh.underlayer).__name__},"
                        f" expected behind {p.before_frag.__name__}")
    if fh.id != ident or fh.res1 or fh.res2:
        problems.append(f"fragment {k}: id 0x{fh.id:08x}, expected 0x{ident:08x}")
    if bool(fh.m) == last:
        problems.append(f"fragment {k}: M {fh.m}, last {last}")
    if fh.offset * 8 != at:
        problems.append(f"fragment {k}: offset {fh.offset * 8}, expected {at}")
    return len(bytes(fh.payload))


def check_split(p, frames, ident):
    problems = []
    v4 = p.ip[0] >> 4 == 4
    if len(frames) < 2:
        return [f"{len(frames)} fragments, expected 2 or more"]
    at, ips = 0, []
    for k, fr in enumerate(frames):
        last = k == len(frames) - 1
        eth, ip = Ether(fr), fr[14:]
        if eth.type != (ec.ETH_IPV4 if v4 else ec.ETH_IPV6):
            problems.append(f"fragment {k}: ethertype 0x{eth.type:04x}")
        if len(ip) > p.mtu or (not last and len(ip) <= p.mtu - 8):
            problems.append(f"fragment {k}: {len(ip)} bytes for MTU {p.mtu}")
        if v4:
            data = check_v4_fragment(p, k, ip, last, at, problems)
        else:
            data = check_v6_fragment(p, k, ip, last, at, ident, problems)
        if not last and data % 8:
            problems.append(f"fragment {k}: {data} bytes of data, not a multiple of 8")
        at += data
        ips.append(IP(ip) if v4 else IPv6(ip))
    whole = defragment(ips) if v4 else [defragment6(ips)]
    if len(whole) != 1 or bytes(whole[0]) != p.ip:
        problems.append("scapy's reassembly differs from the packet")
    elif p.esp_case is not None:
        back = ec.open_esp(p.esp_case, "out", bytes(whole[0]))
        if back != p.inner:
            problems.append("the reassembled ESP does not decrypt to the plaintext")
    return problems


def check(p, frames, ident):
    if p.expect == REFUSED:
        return [] if not frames else [f"{len(frames)} fragments, expected a refusal"]
    if p.expect == WHOLE:
        if len(frames) != 1 or frames[0][14:] != p.ip:
            return [f"{len(frames)} frames, expected the packet as it was"]
        return []
    return check_split(p, frames, ident)


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    xesp, tool, work = sys.argv[1:]
    pkts = plain_packets() + esp_packets(xesp, work)
    passed = failed = 0
    for mtu in sorted({p.mtu for p in pkts}):
        group = [p for p in pkts if p.mtu == mtu]
        for i, (p, frames) in enumerate(zip(group, run_tool(tool, work, mtu, group))):
            try:
                problems = check(p, frames, IDENT_BASE + i)
            except Exception as e:  # noqa: BLE001
                problems = [f"{type(e).__name__}: {e}"]
            ok = not problems
            passed, failed = passed + ok, failed + (not ok)
            print(("ok   " if ok else "FAIL ") + p.name)
            for problem in problems:
                print("       " + problem)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
