"""The ESP interop case matrix, with scapy as the independent ESP implementation.

Every case is one transform x mode x address family x NAT-T x ESN. For each case this module
builds deterministic keys and SPIs, the inner traffic, the `ip xfrm`-grammar batch text that
configures xesp, and scapy SecurityAssociations for both directions.

The gateway under test (xesp) is "local"; the peer that scapy plays is "remote":

    10.1.0.0/16 --- [xesp] 192.0.2.1 ====ESP==== 192.0.2.2 [scapy] --- 10.2.0.0/16
    2001:db8:1::/48      2001:db8::1              2001:db8::2          2001:db8:2::/48

In transport mode the two outer addresses are the traffic's own endpoints.

scapy 2.5 quirks worked around here (scapy.layers.ipsec):
  - NAT-T encrypt freezes UDP.len at 8 (the UDP header is built before the ESP payload is
    attached): `seal` rewrites the UDP length and checksum in the finished bytes.
  - `seq_num=0` and `esn=0` arguments mean "unset" (`seq_num or self.seq_num`): `seal` sets
    the SA's own counters instead of passing arguments, so a low half of 0 after the 2^32 wrap
    goes on the wire as 0.
  - UDP 4500 is bound straight to ESP (no non-ESP marker) and decrypting IPv6 transport NAT-T
    touches the wrong layer: `open_esp` strips the UDP header itself before scapy sees it.
  - The HMAC ICV leaves the ESN high half out (RFC 4303 2.2.1 puts it in), so ESN cases with
    CBC/HMAC or NULL/HMAC are skipped; AEAD ESN (the AAD carries the high half) is correct.
  - AES-GCM always uses a 16-byte tag, whatever `crypt_icv_size` says: only ICV 128 is tested.
  - `_ESPPlain.padding` comes back wrong from decrypt: padding is checked here with
    `cryptography` directly (`esp_padding`).

Run this file directly for a self-test of the scapy side: every case's traffic is sealed and
opened again, and the batch text is printed with --conf.
"""

from __future__ import annotations

import hashlib
import ipaddress
import random
import struct
import sys
from dataclasses import dataclass, field

from scapy.config import conf as scapy_conf

scapy_conf.verb = 0

from scapy.layers.inet import ICMP, IP, TCP, UDP  # noqa: E402
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6  # noqa: E402
from scapy.layers.ipsec import ESP, SecurityAssociation  # noqa: E402
from scapy.packet import Raw  # noqa: E402

SEED = 0x5EED_E5B

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
NATT_PORT = 4500
REPLAY_WINDOW = 64

LOCAL_MAC = bytes.fromhex("020000000001")
REMOTE_MAC = bytes.fromhex("020000000002")

OUTER = {
    4: ("192.0.2.1", "192.0.2.2"),          # (local, remote)
    6: ("2001:db8::1", "2001:db8::2"),
}
INNER_NET = {
    4: ("10.1.0.0/16", "10.2.0.0/16"),      # (local, remote)
    6: ("2001:db8:1::/48", "2001:db8:2::/48"),
}
INNER_HOST = {
    4: ("10.1.0.7", "10.2.0.9"),
    6: ("2001:db8:1::7", "2001:db8:2::9"),
}
# Traffic no policy covers: it must leave xesp unchanged.
STRAY_HOST = {
    4: ("198.51.100.1", "198.51.100.2"),
    6: ("2001:db8:99::1", "2001:db8:99::2"),
}

# ESN cases start close to the 2^32 wrap so the high half changes within the run.
ESN_HI = 5
ESN_IN_FIRST = (ESN_HI << 32) | 0xFFFFFFFC           # scapy's first inbound packet
ESN_IN_STATE = 0xFFFFFFF0                            # xesp's replay-seq (low) before it
ESN_OUT_OSEQ = 0xFFFFFFFD                            # xesp's replay-oseq: first out = 5:fffffffe
NON_ESN_OSEQ = 1000                                  # replay-oseq for half of the non-ESN cases


@dataclass(frozen=True)
class Transform:
    name: str
    conf: str                 # `ip xfrm` algorithm words, with {ek} / {ak} for the keys
    scapy_crypt: str
    scapy_auth: str | None
    enc_key_len: int          # AEAD: includes the 4-byte salt
    auth_key_len: int
    icv_len: int
    aead: bool
    ipsecmb: bool             # the intel-ipsec-mb backend is expected to do it

    @property
    def iv_len(self):
        if self.aead:
            return 8
        return 16 if self.scapy_crypt == "AES-CBC" else 0

    @property
    def block(self):
        return 16 if self.scapy_crypt == "AES-CBC" else 4


def _cbc(bits, sha, conf_auth, key_len, icv):
    return Transform(f"aes{bits}cbc-{sha}", "enc 'cbc(aes)' 0x{ek} " + conf_auth, "AES-CBC",
                     {"sha1": "HMAC-SHA1-96", "sha256": "SHA2-256-128",
                      "sha384": "SHA2-384-192", "sha512": "SHA2-512-256"}[sha],
                     bits // 8, key_len, icv, False, True)


# `auth` takes the ICV length xesp defines for each hash (sha1 96, sha256 128, sha384 192,
# sha512 256); `auth-trunc` states it. Both spellings are used.
TRANSFORMS = [
    Transform("aes128gcm", "aead 'rfc4106(gcm(aes))' 0x{ek} 128", "AES-GCM", None,
              16 + 4, 0, 16, True, True),
    Transform("aes192gcm", "aead 'rfc4106(gcm(aes))' 0x{ek} 128", "AES-GCM", None,
              24 + 4, 0, 16, True, True),
    Transform("aes256gcm", "aead 'rfc4106(gcm(aes))' 0x{ek} 128", "AES-GCM", None,
              32 + 4, 0, 16, True, True),
    Transform("chacha20poly1305", "aead 'rfc7539esp(chacha20,poly1305)' 0x{ek} 128",
              "CHACHA20-POLY1305", None, 32 + 4, 0, 16, True, False),
] + [
    _cbc(bits, sha, conf_auth, key_len, icv)
    for bits in (128, 256)
    for sha, conf_auth, key_len, icv in (
        ("sha1", "auth 'hmac(sha1)' 0x{ak}", 20, 12),
        ("sha256", "auth-trunc 'hmac(sha256)' 0x{ak} 128", 32, 16),
        ("sha384", "auth 'hmac(sha384)' 0x{ak}", 48, 24),
        ("sha512", "auth-trunc 'hmac(sha512)' 0x{ak} 256", 64, 32),
    )
] + [
    Transform("null-sha256", "enc 'ecb(cipher_null)' '' auth-trunc 'hmac(sha256)' 0x{ak} 128", "NULL",
              "SHA2-256-128", 0, 32, 16, False, False),
]

# (mode, inner family, outer family)
LAYOUTS = [
    ("tunnel", 4, 4),
    ("tunnel", 6, 6),
    ("tunnel", 4, 6),
    ("tunnel", 6, 4),
    ("transport", 4, 4),
    ("transport", 6, 6),
]


@dataclass
class Keys:
    enc: bytes
    auth: bytes


@dataclass
class Case:
    xf: Transform
    mode: str
    inner: int
    outer: int
    natt: bool
    esn: bool
    linktype: int = LINKTYPE_ETHERNET
    spi_in: int = 0
    spi_out: int = 0
    keys_in: Keys = None
    keys_out: Keys = None
    with_sel: bool = False        # tunnel SAs carry a `sel` selector
    oseq: int = 0                 # replay-oseq of the outbound SA (low half)
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def tunnel(self):
        return self.mode == "tunnel"

    @property
    def name(self):
        if self.inner == self.outer:
            fam = f"v{self.outer}"
        else:
            fam = f"v{self.inner}-in-v{self.outer}"
        words = [self.xf.name, self.mode, fam]
        if self.natt:
            words.append("natt")
        if self.esn:
            words.append("esn")
        if self.linktype == LINKTYPE_RAW:
            words.append("raw-ip")
        return " ".join(words)

    def rng(self, purpose):
        digest = hashlib.sha256(f"{SEED}/{self.name}/{purpose}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    # Sequence numbers (64-bit; the low half goes on the wire).
    def first_in_seq(self):
        return ESN_IN_FIRST if self.esn else 1

    def first_out_seq(self):
        if self.esn:
            return ((ESN_HI << 32) | ESN_OUT_OSEQ) + 1
        return self.oseq + 1

    # Addresses of the outer header, by direction ("in": remote -> local, "out": the reverse).
    def outer_addrs(self, direction):
        local, remote = OUTER[self.outer]
        return (remote, local) if direction == "in" else (local, remote)

    def inner_addrs(self, direction):
        if not self.tunnel:
            return self.outer_addrs(direction)
        local, remote = INNER_HOST[self.inner]
        return (remote, local) if direction == "in" else (local, remote)

    def inner_nets(self, direction):
        local, remote = INNER_NET[self.inner]
        return (remote, local) if direction == "in" else (local, remote)

    def spi(self, direction):
        return self.spi_in if direction == "in" else self.spi_out

    def keys(self, direction):
        return self.keys_in if direction == "in" else self.keys_out


def skip_reason(xf, esn):
    if esn and not xf.aead:
        return "scapy leaves the ESN high half out of the HMAC ICV (RFC 4303 2.2.1)"
    return None


def build_matrix():
    """All cases, and the (name, reason) pairs of the combinations scapy cannot check."""
    cases, skipped = [], []
    for xf in TRANSFORMS:
        for mode, inner, outer in LAYOUTS:
            for natt in (False, True):
                for esn in (False, True):
                    case = Case(xf, mode, inner, outer, natt, esn)
                    reason = skip_reason(xf, esn)
                    if reason:
                        skipped.append((case.name, reason))
                        continue
                    cases.append(case)
    # Raw-IP captures (no Ethernet header), one transform, every layout.
    for mode, inner, outer in LAYOUTS:
        cases.append(Case(TRANSFORMS[0], mode, inner, outer, False, False,
                          linktype=LINKTYPE_RAW))
    for i, case in enumerate(cases):
        _fill(case, i)
    return cases, skipped


def _fill(case, index):
    r = case.rng("keys")
    xf = case.xf

    def key(n):
        return bytes(r.getrandbits(8) for _ in range(n))

    case.keys_in = Keys(key(xf.enc_key_len), key(xf.auth_key_len))
    case.keys_out = Keys(key(xf.enc_key_len), key(xf.auth_key_len))
    case.spi_in = r.randrange(0x1000, 0xFFFFFFFF)
    case.spi_out = r.randrange(0x1000, 0xFFFFFFFF)
    case.with_sel = case.tunnel and (case.inner != case.outer or index % 2 == 0)
    case.oseq = NON_ESN_OSEQ if (not case.esn and index % 2 == 1) else 0
    case.seed = index


# --------------------------------------------------------------------------------------------
# Batch text (the `ip xfrm` grammar without the leading `ip xfrm`)


def _prefix(addr):
    return f"{addr}/{ipaddress.ip_address(addr).max_prefixlen}"


def sa_line(case, direction):
    src, dst = case.outer_addrs(direction)
    keys = case.keys(direction)
    words = [f"sa add src {src} dst {dst} proto esp spi 0x{case.spi(direction):08x} reqid 1",
             f"mode {case.mode}",
             case.xf.conf.format(ek=keys.enc.hex(), ak=keys.auth.hex()),
             f"replay-window {REPLAY_WINDOW}"]
    if case.esn:
        words.append("flag esn")
    if direction == "in" and case.esn:
        words.append(f"replay-seq {ESN_IN_STATE} replay-seq-hi {ESN_HI}")
    if direction == "out":
        if case.esn:
            words.append(f"replay-oseq {ESN_OUT_OSEQ} replay-oseq-hi {ESN_HI}")
        elif case.oseq:
            words.append(f"replay-oseq {case.oseq}")
    if case.natt:
        any_addr = "0.0.0.0" if case.outer == 4 else "::"
        words.append(f"encap espinudp {NATT_PORT} {NATT_PORT} {any_addr}")
    if case.with_sel:
        s, d = case.inner_nets(direction)
        words.append(f"sel src {s} dst {d}")
    return " ".join(words)


def policy_line(case, direction):
    src, dst = case.outer_addrs(direction)
    if case.tunnel:
        s, d = case.inner_nets(direction)
        tmpl = f"tmpl src {src} dst {dst} proto esp reqid 1 mode tunnel"
    else:
        s, d = _prefix(src), _prefix(dst)
        tmpl = "tmpl proto esp reqid 1 mode transport"
    return f"policy add src {s} dst {d} dir {direction} {tmpl}"


def conf_text(case, direction):
    """The batch for one direction: its SA and its policy."""
    return sa_line(case, direction) + "\n" + policy_line(case, direction) + "\n"


# --------------------------------------------------------------------------------------------
# Traffic


def _ip(family, src, dst, **kw):
    if family == 4:
        return IP(src=src, dst=dst, id=kw.pop("id", 1), tos=kw.pop("tos", 0), **kw)
    kw.pop("id", None)
    kw.pop("flags", None)
    return IPv6(src=src, dst=dst, tc=kw.pop("tos", 0), fl=kw.pop("fl", 0), **kw)


def _echo(family, payload):
    if family == 4:
        return ICMP(type=8, id=0x4242, seq=7) / Raw(payload)
    return ICMPv6EchoRequest(id=0x4242, seq=7, data=payload)


def inner_packets(case, direction):
    """The plaintext IP packets of one direction, as bytes: UDP, TCP and ICMP of several sizes
    (0-byte payload, odd sizes, 1361 B so that the outer packet stays within 1500 B with any
    transform), some with a DSCP or ECT(0)."""
    r = case.rng(f"traffic/{direction}")
    fam = case.inner
    src, dst = case.inner_addrs(direction)

    def payload(n):
        return bytes(r.getrandbits(8) for _ in range(n))

    hdr = 20 if fam == 4 else 40
    big = 1360 - hdr - 8
    pkts = [
        _ip(fam, src, dst, id=0x1001) / UDP(sport=5353, dport=9),
        _ip(fam, src, dst, id=0x1002, tos=0xB8) / UDP(sport=40000, dport=53) / Raw(payload(37)),
        _ip(fam, src, dst, id=0x1003, flags="DF") /
        TCP(sport=33000, dport=443, flags="S", seq=1000, options=[("MSS", 1360)]),
        _ip(fam, src, dst, id=0x1004, tos=0x28, flags="DF") /
        TCP(sport=33000, dport=443, flags="PA", seq=1001, ack=77) / Raw(payload(1001)),
        _ip(fam, src, dst, id=0x1005) / _echo(fam, payload(56)),
        _ip(fam, src, dst, id=0x1006, tos=0x02) /
        UDP(sport=4242, dport=4243) / Raw(payload(big + 1)),
    ]
    return [bytes(p) for p in pkts]


def stray_packet(case, direction):
    """Plaintext no policy of `direction` covers."""
    fam = case.inner if case.tunnel else case.outer
    src, dst = STRAY_HOST[fam]
    return bytes(_ip(fam, src, dst, id=0x2001) / UDP(sport=7, dport=7) / Raw(b"stray"))


def frame(case, ip_bytes, direction="in", pad=False):
    """An IP packet as a frame of the case's capture type. Ethernet frames shorter than 60
    bytes are padded with zeros when `pad` is set, as they are on the wire."""
    if case.linktype == LINKTYPE_RAW:
        return ip_bytes
    ethertype = ETH_IPV4 if ip_bytes[0] >> 4 == 4 else ETH_IPV6
    dst, src = (LOCAL_MAC, REMOTE_MAC) if direction == "in" else (REMOTE_MAC, LOCAL_MAC)
    f = dst + src + struct.pack("!H", ethertype) + ip_bytes
    if pad and len(f) < 60:
        f += bytes(60 - len(f))
    return f


def l3_offset(linktype):
    return 14 if linktype == LINKTYPE_ETHERNET else 0


# --------------------------------------------------------------------------------------------
# ESP with scapy


def scapy_sa(case, direction):
    keys = case.keys(direction)
    xf = case.xf
    tunnel_header = None
    if case.tunnel:
        src, dst = case.outer_addrs(direction)
        tunnel_header = IP(src=src, dst=dst) if case.outer == 4 else IPv6(src=src, dst=dst)
    return SecurityAssociation(
        ESP, spi=case.spi(direction),
        crypt_algo=xf.scapy_crypt, crypt_key=keys.enc or None,
        auth_algo=xf.scapy_auth, auth_key=keys.auth or None,
        tunnel_header=tunnel_header,
        nat_t_header=UDP(sport=NATT_PORT, dport=NATT_PORT) if case.natt else None,
        esn_en=case.esn)


def aead_iv(seq64):
    """The IV xesp writes for the AEADs: the 64-bit sequence number (RFC 4106 8.1 allows a
    counter), big endian, high half first."""
    return struct.pack("!Q", seq64)


def seal(case, direction, inner, seq64, iv=None, sa=None):
    """Encrypt one inner IP packet (bytes) with scapy; return the outer IP packet (bytes)."""
    sa = sa or scapy_sa(case, direction)
    if iv is None:
        if case.xf.aead:
            iv = aead_iv(seq64)
        elif case.xf.iv_len:
            iv = case.rng(f"iv/{direction}/{seq64}/{len(inner)}").randbytes(case.xf.iv_len)
    # Counters set on the SA itself: scapy reads a 0 argument as "unset".
    sa.seq_num = seq64 & 0xFFFFFFFF
    sa.esn = (seq64 >> 32) if case.esn else 0
    pkt = IP(inner) if inner[0] >> 4 == 4 else IPv6(inner)
    out = bytes(sa.encrypt(pkt, iv=iv))
    if case.natt:
        out = _fix_natt(out)
    return out


def _fix_natt(pkt):
    """Rewrite UDP.len (scapy leaves 8) and the checksum: 0 in IPv4 (RFC 3948 2.1), computed in
    IPv6, where a zero UDP checksum is not allowed."""
    b = bytearray(pkt)
    hl = ip_header_len(b)
    ulen = len(b) - hl
    struct.pack_into("!H", b, hl + 4, ulen)
    struct.pack_into("!H", b, hl + 6, 0)
    if b[0] >> 4 == 6:
        struct.pack_into("!H", b, hl + 6, udp_checksum(bytes(b)))
    return bytes(b)


def strip_natt(pkt):
    """IP/UDP/ESP -> IP/ESP with lengths, protocol and checksum fixed."""
    b = bytearray(pkt)
    hl = ip_header_len(b)
    del b[hl:hl + 8]
    if b[0] >> 4 == 4:
        b[9] = 50
        struct.pack_into("!H", b, 2, len(b))
        struct.pack_into("!H", b, 10, 0)
        struct.pack_into("!H", b, 10, inet_checksum(bytes(b[:hl])))
    else:
        b[6] = 50
        struct.pack_into("!H", b, 4, len(b) - 40)
    return bytes(b)


def open_esp(case, direction, outer, seq_hi=0, sa=None):
    """Decrypt and verify one outer packet (bytes) with scapy; return the inner (tunnel) or
    rebuilt (transport) IP packet as bytes. Raises on an ICV failure."""
    sa = sa or scapy_sa(case, direction)
    if case.natt:
        outer = strip_natt(outer)
    sa.esn = seq_hi if case.esn else 0
    pkt = IP(outer) if outer[0] >> 4 == 4 else IPv6(outer)
    return bytes(sa.decrypt(pkt))


def esp_offset(pkt):
    """Offset of the ESP header in an outer IP packet (after UDP if NAT-T), or None."""
    hl = ip_header_len(pkt)
    proto = pkt[9] if pkt[0] >> 4 == 4 else pkt[6]
    if proto == 50:
        return hl
    if proto == 17:
        return hl + 8
    return None


def esp_padding(case, direction, esp):
    """(padding bytes, pad length, next header) of one ESP packet (bytes from the SPI on),
    decrypted with `cryptography` directly. Non-AEAD transforms only (for the AEADs the ESP
    bytes are compared whole)."""
    xf = case.xf
    icv = xf.icv_len
    body = esp[8:len(esp) - icv]
    if xf.scapy_crypt == "AES-CBC":
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        iv, ct = body[:16], body[16:]
        dec = Cipher(algorithms.AES(case.keys(direction).enc), modes.CBC(iv)).decryptor()
        plain = dec.update(ct) + dec.finalize()
    else:
        plain = body
    padlen, nh = plain[-2], plain[-1]
    return plain[len(plain) - 2 - padlen:len(plain) - 2], padlen, nh


# --------------------------------------------------------------------------------------------
# Bytes-level helpers: checksums, normalisation, pcap


def inet_checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def udp_checksum(ip_pkt):
    """UDP checksum of an IPv4 or IPv6 packet whose UDP header follows the fixed header; the
    packet's checksum field is taken as zero."""
    hl = ip_header_len(ip_pkt)
    udp = bytearray(ip_pkt[hl:])
    udp[6:8] = b"\0\0"
    if ip_pkt[0] >> 4 == 4:
        pseudo = ip_pkt[12:20] + struct.pack("!BBH", 0, 17, len(udp))
    else:
        pseudo = ip_pkt[8:40] + struct.pack("!IxxxB", len(udp), 17)
    c = inet_checksum(pseudo + bytes(udp))
    return c or 0xFFFF


def ip_header_len(pkt):
    return (pkt[0] & 0x0F) * 4 if pkt[0] >> 4 == 4 else 40


def ip_total_len(pkt):
    if pkt[0] >> 4 == 4:
        return struct.unpack_from("!H", pkt, 2)[0]
    return 40 + struct.unpack_from("!H", pkt, 4)[0]


def ipv4_checksum_ok(pkt):
    return inet_checksum(bytes(pkt[:ip_header_len(pkt)])) == 0


# Fields that may differ between two copies of one IP header without either being wrong.
IP_FIELDS_ROUTER = ("ttl", "chksum")                       # a forwarder decrements TTL
IP_FIELDS_OUTER = ("tos", "ttl", "id", "flags", "chksum")  # a header the sender makes up


def normalise_ip(pkt, fields):
    """Zero the named header fields of an IP packet (bytes). IPv6: tos = traffic class (and
    flow label), ttl = hop limit; id, flags and chksum do not exist."""
    b = bytearray(pkt)
    if not b:
        return bytes(b)
    if b[0] >> 4 == 4:
        if "tos" in fields:
            b[1] = 0
        if "id" in fields:
            b[4:6] = b"\0\0"
        if "flags" in fields:
            b[6] &= 0x1F
        if "ttl" in fields:
            b[8] = 0
        if "chksum" in fields:
            b[10:12] = b"\0\0"
    else:
        if "tos" in fields:
            b[0] &= 0xF0
            b[1] = 0
            b[2] = b[3] = 0
        if "ttl" in fields:
            b[7] = 0
    return bytes(b)


PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D


def write_pcap(path, frames, linktype):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", PCAP_MAGIC_US, 2, 4, 0, 0, 65535, linktype))
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1700000000 + i, i, len(fr), len(fr)))
            f.write(fr)


def read_pcap(path):
    """(linktype, [frame bytes]) of a classic pcap file, either byte order and resolution."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than a pcap header")
    magic = struct.unpack_from("<I", data)[0]
    if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
        e = "<"
    elif struct.unpack_from(">I", data)[0] in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
        e = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file (magic 0x{magic:08x})")
    linktype = struct.unpack_from(e + "I", data, 20)[0] & 0x0FFFFFFF
    frames, off = [], 24
    while off < len(data):
        if off + 16 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {off}")
        _, _, incl, orig = struct.unpack_from(e + "IIII", data, off)
        off += 16
        if off + incl > len(data):
            raise ValueError(f"{path}: truncated record at byte {off}")
        if incl != orig:
            raise ValueError(f"{path}: frame {len(frames)} cut to {incl} of {orig} bytes")
        frames.append(data[off:off + incl])
        off += incl
    return linktype, frames


# --------------------------------------------------------------------------------------------
# Self-test of the scapy side: no xesp involved


def _selftest(show_conf):
    from scapy.layers.ipsec import IPSecIntegrityError

    cases, skipped = build_matrix()
    failures = 0
    for case in cases:
        try:
            for direction in ("in", "out"):
                start = case.first_in_seq() if direction == "in" else case.first_out_seq()
                for k, inner in enumerate(inner_packets(case, direction)):
                    seq = start + k
                    outer = seal(case, direction, inner, seq)
                    assert ip_total_len(outer) == len(outer), "outer length"
                    if outer[0] >> 4 == 4:
                        assert ipv4_checksum_ok(outer), "outer IPv4 checksum"
                    off = esp_offset(outer)
                    if case.natt:
                        assert struct.unpack_from("!H", outer, off - 4)[0] == len(outer) - off + 8
                    spi, lo = struct.unpack_from("!II", outer, off)
                    assert spi == case.spi(direction) and lo == seq & 0xFFFFFFFF, "spi/seq"
                    back = open_esp(case, direction, outer, seq >> 32)
                    if case.tunnel:
                        assert back == inner, "tunnel round trip"
                    else:
                        assert normalise_ip(back, IP_FIELDS_ROUTER) == \
                            normalise_ip(inner, IP_FIELDS_ROUTER), "transport round trip"
                    if not case.xf.aead:
                        pad, padlen, _ = esp_padding(case, direction, outer[off:])
                        assert pad == bytes(range(1, padlen + 1)), "padding"
                    bad = bytearray(outer)
                    bad[-1] ^= 0x01
                    try:
                        open_esp(case, direction, bytes(bad), seq >> 32)
                        raise AssertionError("flipped ICV accepted")
                    except IPSecIntegrityError:
                        pass
                    if case.esn:
                        try:
                            open_esp(case, direction, outer, (seq >> 32) + 1)
                            raise AssertionError("wrong ESN high half accepted")
                        except IPSecIntegrityError:
                            pass
            print(f"ok   {case.name}")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL {case.name}: {type(e).__name__}: {e}")
        if show_conf:
            print(conf_text(case, "in") + conf_text(case, "out"), end="")
    for name, reason in skipped:
        print(f"skip {name}: {reason}")
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_selftest("--conf" in sys.argv[1:]))
