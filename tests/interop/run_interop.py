"""Interop of `xesp pcap` with scapy's ESP, over the case matrix of esp_cases.py.

For every case and crypto backend (one output line each), with xesp as the local gateway and
scapy as the remote peer:
  in      scapy encrypts the remote side's traffic; xesp (inbound SA and policy) must write
          the plaintext back, frame for frame, in order; plaintext no policy covers passes.
  out     xesp (outbound SA and policy) encrypts plaintext; every frame must carry the right
          link header, outer header (addresses, lengths, checksums, UDP 4500 for NAT-T), SPI
          and sequence number (replay-oseq + 1 on, ESN high half included), decrypt in scapy
          to the original, and for the AEADs (IV = sequence number) equal scapy's own
          encryption byte for byte; CBC/NULL padding is checked to be 1, 2, 3, ...
  neg     a flipped ciphertext byte and a flipped ICV byte (in-icv-fail), a duplicate
          (in-replay) and a packet left of the window (in-too-old) are dropped and counted,
          and a failed ICV does not use up its sequence number; ESP for an unknown SPI, IKE
          on UDP 4500 and a NAT keepalive pass unchanged.
  wrap    (non-ESN tunnel v4 cases) without ESN the outbound sequence number stops at
          2^32 - 1: later packets are dropped as out-seq-exhausted.
Extra lines for some cases:
  both-directions  inbound and outbound interleaved in one capture longer than one burst.
  plaintext-bypass plaintext that the inbound policy says must arrive protected is dropped
                   (RFC 4301 5.2) and counted under a policy drop.
  fragment-bypass  fragments of plaintext an outbound policy covers are encrypted or
                   dropped, never written in the clear.

Usage: run_interop.py XESP [--work DIR] [--only SUBSTRING ...] [--backend openssl|ipsecmb]
                           [--keep] [-v]
Prints one line per case and backend, then `N passed, M failed`; exits 1 if any failed.
"""

import argparse
import dataclasses
import ipaddress
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import esp_cases as ec  # noqa: E402
from scapy.layers.ipsec import IPSecIntegrityError  # noqa: E402

BACKENDS = ("openssl", "ipsecmb")
UNSUPPORTED = re.compile(r"not supported|does not implement|unsupported", re.I)
POLICY_DROPS = ("in-policy-block", "in-tmpl-mismatch", "in-unprotected", "in-no-state",
                "in-selector-mismatch")


class CaseFailure(Exception):
    pass


class Unsupported(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Running xesp


class Xesp:
    def __init__(self, path, work, keep, verbose):
        self.path, self.work, self.keep, self.verbose = path, work, keep, verbose
        self.runs = 0
        self.pending = []           # files of the job running now
        self.kept_failures = False

    def run(self, case, step, backend, conf, frames):
        """Run `xesp pcap` on `frames`; return (output frames, json report)."""
        self.runs += 1
        stem = os.path.join(self.work, f"{self.runs:05d}-{step}")
        conf_path, in_path, out_path = stem + ".conf", stem + "-in.pcap", stem + "-out.pcap"
        self.pending += [conf_path, in_path, out_path]
        with open(conf_path, "w") as f:
            f.write(conf)
        ec.write_pcap(in_path, frames, case.linktype)
        cmd = [self.path, "pcap", "-b", conf_path, "--in", in_path, "--out", out_path,
               "--json", "--crypto", backend]
        if self.verbose:
            print(f"     {case.name}: {' '.join(cmd)}", flush=True)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise CaseFailure(f"{step}: xesp did not finish in 60 s ({' '.join(cmd)})")
        except OSError as e:
            raise CaseFailure(f"{step}: cannot run {self.path}: {e}")
        err = p.stderr.strip().splitlines()
        if p.returncode != 0:
            msg = err[-1] if err else "(no message)"
            if UNSUPPORTED.search(p.stderr):
                raise Unsupported(msg.replace(f"xesp: {conf_path}: ", ""))
            raise CaseFailure(f"{step}: xesp exited {p.returncode}: {msg} [{conf_path}]")
        try:
            report = json.loads(p.stdout)
        except ValueError as e:
            raise CaseFailure(f"{step}: --json output is not JSON ({e}): {p.stdout[:200]!r}")
        try:
            linktype, out = ec.read_pcap(out_path)
        except (OSError, ValueError) as e:
            raise CaseFailure(f"{step}: cannot read the output capture: {e}")
        if linktype != case.linktype:
            raise CaseFailure(f"{step}: output link type {linktype}, input {case.linktype}")
        if report.get("frames_in") != len(frames):
            raise CaseFailure(f"{step}: frames_in {report.get('frames_in')}, "
                              f"the capture has {len(frames)}")
        if report.get("frames_out") != len(out):
            raise CaseFailure(f"{step}: frames_out {report.get('frames_out')}, "
                              f"the output capture has {len(out)}")
        if not isinstance(report.get("drops"), dict):
            raise CaseFailure(f"{step}: --json has no \"drops\" object")
        for sa in report.get("sas", []):
            if sa.get("crypto") not in (None, backend):
                raise CaseFailure(f"{step}: SA 0x{sa.get('spi', 0):08x} runs on "
                                  f"{sa.get('crypto')}, asked for {backend}")
        return out, report

    def passed(self):
        """The job passed: its files are of no further interest."""
        if not self.keep:
            for path in self.pending:
                if os.path.exists(path):
                    os.unlink(path)
        self.pending = []

    def failed(self):
        self.pending = []
        self.kept_failures = True


def drops_of(report):
    return {k: v for k, v in report["drops"].items() if v}


# --------------------------------------------------------------------------------------------
# Comparing frames

V4_FIELDS = [(0, 1, "version/ihl"), (1, 2, "tos"), (2, 4, "total length"), (4, 6, "id"),
             (6, 8, "flags/fragment"), (8, 9, "ttl"), (9, 10, "protocol"), (10, 12, "checksum"),
             (12, 16, "source"), (16, 20, "destination")]
V6_FIELDS = [(0, 4, "version/traffic class/flow label"), (4, 6, "payload length"),
             (6, 7, "next header"), (7, 8, "hop limit"), (8, 24, "source"),
             (24, 40, "destination")]


def where(ip, off):
    table = V4_FIELDS if ip and ip[0] >> 4 == 4 else V6_FIELDS
    for lo, hi, name in table:
        if lo <= off < hi:
            return f"IPv{ip[0] >> 4} {name}"
    return f"IP payload byte {off - ec.ip_header_len(ip)}"


def diff_ip(expected, got):
    """Where two IP packets differ, in words."""
    if not got:
        return "empty packet"
    n = min(len(expected), len(got))
    off = next((i for i in range(n) if expected[i] != got[i]), n)
    if off == n:
        return f"length {len(got)}, expected {len(expected)}"
    return (f"byte {off} ({where(expected, off)}): 0x{got[off]:02x}, expected "
            f"0x{expected[off]:02x}; length {len(got)}, expected {len(expected)}")


def split_frame(case, fr):
    """(link header, IP packet trimmed to its length, trailer bytes)."""
    l3 = ec.l3_offset(case.linktype)
    ip = fr[l3:]
    if len(ip) < 20 or ip[0] >> 4 not in (4, 6):
        raise CaseFailure("not an IP packet")
    total = ec.ip_total_len(ip)
    if total > len(ip):
        raise CaseFailure(f"IP length {total} beyond the frame's {len(ip)} bytes")
    return fr[:l3], ip[:total], ip[total:]


def check_plain(case, expected_frame, got, fields):
    """None if `got` is the expected plaintext frame up to `fields`, else the reason."""
    try:
        l2, ip, trailer = split_frame(case, got)
    except CaseFailure as e:
        return str(e)
    l3 = ec.l3_offset(case.linktype)
    exp_ip = expected_frame[l3:]
    if l2 != expected_frame[:l3]:
        return f"link header {l2.hex()}, expected {expected_frame[:l3].hex()}"
    if trailer and (any(trailer) or len(got) > 60):
        return f"{len(trailer)} bytes after the IP packet ({trailer[:16].hex()}...)"
    if ip[0] >> 4 == 4 and not ec.ipv4_checksum_ok(ip):
        return "bad IPv4 header checksum"
    a, b = ec.normalise_ip(exp_ip, fields), ec.normalise_ip(ip, fields)
    if a != b:
        return diff_ip(a, b)
    return None


class Expect:
    """One input frame and what must become of it."""

    def __init__(self, label, data, check=None, escaped=None, drop=None):
        self.label = label
        self.data = data
        self.check = check          # output frame -> None (it is this frame's output) or reason
        self.escaped = escaped      # dropped frames: output frame -> True if it is this one
        self.drop = drop            # the reason it must be dropped

    @property
    def written(self):
        return self.check is not None


NOTES = set()


def unchanged(label, data, linktype=ec.LINKTYPE_ETHERNET):
    """The frame must come out as it went in. Ethernet padding after the IP packet may be
    trimmed (a NIC pads again on the wire); the run notes it."""
    def check(o):
        if o == data:
            return None
        if linktype == ec.LINKTYPE_ETHERNET and len(data) > 14 and data[14] >> 4 in (4, 6):
            end = 14 + ec.ip_total_len(data[14:])
            if o == data[:end] and not any(data[end:]):
                NOTES.add("xesp trims the Ethernet padding of frames it passes unchanged")
                return None
        return f"changed ({len(o)} bytes, expected {len(data)} unchanged)"
    return Expect(label, data, check=check)


def dropped(label, data, why, plain_check=None):
    def escaped(o):
        return o == data or (plain_check is not None and plain_check(o) is None)
    return Expect(label, data, escaped=escaped, drop=why)


def match(step, expects, outputs):
    """Align the output frames with the input frames (order kept, drops removed)."""
    problems, i = [], 0
    for k, o in enumerate(outputs):
        j, hit = i, None
        while j < len(expects):
            e = expects[j]
            if e.written and e.check(o) is None:
                hit = "ok"
                break
            if not e.written and e.escaped(o):
                hit = "escaped"
                break
            j += 1
        if hit is None:
            # Take it for the next frame that should be written, and say how it differs.
            nxt = next((n for n in range(i, len(expects)) if expects[n].written), None)
            if nxt is None:
                problems.append(f"output {k} is extra: it matches no input frame")
                continue
            problems.append(f"output {k} (input {nxt}, {expects[nxt].label}): "
                            f"{expects[nxt].check(o)}")
            i = nxt + 1
            continue
        for e in expects[i:j]:
            if e.written:
                problems.append(f"input {expects.index(e)} ({e.label}) missing from the output")
        if hit == "escaped":
            problems.append(f"input {j} ({expects[j].label}) written, expected dropped "
                            f"({expects[j].drop})")
        i = j + 1
    for e in expects[i:]:
        if e.written:
            problems.append(f"input {expects.index(e)} ({e.label}) missing from the output")
    return problems


def fail_if(step, problems):
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CaseFailure(f"{step}: " + "; ".join(problems[:5]) + more)


def expect_no_drops(step, problems, report):
    d = drops_of(report)
    if d:
        problems.append(f"unexpected drops {d}")
    fail_if(step, problems)


# --------------------------------------------------------------------------------------------
# The steps


def label_of(inner):
    v = inner[0] >> 4
    proto = inner[9] if v == 4 else inner[6]
    name = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}.get(proto, str(proto))
    return f"{name} {len(inner)}B"


class CaseData:
    """The scapy side of one case, built once and shared by the backends."""

    def __init__(self, case):
        self.case = case
        self.sa_in = ec.scapy_sa(case, "in")
        self.plain_in = ec.inner_packets(case, "in")
        first = case.first_in_seq()
        self.sealed_in = [ec.seal(case, "in", p, first + k, sa=self.sa_in)
                          for k, p in enumerate(self.plain_in)]
        self.plain_out = ec.inner_packets(case, "out")
        self.aead_ref = {}


def plain_frame(case, inner):
    return ec.frame(case, inner, "in")


def decrypted_as(case, inner):
    """Check: the output frame is `inner` as decrypted and written by the gateway."""
    want = plain_frame(case, inner)
    return lambda o: check_plain(case, want, o, ec.IP_FIELDS_ROUTER)


def step_in(x, data, backend):
    case = data.case
    stray = ec.stray_packet(case, "in")
    expects = []
    for k, (p, s) in enumerate(zip(data.plain_in, data.sealed_in)):
        want = plain_frame(case, p)
        expects.append(Expect(f"esp seq {k + 1} {label_of(p)}", ec.frame(case, s, "in"),
                              check=lambda o, w=want: check_plain(case, w, o,
                                                                  ec.IP_FIELDS_ROUTER)))
        if k == 2:
            expects.append(unchanged("plaintext no policy covers", ec.frame(case, stray, "in"),
                                     case.linktype))
    out, report = x.run(case, "in", backend, ec.conf_text(case, "in"), [e.data for e in expects])
    expect_no_drops("in", match("in", expects, out), report)


def check_outbound(data, inner, in_frame, seq64, o):
    """None if `o` is `inner` correctly encrypted with sequence number seq64, else the reason."""
    case = data.case
    try:
        l2, ip, trailer = split_frame(case, o)
    except CaseFailure as e:
        return str(e)
    if trailer:
        return f"{len(trailer)} bytes after the IP packet"
    if case.linktype == ec.LINKTYPE_ETHERNET:
        if l2[:12] != in_frame[:12]:
            return f"MAC addresses {l2[:12].hex()}, expected {in_frame[:12].hex()} (kept)"
        want = ec.ETH_IPV4 if case.outer == 4 else ec.ETH_IPV6
        if struct.unpack_from("!H", l2, 12)[0] != want:
            return f"ethertype 0x{struct.unpack_from('!H', l2, 12)[0]:04x}, expected 0x{want:04x}"
    if ip[0] >> 4 != case.outer:
        return f"outer IPv{ip[0] >> 4}, expected IPv{case.outer}"
    v4 = case.outer == 4
    proto = ip[9] if v4 else ip[6]
    want_proto = 17 if case.natt else 50
    if proto != want_proto:
        return f"outer protocol {proto}, expected {want_proto}"
    if v4:
        if ip[0] & 0x0F != 5:
            return f"outer IHL {ip[0] & 0x0F}"
        if not ec.ipv4_checksum_ok(ip):
            return "bad outer IPv4 header checksum"
        if struct.unpack_from("!H", ip, 6)[0] & 0x3FFF:
            return "outer header is a fragment"
        if ip[8] == 0:
            return "outer TTL 0"
        addrs = (ip[12:16], ip[16:20])
    else:
        if ip[7] == 0:
            return "outer hop limit 0"
        addrs = (ip[8:24], ip[24:40])
    got_addrs = tuple(str(ipaddress.ip_address(a)) for a in addrs)
    if case.tunnel:
        want_addrs = tuple(str(ipaddress.ip_address(a)) for a in case.outer_addrs("out"))
    else:
        want_addrs = case.inner_addrs("out")
        want_addrs = tuple(str(ipaddress.ip_address(a)) for a in want_addrs)
    if got_addrs != want_addrs:
        return f"outer addresses {got_addrs}, expected {want_addrs}"
    off = ec.esp_offset(ip)
    if case.natt:
        sport, dport, ulen, csum = struct.unpack_from("!HHHH", ip, off - 8)
        if (sport, dport) != (ec.NATT_PORT, ec.NATT_PORT):
            return f"UDP ports {sport}->{dport}, expected 4500->4500"
        if ulen != len(ip) - off + 8:
            return f"UDP length {ulen}, expected {len(ip) - off + 8}"
        if v4 and csum not in (0, ec.udp_checksum(ip)):
            return f"bad UDP checksum 0x{csum:04x}"
        if not v4 and csum != ec.udp_checksum(ip):
            return (f"UDP checksum 0x{csum:04x} in IPv6, expected 0x{ec.udp_checksum(ip):04x} "
                    "(zero is not allowed)")
    esp = ip[off:]
    spi, lo = struct.unpack_from("!II", esp)
    if spi != case.spi_out:
        return f"SPI 0x{spi:08x}, expected 0x{case.spi_out:08x}"
    if lo != seq64 & 0xFFFFFFFF:
        return f"sequence number 0x{lo:08x}, expected 0x{seq64 & 0xFFFFFFFF:08x}"
    if case.xf.aead and esp[8:16] != ec.aead_iv(seq64):
        return f"IV {esp[8:16].hex()}, expected the sequence number {ec.aead_iv(seq64).hex()}"
    try:
        back = ec.open_esp(case, "out", ip, seq64 >> 32, sa=data.sa_out)
    except IPSecIntegrityError:
        return f"scapy: ICV check failed (seq 0x{seq64:x})"
    except Exception as e:  # noqa: BLE001
        return f"scapy cannot decrypt it: {type(e).__name__}: {e}"
    if ec.normalise_ip(back, ec.IP_FIELDS_ROUTER) != ec.normalise_ip(inner, ec.IP_FIELDS_ROUTER):
        return "decrypted packet differs: " + diff_ip(ec.normalise_ip(inner, ec.IP_FIELDS_ROUTER),
                                                      ec.normalise_ip(back, ec.IP_FIELDS_ROUTER))
    if case.xf.aead:
        ref = data.aead_ref.get(seq64)
        if ref is None:
            sealed = ec.seal(case, "out", inner, seq64, sa=data.sa_ref)
            ref = data.aead_ref[seq64] = sealed[ec.esp_offset(sealed):]
        if esp != ref:
            return ("ESP bytes differ from scapy's with the same IV: "
                    f"length {len(esp)}, scapy {len(ref)}; first difference at ESP byte "
                    f"{next((i for i in range(min(len(esp), len(ref))) if esp[i] != ref[i]), 0)}")
    else:
        pad, padlen, nh = ec.esp_padding(case, "out", esp)
        if pad != bytes(range(1, padlen + 1)):
            return f"padding {pad.hex()}, expected 01 02 .. (RFC 4303 2.4)"
        want_nh = (4 if inner[0] >> 4 == 4 else 41) if case.tunnel else \
            (inner[9] if inner[0] >> 4 == 4 else inner[6])
        if nh != want_nh:
            return f"next header {nh}, expected {want_nh}"
    return None


def step_out(x, data, backend):
    case = data.case
    data.sa_out = ec.scapy_sa(case, "out")
    data.sa_ref = ec.scapy_sa(case, "out")
    first = case.first_out_seq()
    expects = []
    for k, inner in enumerate(data.plain_out):
        f = ec.frame(case, inner, "out", pad=True)
        seq = first + k
        expects.append(Expect(f"{label_of(inner)} seq 0x{seq:x}", f,
                              check=lambda o, i=inner, f=f, s=seq:
                              check_outbound(data, i, f, s, o)))
        if k == 1:
            expects.append(unchanged("plaintext no policy covers",
                                     ec.frame(case, ec.stray_packet(case, "out"), "out",
                                              pad=True), case.linktype))
    out, report = x.run(case, "out", backend, ec.conf_text(case, "out"),
                        [e.data for e in expects])
    expect_no_drops("out", match("out", expects, out), report)


def flip(pkt, off):
    b = bytearray(pkt)
    b[off] ^= 0x40
    return bytes(b)


def ike_frame(case, payload):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    src, dst = case.outer_addrs("in")
    ip = IP(src=src, dst=dst) if case.outer == 4 else IPv6(src=src, dst=dst)
    return ec.frame(case, bytes(ip / UDP(sport=ec.NATT_PORT, dport=ec.NATT_PORT) / payload), "in")


def step_neg(x, data, backend):
    case = data.case
    first = case.first_in_seq()
    sa = data.sa_in
    p = data.plain_in
    e_ = ec.frame

    def sealed(k, seq):
        return ec.seal(case, "in", p[k], seq, sa=sa)

    def plain_check(k):
        return decrypted_as(case, p[k])

    def good(label, k, seq):
        return Expect(label, e_(case, sealed(k, seq), "in"), check=plain_check(k))

    bad_ct = sealed(1, first + 1)
    off = ec.esp_offset(bad_ct)
    bad_ct = flip(bad_ct, off + 8 + case.xf.iv_len + 1)
    bad_icv = sealed(2, first + 2)
    bad_icv = flip(bad_icv, len(bad_icv) - 1)

    unknown = ec.seal(case, "in", p[0], first, sa=ec.scapy_sa(case, "in"))
    off_u = ec.esp_offset(unknown)
    unknown = bytearray(unknown)
    struct.pack_into("!I", unknown, off_u, case.spi_in ^ 0x00FF0000)
    unknown = bytes(unknown)

    first_frame = e_(case, data.sealed_in[0], "in")
    expects = [
        Expect("valid seq +0", first_frame, check=plain_check(0)),
        dropped("ciphertext byte flipped seq +1", e_(case, bad_ct, "in"), "in-icv-fail"),
        dropped("ICV byte flipped seq +2", e_(case, bad_icv, "in"), "in-icv-fail"),
        good("valid seq +1 (after an ICV failure on +1)", 1, first + 1),
        good("valid seq +2", 2, first + 2),
        dropped("duplicate of seq +0", first_frame, "in-replay", plain_check(0)),
        unchanged("ESP for an unknown SPI", e_(case, unknown, "in"), case.linktype),
        unchanged("IKE on UDP 4500 (non-ESP marker)",
                  ike_frame(case, b"\0\0\0\0" + bytes(range(28))), case.linktype),
        unchanged("NAT keepalive", ike_frame(case, b"\xff"), case.linktype),
        good("valid seq +200", 3, first + 200),
        dropped("seq +3, left of the window", e_(case, sealed(4, first + 3), "in"),
                "in-too-old", plain_check(4)),
    ]
    out, report = x.run(case, "neg", backend, ec.conf_text(case, "in"),
                        [e.data for e in expects])
    problems = match("neg", expects, out)
    d = drops_of(report)
    icv, replay, old = (d.get(n, 0) for n in ("in-icv-fail", "in-replay", "in-too-old"))
    # With ESN a packet left of the window reads as one of the next 2^32 (RFC 4303 A2.2):
    # it fails its ICV instead.
    if case.esn:
        if (icv, replay + old) not in ((2, 2), (3, 1)) or replay < 1:
            problems.append(f"in-icv-fail {icv}, in-replay {replay}, in-too-old {old}; "
                            "expected 2, 1, 1 (or 3, 1, 0)")
    else:
        if icv != 2:
            problems.append(f"in-icv-fail {icv}, expected 2")
        if replay < 1 or replay + old != 2:
            problems.append(f"in-replay {replay} + in-too-old {old}, expected 1 + 1 "
                            "(or 2 + 0)")
    if sum(d.values()) != 4:
        problems.append(f"{sum(d.values())} drops counted, expected 4")
    if problems:
        problems.append(f"drops {d}")
    fail_if("neg", problems)


def step_bypass(x, data, backend):
    """RFC 4301 5.2: plaintext that an inbound policy says must arrive protected is discarded
    (the kernel counts it as XfrmInTmplMismatch)."""
    case = data.case
    src, dst = case.inner_addrs("in")
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    ip = IP(src=src, dst=dst) if case.inner == 4 else IPv6(src=src, dst=dst)
    clear = bytes(ip / UDP(sport=5555, dport=6666) / b"must not pass in the clear")
    expects = [
        Expect("valid seq +0", ec.frame(case, data.sealed_in[0], "in"),
               check=decrypted_as(case, data.plain_in[0])),
        dropped("plaintext the inbound policy protects", ec.frame(case, clear, "in"),
                "policy"),
        unchanged("plaintext no policy covers",
                  ec.frame(case, ec.stray_packet(case, "in"), "in"), case.linktype),
        Expect("valid seq +1", ec.frame(case, data.sealed_in[1], "in"),
               check=decrypted_as(case, data.plain_in[1])),
    ]
    out, report = x.run(case, "bypass", backend, ec.conf_text(case, "in"),
                        [e.data for e in expects])
    problems = match("bypass", expects, out)
    d = drops_of(report)
    if sum(d.get(n, 0) for n in POLICY_DROPS) != 1 or sum(d.values()) != 1:
        problems.append(f"drops {d}, expected one of {', '.join(POLICY_DROPS)}")
    fail_if("bypass", problems)


def step_fragment(x, data, backend):
    """Fragments of plaintext an outbound policy covers are encrypted or dropped, never
    written in the clear (a policy on addresses covers every fragment)."""
    from scapy.layers.inet import IP, UDP, fragment
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, fragment6
    case = data.case
    src, dst = case.inner_addrs("out")
    body = UDP(sport=1234, dport=5678) / (bytes(range(256)) * 4)
    if case.inner == 4:
        frags = fragment(IP(src=src, dst=dst, id=0x3001) / body, fragsize=400)
    else:
        frags = fragment6(IPv6(src=src, dst=dst) / IPv6ExtHdrFragment(id=0x3001) / body, 500)
    frags = [bytes(f) for f in frags]
    frames = [ec.frame(case, f, "out", pad=True) for f in frags]
    out, report = x.run(case, "fragment", backend, ec.conf_text(case, "out"), frames)
    sa = ec.scapy_sa(case, "out")
    problems = []
    for k, o in enumerate(out):
        try:
            _, ip, _ = split_frame(case, o)
        except CaseFailure as e:
            problems.append(f"output {k}: {e}")
            continue
        if ip in frags:
            problems.append(f"fragment {frags.index(ip)} written in the clear")
            continue
        try:
            back = ec.open_esp(case, "out", ip, 0, sa=sa)
        except Exception as e:  # noqa: BLE001
            problems.append(f"output {k} is neither a fragment nor one scapy decrypts ({e})")
            continue
        norm = [ec.normalise_ip(f, ec.IP_FIELDS_ROUTER) for f in frags]
        if ec.normalise_ip(back, ec.IP_FIELDS_ROUTER) not in norm:
            problems.append(f"output {k} decrypts to no fragment sent")
    fail_if("fragment", problems)


def step_wrap(x, data, backend):
    """Without ESN the last sequence number is 2^32 - 1 (RFC 4303 3.3.3)."""
    case = dataclasses.replace(data.case, oseq=0xFFFFFFFD)
    conf = ec.conf_text(case, "out")
    data.sa_out = ec.scapy_sa(case, "out")
    data.sa_ref = ec.scapy_sa(case, "out")
    data.aead_ref = {}
    expects = []
    for k, inner in enumerate(data.plain_out[:4]):
        f = ec.frame(case, inner, "out", pad=True)
        if k < 2:
            s = 0xFFFFFFFE + k
            expects.append(Expect(f"{label_of(inner)} seq 0x{s:x}", f,
                                  check=lambda o, i=inner, f=f, s=s:
                                  check_outbound(data, i, f, s, o)))
        else:
            expects.append(dropped(f"{label_of(inner)} after seq 0xffffffff", f,
                                   "out-seq-exhausted"))
    out, report = x.run(case, "wrap", backend, conf, [e.data for e in expects])
    problems = match("wrap", expects, out)
    # The first packet past the end is out-seq-exhausted; the SA may then count as expired.
    d = drops_of(report)
    if d.get("out-seq-exhausted", 0) < 1 or \
            d.get("out-seq-exhausted", 0) + d.get("out-expired", 0) != 2 or sum(d.values()) != 2:
        problems.append(f"drops {d}, expected out-seq-exhausted 2 (or 1 and out-expired 1)")
    fail_if("wrap", problems)
    data.aead_ref = {}


def step_mixed(x, data, backend):
    """Both directions interleaved in one capture, longer than one burst (32 frames): order
    is kept across SAs, directions and bursts."""
    case = data.case
    data.sa_out = ec.scapy_sa(case, "out")
    data.sa_ref = ec.scapy_sa(case, "out")
    data.aead_ref = {}
    first_in, first_out = case.first_in_seq(), case.first_out_seq()
    expects = []
    for r in range(MIXED_ROUNDS):
        inner = data.plain_in[r % len(data.plain_in)]
        sealed = ec.seal(case, "in", inner, first_in + r, sa=data.sa_in)
        expects.append(Expect(f"in seq {r + 1} {label_of(inner)}", ec.frame(case, sealed, "in"),
                              check=decrypted_as(case, inner)))
        inner = data.plain_out[r % len(data.plain_out)]
        f = ec.frame(case, inner, "out", pad=True)
        seq = first_out + r
        expects.append(Expect(f"out {label_of(inner)} seq 0x{seq:x}", f,
                              check=lambda o, i=inner, f=f, s=seq:
                              check_outbound(data, i, f, s, o)))
    conf = ec.conf_text(case, "in") + ec.conf_text(case, "out")
    out, report = x.run(case, "mixed", backend, conf, [e.data for e in expects])
    expect_no_drops("mixed", match("mixed", expects, out), report)
    data.aead_ref = {}


MIXED_ROUNDS = 20


def wants_mixed(case):
    return (case.xf.name in ("aes128gcm", "aes128cbc-sha256") and not case.esn
            and case.linktype == ec.LINKTYPE_ETHERNET)


def wants_bypass(case):
    return (case.xf.name == "aes128gcm" and not case.esn and not case.natt
            and case.linktype == ec.LINKTYPE_ETHERNET)


def wants_wrap(case):
    return (not case.esn and not case.natt and case.mode == "tunnel" and case.inner == 4
            and case.outer == 4 and case.linktype == ec.LINKTYPE_ETHERNET)


# --------------------------------------------------------------------------------------------


def run_job(x, data, backend, steps):
    """None if every step passes, "skip: why" if the backend does not implement the
    transform (and is not expected to), else the reason of the failure."""
    try:
        for step in steps:
            step(x, data, backend)
    except Unsupported as e:
        x.passed()
        if backend == "ipsecmb" and data.case.xf.ipsecmb:
            return f"backend refuses a transform it should implement: {e}"
        return f"skip: {e}"
    except CaseFailure as e:
        x.failed()
        return str(e)
    except Exception as e:  # noqa: BLE001
        x.failed()
        return f"{type(e).__name__}: {e}"
    x.passed()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xesp")
    ap.add_argument("--work", help="directory for captures and batches (default: a temp dir)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only cases whose name contains this (repeatable; all must match)")
    ap.add_argument("--backend", action="append", choices=BACKENDS)
    ap.add_argument("--keep", action="store_true", help="keep every capture and batch")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every xesp command")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="xesp-interop-")
    os.makedirs(work, exist_ok=True)
    x = Xesp(os.path.abspath(args.xesp), work, args.keep, args.verbose)
    backends = args.backend or list(BACKENDS)
    cases, skipped = ec.build_matrix()
    skipped = [s for s in skipped if all(o in s[0] for o in args.only)]

    def jobs_of(case):
        jobs = [(case.name, [step_in, step_out, step_neg] +
                 ([step_wrap] if wants_wrap(case) else []))]
        if wants_mixed(case):
            jobs.append((f"{case.name} both-directions", [step_mixed]))
        if wants_bypass(case):
            jobs.append((f"{case.name} plaintext-bypass", [step_bypass]))
        if wants_bypass(case) and case.tunnel:
            jobs.append((f"{case.name} fragment-bypass", [step_fragment]))
        return [j for j in jobs if all(o in j[0] for o in args.only)]

    passed = failed = unsupported = ncases = 0
    t0 = time.monotonic()
    for case in cases:
        jobs = jobs_of(case)
        if not jobs:
            continue
        ncases += 1
        try:
            data = CaseData(case)
        except Exception as e:  # noqa: BLE001
            for name, _ in jobs:
                for b in backends:
                    failed += 1
                    print(f"FAIL {name} [{b}]: scapy side: {type(e).__name__}: {e}", flush=True)
            continue
        for name, steps in jobs:
            for b in backends:
                verdict = run_job(x, data, b, steps)
                if verdict is None:
                    passed += 1
                    print(f"ok   {name} [{b}]", flush=True)
                elif verdict.startswith("skip: "):
                    unsupported += 1
                    print(f"skip {name} [{b}]: {verdict[6:]}", flush=True)
                else:
                    failed += 1
                    print(f"FAIL {name} [{b}]: {verdict}", flush=True)
    for name, reason in skipped:
        print(f"skip {name}: {reason}")
    print(f"{ncases} cases x {len(backends)} backends, {x.runs} xesp runs, "
          f"{time.monotonic() - t0:.0f} s; skipped: {len(skipped)} combinations scapy cannot "
          f"check, {unsupported} on a backend that does not implement the transform")
    if not args.work and not args.keep and not x.kept_failures:
        shutil.rmtree(work, ignore_errors=True)
    elif args.keep or x.kept_failures:
        what = "captures and batches" if args.keep else "captures and batches of failed jobs"
        print(f"{what} kept in {work}")
    for note in sorted(NOTES):
        print(f"note: {note}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
