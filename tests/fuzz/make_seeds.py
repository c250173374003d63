#!/usr/bin/python3
"""Writes the seed corpus of the fuzz targets into tests/fuzz/seeds/fuzz_NAME/.

    /usr/bin/python3 tests/fuzz/make_seeds.py [--out DIR]

Deterministic: fixed keys, addresses and IVs, so running it again changes no file. ci/test and
tools/xesp-fuzz hand seeds/fuzz_NAME to the target of that name beside its own corpus.

  fuzz_decap    for every SA of the target's table (fuzz_decap.cpp; SA_TABLE here is the same
                table, keep them in step), both input kinds: "odd" seeds are plaintexts the
                target encrypts itself (an inner packet and a valid ESP trailer), "even" seeds
                are whole ESP packets made by scapy (the independent implementation; GMAC and
                the ESN ICV of the HMACs, which scapy 2.5 lacks or gets wrong, by hand).
  fuzz_grammar  batch files: every command of the `ip xfrm` grammar and every option word,
                accepted and refused.
  fuzz_control  request lines of every kind, alone and as sessions of several.
  fuzz_state    state files, valid and not.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shlex
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))

from esp_cases import _fix_natt  # noqa: E402  (sets scapy quiet, too)
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_RR  # noqa: E402
from scapy.layers.inet6 import (ICMPv6EchoRequest, IPv6, IPv6ExtHdrFragment,  # noqa: E402
                                IPv6ExtHdrHopByHop)
from scapy.layers.ipsec import ESP, SecurityAssociation  # noqa: E402
from scapy.packet import Raw  # noqa: E402

# ---- The SA table of fuzz_decap.cpp ---------------------------------------------------------

# (words with {E}/{A}, enc key bytes, auth key bytes, scapy crypt, scapy auth, ICV bytes, hash)
TRANSFORMS = [
    ("aead 'rfc4106(gcm(aes))' {E} 128", 20, 0, "AES-GCM", None, 16, None),
    ("aead 'rfc4106(gcm(aes))' {E} 128", 28, 0, "AES-GCM", None, 16, None),
    ("aead 'rfc4106(gcm(aes))' {E} 128", 36, 0, "AES-GCM", None, 16, None),
    ("aead 'rfc4543(gcm(aes))' {E} 128", 20, 0, "GMAC", None, 16, None),
    ("aead 'rfc7539esp(chacha20,poly1305)' {E} 128", 36, 0, "CHACHA20-POLY1305", None, 16,
     None),
    ("enc 'cbc(aes)' {E} auth 'hmac(sha1)' {A}", 16, 20, "AES-CBC", "HMAC-SHA1-96", 12,
     hashlib.sha1),
    ("enc 'cbc(aes)' {E} auth-trunc 'hmac(sha256)' {A} 128", 16, 32, "AES-CBC", "SHA2-256-128",
     16, hashlib.sha256),
    ("enc 'cbc(aes)' {E} auth 'hmac(sha384)' {A}", 32, 48, "AES-CBC", "SHA2-384-192", 24,
     hashlib.sha384),
    ("enc 'cbc(aes)' {E} auth-trunc 'hmac(sha512)' {A} 256", 32, 64, "AES-CBC", "SHA2-512-256",
     32, hashlib.sha512),
    ("enc 'ecb(cipher_null)' '' auth-trunc 'hmac(sha256)' {A} 128", 0, 32, "NULL",
     "SHA2-256-128", 16, hashlib.sha256),
]

# (tunnel, outer family, inner family, NAT-T, ESN)
LAYOUTS = [
    (True, 4, 4, False, False),
    (False, 6, 6, False, False),
    (True, 6, 6, True, True),
    (False, 4, 4, True, False),
    (True, 4, 6, False, True),
]

PEER = {4: "192.0.2.1", 6: "2001:db8::1"}
SELF = {4: "192.0.2.2", 6: "2001:db8::2"}
FROM_NET = {4: "10.1.0.0/16", 6: "2001:db8:1::/48"}
TO_NET = {4: "10.2.0.0/16", 6: "2001:db8:2::/48"}
FROM_HOST = {4: "10.1.0.7", 6: "2001:db8:1::7"}
STRAY = {4: "198.51.100.1", 6: "2001:db8:99::1"}
TO_HOST = {4: "10.2.0.9", 6: "2001:db8:2::9"}


def key_bytes(n, start, length):
    return bytes((n * 16 + i) & 0xFF for i in range(start, start + length))


class Sa:
    def __init__(self, n):
        self.n = n
        (self.words, self.ek_len, self.ak_len, self.crypt, self.auth, self.icv,
         self.hash) = TRANSFORMS[n % len(TRANSFORMS)]
        self.tunnel, self.outer, self.inner, self.natt, self.esn = LAYOUTS[n // len(TRANSFORMS)]
        self.spi = 0x100 + n
        self.ek = key_bytes(n, 0, self.ek_len)
        self.ak = key_bytes(n, self.ek_len, self.ak_len)

    @property
    def aead(self):
        return self.crypt in ("AES-GCM", "GMAC", "CHACHA20-POLY1305")

    @property
    def block(self):
        return 16 if self.crypt == "AES-CBC" else 4

    @property
    def iv_len(self):
        return 8 if self.aead else 16 if self.crypt == "AES-CBC" else 0

    def batch(self):
        alg = self.words.replace("{E}", "0x" + self.ek.hex()).replace("{A}", "0x" + self.ak.hex())
        mode = "tunnel" if self.tunnel else "transport"
        line = (f"sa add src {PEER[self.outer]} dst {SELF[self.outer]} proto esp spi {self.spi} "
                f"reqid 1 mode {mode} {alg} replay-window 64")
        if self.esn:
            line += " flag esn"
        if self.natt:
            line += " encap espinudp 4500 4500 " + ("0.0.0.0" if self.outer == 4 else "::")
        if self.tunnel:
            line += f" sel src {FROM_NET[self.inner]} dst {TO_NET[self.inner]}"
            pol = (f"policy add src {FROM_NET[self.inner]} dst {TO_NET[self.inner]} dir fwd "
                   f"tmpl src {PEER[self.outer]} dst {SELF[self.outer]} proto esp reqid 1 "
                   "mode tunnel")
        else:
            pol = (f"policy add src {PEER[self.outer]} dst {SELF[self.outer]} dir in "
                   "tmpl proto esp reqid 1 mode transport")
        return line + "\n" + pol + "\n"


SA_TABLE = [Sa(n) for n in range(len(TRANSFORMS) * len(LAYOUTS))]

# ---- fuzz_decap -------------------------------------------------------------------------------


def ip_layer(family, src, dst):
    return IP(src=src, dst=dst, ttl=64) if family == 4 else IPv6(src=src, dst=dst, hlim=64)


def inner_packet(sa, kind):
    """The packet the SA carries: the inner IP packet (tunnel) or the transport packet with the
    outer addresses (transport)."""
    fam = sa.inner if sa.tunnel else sa.outer
    src, dst = (FROM_HOST[fam], TO_HOST[fam]) if sa.tunnel else (PEER[fam], SELF[fam])
    ip = ip_layer(fam, src, dst)
    payload = Raw(b"xesp fuzz seed %d" % sa.n)
    if kind == "udp":
        return ip / UDP(sport=40000 + sa.n, dport=5000) / payload
    if kind == "tcp":
        return ip / TCP(sport=40000 + sa.n, dport=443, flags="PA", seq=1000) / payload
    return ip / (ICMP(id=sa.n, seq=1) if fam == 4 else ICMPv6EchoRequest(id=sa.n, seq=1)) / payload


def esp_plaintext(sa, pkt, next_header=None, tfc=0):
    """What ESP encrypts: (tunnel) the inner packet, (transport) its payload, then TFC bytes,
    padding 1, 2, 3, ..., pad length and next header (RFC 4303 2.4-2.6)."""
    raw = bytes(pkt)
    if sa.tunnel:
        body, nh = raw, 4 if raw[0] >> 4 == 4 else 41
    else:
        hl = (raw[0] & 15) * 4 if raw[0] >> 4 == 4 else 40
        body, nh = raw[hl:], raw[9] if raw[0] >> 4 == 4 else raw[6]
    if next_header is not None:
        nh = next_header
    body += bytes(tfc)
    pad = (-(len(body) + 2)) % sa.block
    return body + bytes(range(1, pad + 1)) + bytes([pad, nh])


def aead_iv(seq):
    return struct.pack("!Q", seq)


def gmac_esp(sa, plain, seq=1):
    """ESP with AES-GMAC (RFC 4543): nothing is encrypted; the tag covers SPI, the sequence
    number (its high half too with ESN), the IV and the payload."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    iv = aead_iv(seq)
    hdr = struct.pack("!II", sa.spi, seq & 0xFFFFFFFF)
    seq_aad = struct.pack("!III", sa.spi, seq >> 32, seq & 0xFFFFFFFF) if sa.esn else hdr
    tag = AESGCM(sa.ek[:-4]).encrypt(sa.ek[-4:] + iv, b"", seq_aad + iv + plain)
    return hdr + iv + plain + tag


def outer_packet(sa, esp):
    """The outer IP [UDP] header around finished ESP bytes."""
    proto = 17 if sa.natt else 50
    ip = ip_layer(sa.outer, PEER[sa.outer], SELF[sa.outer])
    if sa.outer == 4:
        ip.proto = proto
    else:
        ip.nh = proto
    if sa.natt:
        return _fix_natt(bytes(ip / UDP(sport=4500, dport=4500) / Raw(esp)))
    return bytes(ip / Raw(esp))


def esp_offset(pkt):
    """Where ESP starts in an outer packet: after the IP header, and UDP for NAT-T."""
    hl = (pkt[0] & 15) * 4 if pkt[0] >> 4 == 4 else 40
    udp = (pkt[9] if pkt[0] >> 4 == 4 else pkt[6]) == 17
    return hl + (8 if udp else 0)


def scapy_wire(sa, pkt):
    """The ESP packet of one inner packet, sealed by scapy (sequence number 1)."""
    if sa.crypt == "GMAC":
        return outer_packet(sa, gmac_esp(sa, esp_plaintext(sa, pkt)))
    tunnel_header = ip_layer(sa.outer, PEER[sa.outer], SELF[sa.outer]) if sa.tunnel else None
    ssa = SecurityAssociation(
        ESP, spi=sa.spi, crypt_algo=sa.crypt, crypt_key=sa.ek or None,
        auth_algo=sa.auth, auth_key=sa.ak or None, tunnel_header=tunnel_header,
        nat_t_header=UDP(sport=4500, dport=4500) if sa.natt else None, esn_en=sa.esn)
    ssa.seq_num = 1
    ssa.esn = 0
    iv = aead_iv(1) if sa.aead else bytes(range(16)) if sa.crypt == "AES-CBC" else None
    out = bytes(ssa.encrypt(pkt, iv=iv))
    if sa.natt:
        out = _fix_natt(out)
    if sa.esn and sa.hash:
        # scapy leaves the high half of the sequence number (0 here) out of the ICV
        # (RFC 4303 2.2.1 puts it in after the payload): make the ICV again.
        at = esp_offset(out)
        body = out[at:len(out) - sa.icv]
        icv = hmac.new(sa.ak, body + bytes(4), sa.hash).digest()[:sa.icv]
        out = _fix_natt(out[:at] + body + icv) if sa.natt else out[:at] + body + icv
    return out


def decap_seeds():
    seeds = {}
    for sa in SA_TABLE:
        odd, even = bytes([sa.n << 1 | 1]), bytes([sa.n << 1])
        for kind in ("udp", "tcp", "icmp"):
            pkt = inner_packet(sa, kind)
            seeds[f"sa{sa.n:02d}-{kind}-plain"] = odd + esp_plaintext(sa, pkt)
            seeds[f"sa{sa.n:02d}-{kind}-wire"] = even + scapy_wire(sa, pkt)
        pkt = inner_packet(sa, "udp")
        seeds[f"sa{sa.n:02d}-tfc-plain"] = odd + esp_plaintext(sa, pkt, tfc=24)
        seeds[f"sa{sa.n:02d}-dummy-plain"] = odd + esp_plaintext(sa, pkt, next_header=59)
    # What else arrives, for one SA of each layout: the drop paths.
    for n in range(0, len(SA_TABLE), len(TRANSFORMS) + 1):
        sa = SA_TABLE[n]
        even = bytes([sa.n << 1])
        good = scapy_wire(sa, inner_packet(sa, "udp"))
        at = esp_offset(good)
        name = f"sa{sa.n:02d}-drop"
        seeds[f"{name}-icv"] = even + good[:-1] + bytes([good[-1] ^ 1])
        seeds[f"{name}-short"] = even + good[:at + 12]
        seeds[f"{name}-spi"] = even + good[:at] + struct.pack("!I", 0x7777) + good[at + 4:]
        seeds[f"{name}-seq0"] = even + good[:at + 4] + bytes(4) + good[at + 8:]
        fam = sa.inner if sa.tunnel else sa.outer
        seeds[f"{name}-plaintext"] = even + bytes(
            ip_layer(fam, FROM_HOST[fam], TO_HOST[fam]) / UDP(sport=1, dport=2) / Raw(b"clear"))
        if sa.outer == 4:
            seeds[f"{name}-fragment"] = even + bytes(
                IP(src=PEER[4], dst=SELF[4], proto=17 if sa.natt else 50, flags="MF", frag=0) /
                Raw(good[(good[0] & 15) * 4:]))
        if sa.natt:
            udp = ip_layer(sa.outer, PEER[sa.outer], SELF[sa.outer]) / UDP(sport=4500, dport=4500)
            seeds[f"{name}-keepalive"] = even + bytes(udp / Raw(b"\xff"))
            seeds[f"{name}-ike"] = even + bytes(udp / Raw(bytes(4) + bytes(range(28))))
        if sa.tunnel:
            for kind, inner in (
                ("frag", ip_layer(sa.inner, FROM_HOST[sa.inner], TO_HOST[sa.inner]) /
                 UDP(sport=9, dport=9) / Raw(bytes(64))),
                ("outside-sel", ip_layer(sa.inner, STRAY[sa.inner], TO_HOST[sa.inner]) /
                 UDP(sport=9, dport=9) / Raw(b"stray"))):
                if kind == "frag":
                    if sa.inner == 4:
                        inner.flags = "MF"
                    else:
                        inner = (IPv6(src=FROM_HOST[6], dst=TO_HOST[6]) /
                                 IPv6ExtHdrFragment(m=1, id=7) / UDP(sport=9, dport=9) /
                                 Raw(bytes(64)))
                seeds[f"sa{sa.n:02d}-inner-{kind}-plain"] = (
                    bytes([sa.n << 1 | 1]) + esp_plaintext(sa, inner))
        else:
            hbh = (IPv6(src=PEER[6], dst=SELF[6]) / IPv6ExtHdrHopByHop() / UDP(sport=9, dport=9) /
                   Raw(b"ext")) if sa.outer == 6 else (
                IP(src=PEER[4], dst=SELF[4], options=[IPOption_RR()]) / UDP(sport=9, dport=9) /
                Raw(b"opt"))
            seeds[f"sa{sa.n:02d}-transport-ext-wire"] = even + scapy_wire(sa, hbh)
    return seeds


# ---- fuzz_grammar -----------------------------------------------------------------------------

GCM = "aead 'rfc4106(gcm(aes))' 0x" + key_bytes(1, 0, 20).hex() + " 128"
CBC = ("enc 'cbc(aes)' 0x" + key_bytes(2, 0, 16).hex() + " auth 'hmac(sha256)' 0x" +
       key_bytes(2, 16, 32).hex())
SA4 = "src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000"
SA6 = "src 2001:db8::1 dst 2001:db8::2 proto esp spi 0x2000"
TMPL4 = "tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel"

GRAMMAR_LINES = {
    "sa-gcm": f"sa add {SA4} reqid 1 mode tunnel {GCM}",
    "sa-cbc-esn": f"sa add {SA6} mode transport {CBC} flag esn replay-window 128",
    "sa-state-alias": f"state add {SA4} mode tunnel {GCM}",
    "sa-update": f"sa update {SA4} reqid 7 mode tunnel {GCM} replay-window 32",
    "sa-del": "sa del src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000",
    "sa-delete": "sa delete dst 192.0.2.2 proto esp spi 4096",
    "sa-get": "sa get dst 192.0.2.2 proto esp spi 0x1000",
    "sa-flush": "sa flush",
    "sa-list": "sa list",
    "sa-show": "sa show",
    "sa-replay": (f"sa add {SA6} mode tunnel {GCM} flag esn replay-window 4096 replay-seq 7 "
                  "replay-oseq 0xfffffff0 replay-seq-hi 1 replay-oseq-hi 2"),
    "sa-replay-noesn": f"sa add {SA4} mode tunnel {GCM} replay-seq 100 replay-oseq 200",
    "sa-limits": (f"sa add {SA4} mode tunnel {GCM} limit byte-soft 1000 limit byte-hard 2000 "
                  "limit packet-soft 10 limit packet-hard 20 limit time-soft 30 "
                  "limit time-hard 60 limit time-use-soft 5 limit time-use-hard 9"),
    "sa-natt4": f"sa add {SA4} mode tunnel {GCM} encap espinudp 4500 4500 0.0.0.0",
    "sa-natt6": f"sa add {SA6} mode transport {GCM} encap espinudp 4501 4500 2001:db8::9",
    "sa-sel": (f"sa add {SA4} mode tunnel {GCM} sel src 10.1.0.0/16 dst 10.2.0.0/16 proto tcp "
               "sport 80 dport 443"),
    "sa-sel6in4": f"sa add {SA4} mode tunnel {GCM} sel src 2001:db8:1::/48 dst ::/0 proto udp",
    "sa-dir-in": f"sa add {SA4} mode tunnel {GCM} dir in",
    "sa-dir-out": f"sa add {SA4} mode tunnel {GCM} dir out",
    "sa-gmac": f"sa add {SA4} mode tunnel aead 'rfc4543(gcm(aes))' 0x{key_bytes(3, 0, 36).hex()} 128",
    "sa-gcm-icv64": f"sa add {SA4} mode tunnel aead rfc4106(gcm(aes)) 0x{key_bytes(3, 0, 28).hex()} 64",
    "sa-chacha": (f"sa add {SA4} mode tunnel aead 'rfc7539esp(chacha20,poly1305)' "
                  f"0x{key_bytes(4, 0, 36).hex()} 128"),
    "sa-sha1": f"sa add {SA4} enc cbc(aes) 0x{key_bytes(5, 0, 24).hex()} auth hmac(sha1) 0x{key_bytes(5, 0, 20).hex()}",
    "sa-sha384": (f"sa add {SA4} enc 'cbc(aes)' 0x{key_bytes(6, 0, 32).hex()} auth-trunc "
                  f"'hmac(sha384)' 0x{key_bytes(6, 0, 48).hex()} 192"),
    "sa-sha512": (f"sa add {SA4} enc 'cbc(aes)' 0x{key_bytes(7, 0, 16).hex()} auth "
                  f"'hmac(sha512)' 0x{key_bytes(7, 0, 64).hex()}"),
    "sa-null": f"sa add {SA4} enc 'ecb(cipher_null)' '' auth 'hmac(sha256)' 0x{key_bytes(8, 0, 32).hex()}",
    "sa-null-name": f"sa add {SA4} enc cipher_null \"\" auth sha256 0x{key_bytes(8, 0, 32).hex()}",
    "sa-continued": f"sa add {SA4} \\\n   mode tunnel \\\n   {GCM}  # a comment",
    "pol-tunnel": f"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out {TMPL4}",
    "pol-fwd": "policy add src 10.2.0.0/16 dst 10.1.0.0/16 dir fwd "
               "tmpl src 192.0.2.2 dst 192.0.2.1 proto esp reqid 2 mode tunnel level required",
    "pol-in-transport": "policy add src 2001:db8::2 dst 2001:db8::1 dir in tmpl proto esp "
                        "spi 0x2000 mode transport",
    "pol-block": "policy add src 10.1.0.0/16 dst 203.0.113.0/24 dir out action block",
    "pol-allow": "policy add src 10.1.0.0/16 dst 0.0.0.0/0 dir out action allow priority 100",
    "pol-ports": ("policy add src 10.1.0.0/16 dst 10.2.0.0/16 proto udp sport 53 dport 5353 "
                  f"dir out ptype main priority 7 {TMPL4}"),
    "pol-icmp": "policy add src ::/0 dst 2001:db8::/32 proto ipv6-icmp dir in action block",
    "pol-protos": "policy add src 0.0.0.0/0 dst 0.0.0.0/0 proto sctp dir out action block",
    "pol-update": f"policy update src 10.1.0.0/16 dst 10.2.0.0/16 dir out priority 9 {TMPL4}",
    "pol-del": "policy del src 10.1.0.0/16 dst 10.2.0.0/16 dir out",
    "pol-get": "policy get src 10.1.0.0/16 dst 10.2.0.0/16 dir out",
    "pol-flush": "policy flush",
    "pol-list": "policy list",
    # refused, each for its own reason
    "bad-flag": f"sa add {SA4} mode tunnel {GCM} flag noecn",
    "bad-flag-unknown": f"sa add {SA4} mode tunnel {GCM} flag frob",
    "bad-encap-tcp": f"sa add {SA4} mode tunnel {GCM} encap espintcp 4500 4500 0.0.0.0",
    "bad-encap-nonike": f"sa add {SA4} mode tunnel {GCM} encap espinudp-nonike 1 2 0.0.0.0",
    "bad-mode-beet": f"sa add {SA4} mode beet {GCM}",
    "bad-proto-ah": f"sa add src 192.0.2.1 dst 192.0.2.2 proto ah spi 1 {GCM}",
    "bad-spi0": f"sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0 {GCM}",
    "bad-families": f"sa add src 192.0.2.1 dst 2001:db8::2 proto esp spi 1 {GCM}",
    "bad-esn-window": f"sa add {SA4} {GCM} flag esn",
    "bad-hi-noesn": f"sa add {SA4} {GCM} replay-seq-hi 1",
    "bad-limit-order": f"sa add {SA4} {GCM} limit byte-soft 9 limit byte-hard 1",
    "bad-limit-kind": f"sa add {SA4} {GCM} limit bytes 9",
    "bad-aead-enc": f"sa add {SA4} {GCM} {CBC}",
    "bad-enc-only": f"sa add {SA4} enc 'cbc(aes)' 0x{key_bytes(1, 0, 16).hex()}",
    "bad-auth-only": f"sa add {SA4} auth 'hmac(sha1)' 0x{key_bytes(1, 0, 20).hex()}",
    "bad-keylen": f"sa add {SA4} aead 'rfc4106(gcm(aes))' 0x0102 128",
    "bad-icv": f"sa add {SA4} aead 'rfc4106(gcm(aes))' 0x{key_bytes(1, 0, 20).hex()} 100",
    "bad-trunc": f"sa add {SA4} enc cbc(aes) 0x{key_bytes(1, 0, 16).hex()} auth-trunc hmac(sha1) 0x{key_bytes(1, 0, 20).hex()} 33",
    "bad-alg": f"sa add {SA4} aead 'gcm(aes)' 0x{key_bytes(1, 0, 20).hex()} 128",
    "bad-twice": f"sa add {SA4} spi 7 {GCM}",
    "bad-word": f"sa add {SA4} {GCM} mark 7",
    "bad-ctx": f"sa add {SA4} {GCM} ctx foo",
    "bad-sel-family": f"sa add {SA4} mode transport {GCM} sel src 2001:db8::/32 dst ::/0",
    "bad-oaddr-family": f"sa add {SA4} {GCM} encap espinudp 4500 4500 ::1",
    "bad-ptype-sub": "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out ptype sub action block",
    "bad-level-use": f"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out {TMPL4} level use",
    "bad-index": "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out index 8",
    "bad-pol-limit": "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out limit byte-soft 1",
    "bad-two-tmpl": f"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out {TMPL4} {TMPL4}",
    "bad-block-tmpl": f"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out action block {TMPL4}",
    "bad-nodir": "policy add src 10.1.0.0/16 dst 10.2.0.0/16 action block",
    "bad-tmpl-noaddr": "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl proto esp mode tunnel",
    "bad-object": "route add 10.0.0.0/8",
    "bad-verb": "sa frobnicate",
    "bad-quote": "sa add src 'unterminated",
    "bad-flush-args": "sa flush now",
    "empty": "",
}


def grammar_seeds():
    seeds = {name: line + "\n" for name, line in GRAMMAR_LINES.items()}
    good = [line for name, line in GRAMMAR_LINES.items()
            if name.startswith(("sa-gcm", "sa-cbc", "sa-limits", "pol-"))
            and not name.startswith(("pol-del", "pol-flush", "pol-update"))]
    seeds["batch-mixed"] = "# a config\n\n" + "\n".join(good) + "\n"
    seeds["batch-decap-table"] = "".join(sa.batch() for sa in SA_TABLE)
    return seeds


# ---- fuzz_control -----------------------------------------------------------------------------


def request(obj):
    return json.dumps(obj, separators=(",", ":"))


def words(line):
    return shlex.split(line)


def control_seeds():
    add = words(GRAMMAR_LINES["sa-cbc-esn"])
    reqs = {
        "ping": {"cmd": "ping"},
        "stats": {"cmd": "stats"},
        "sa-list": {"cmd": "command", "words": ["sa", "list"]},
        "sa-list-keys": {"cmd": "command", "words": ["sa", "list"], "show_keys": True},
        "sa-get": {"cmd": "command", "words": ["sa", "get", "dst", "192.0.2.2", "spi", "0x1000"],
                   "show_keys": False},
        "sa-add": {"cmd": "command", "words": add},
        "sa-add-dup": {"cmd": "command", "words": words(
            "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000 mode tunnel " + GCM)},
        "sa-update": {"cmd": "command", "words": words(GRAMMAR_LINES["sa-update"])},
        "sa-del": {"cmd": "command", "words": ["sa", "del", "dst", "192.0.2.2", "spi", "0x1000"]},
        "sa-flush": {"cmd": "command", "words": ["sa", "flush"]},
        "pol-add": {"cmd": "command", "words": words(GRAMMAR_LINES["pol-ports"])},
        "pol-get": {"cmd": "command", "words": words(
            "policy get src 10.1.0.0/16 dst 10.2.0.0/16 dir out")},
        "pol-list": {"cmd": "command", "words": ["policy", "list"]},
        "pol-del": {"cmd": "command", "words": words(GRAMMAR_LINES["pol-del"])},
        "pol-flush": {"cmd": "command", "words": ["policy", "flush"]},
        "batch": {"cmd": "batch", "name": "gw.conf",
                  "text": "".join(sa.batch() for sa in SA_TABLE[:5])},
        "batch-check": {"cmd": "batch", "check": True, "text": GRAMMAR_LINES["pol-block"] + "\n"},
        "batch-bad": {"cmd": "batch", "name": "bad.conf",
                      "text": GRAMMAR_LINES["pol-tunnel"] + "\n" + GRAMMAR_LINES["bad-flag"]},
        "iface": {"cmd": "iface", "words": ["add", "eth0", "role", "public"]},
        "bad-cmd": {"cmd": "reboot"},
        "bad-words": {"cmd": "command", "words": "sa list"},
        "bad-word-type": {"cmd": "command", "words": ["sa", 7]},
        "bad-flag": {"cmd": "command", "words": ["sa", "list"], "show_keys": "yes"},
        "bad-nocmd": {"text": "x"},
        "bad-batch": {"cmd": "batch"},
        "bad-name": {"cmd": "batch", "text": "", "name": 3},
        "bad-cmd-newline": {"cmd": "co block\n"},
        "bad-batch-name-newline": {"cmd": "batch", "name": "gw\nconf", "text": "sa frob\n"},
    }
    seeds = {name: request(r) + "\n" for name, r in reqs.items()}
    seeds["not-json"] = "this is not json\n"
    seeds["array"] = "[1,2,3]\n"
    seeds["nested"] = '{"cmd":"ping","x":' + "[" * 12 + "]" * 12 + "}\n"
    seeds["nested-ok"] = '{"cmd":"ping","x":[[{"a":[1]}]]}\n'
    seeds["utf8"] = '{"cmd":"a' + "\u00e9" * 20 + '"}\n'
    seeds["crlf"] = request(reqs["ping"]) + "\r\n\n  \n" + request(reqs["stats"]) + "\n"
    seeds["session"] = "".join(request(reqs[k]) + "\n" for k in (
        "sa-add", "sa-list-keys", "sa-get", "pol-add", "pol-list", "batch", "sa-update",
        "sa-del", "pol-del", "sa-flush", "stats"))
    return seeds


# ---- fuzz_state -------------------------------------------------------------------------------


def state_seeds():
    full = "".join(sa.batch() for sa in SA_TABLE[:10])
    counters = (f"sa add {SA6} mode tunnel {GCM} flag esn replay-window 1024 replay-seq 99 "
                "replay-seq-hi 3 replay-oseq 16777316 replay-oseq-hi 3\n")
    ifaces = [{"name": "eth0", "role": "public"}, {"name": "eth1", "role": "protected"}]
    states = {
        "empty": {"config": "", "ifaces": []},
        "gateway": {"config": full, "ifaces": ifaces},
        "counters": {"config": counters + GRAMMAR_LINES["pol-tunnel"] + "\n", "ifaces": ifaces},
        "limits": {"config": GRAMMAR_LINES["sa-limits"] + "\n", "ifaces": ifaces[:1]},
        "bad-role": {"config": "", "ifaces": [{"name": "eth0", "role": "both"}]},
        "bad-iface": {"config": "", "ifaces": [{"name": "eth0"}]},
        "bad-role-newline": {"config": "", "ifaces": [{"name": "eth0", "role": "pub\nlic"}]},
        "bad-config": {"config": GRAMMAR_LINES["bad-flag"] + "\n", "ifaces": []},
        "bad-noifaces": {"config": ""},
        "extra-fields": {"config": "", "ifaces": [], "version": 2, "replay": {"0x100": 7}},
    }
    seeds = {name: json.dumps(s, indent=1) + "\n" for name, s in states.items()}
    seeds["not-json"] = "sa add\n"
    seeds["array"] = "[]\n"
    return seeds


# ---- Writing ----------------------------------------------------------------------------------


def write(out, target, seeds):
    d = os.path.join(out, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in sorted(seeds.items()):
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return len(seeds), sum(len(v) for v in seeds.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "seeds"))
    args = ap.parse_args()
    for target, make in (("fuzz_decap", decap_seeds), ("fuzz_grammar", grammar_seeds),
                         ("fuzz_control", control_seeds), ("fuzz_state", state_seeds)):
        n, size = write(args.out, target, make())
        print(f"{target}: {n} seeds, {size} bytes")


if __name__ == "__main__":
    main()
