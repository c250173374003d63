#!/bin/bash
# Path MTU through `xesp pcap --mtu`: a DF-set IPv4 packet and an IPv6 packet that no longer
# fit once encrypted come back as ICMP "fragmentation needed" / ICMPv6 "packet too big" with
# the MTU that fits; scapy, not our code, checks the checksums and fields. A packet that fits
# is encrypted, and an IPv4 packet without DF is encrypted whatever its size.
#
# Usage: bash test_mtu.sh XESP PYTHON
set -u
XESP=${1:?usage: test_mtu.sh XESP PYTHON}
PYTHON=${2:-/usr/bin/python3}
if ! "$PYTHON" -c 'import scapy' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON cannot import scapy (Debian: apt-get install python3-scapy)"
    exit 77
fi
work=$(mktemp -d /tmp/xesp-mtu.XXXXXX)
trap 'rm -rf "$work"' EXIT
KEY=0x$(printf '%02x' $(seq 1 20) | tr -d ' \n')
cat >"$work/gw.conf" <<CONF
sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000 reqid 1 mode tunnel aead 'rfc4106(gcm(aes))' $KEY 128
policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel
policy add src fd01::/16 dst fd02::/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel
CONF
exec "$PYTHON" - "$XESP" "$work" <<'PY'
import json, subprocess, sys
from scapy.all import Ether, IP, IPv6, UDP, ICMP, ICMPv6PacketTooBig, Raw, rdpcap, wrpcap
xesp, work = sys.argv[1], sys.argv[2]
MTU = 1400
# tunnel over IPv4 with AES-GCM: 20 IP + 8 ESP + 8 IV + 16 ICV = 52; room 1348 (multiple of 4) - 2
FITS = 1346
eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
def udp4(size, df=True):
    return eth / IP(src="10.1.0.1", dst="10.2.0.1", flags="DF" if df else 0) / UDP(sport=1, dport=2) / Raw(b"x" * (size - 28))
def udp6(size):
    return eth / IPv6(src="fd01::1", dst="fd02::1") / UDP(sport=1, dport=2) / Raw(b"y" * (size - 48))
frames = [udp4(FITS), udp4(FITS + 1), udp4(FITS + 200, df=False), udp6(FITS + 1), udp6(FITS)]
wrpcap(f"{work}/in.pcap", frames)
r = subprocess.run([xesp, "pcap", "-b", f"{work}/gw.conf", "--in", f"{work}/in.pcap",
                    "--out", f"{work}/out.pcap", "--mtu", str(MTU), "--icmp-src", "10.1.0.254",
                    "--icmp-src", "fd01::fe", "--json"], capture_output=True, text=True)
passed = failed = 0
def check(what, cond):
    global passed, failed
    print(("ok   " if cond else "FAIL ") + what)
    passed, failed = passed + bool(cond), failed + (not cond)
check("xesp pcap ran", r.returncode == 0)
out = rdpcap(f"{work}/out.pcap")
check("every input gave one output", len(out) == len(frames))
stats = json.loads(r.stdout) if r.returncode == 0 else {}
check("two ICMP errors counted", stats.get("too_big") == 2)
check("three packets encrypted", stats.get("encrypted") == 3)


enc = out[0]
check("a packet that fits is encrypted", IP in enc and enc[IP].proto == 50 and len(enc[IP]) <= MTU)
icmp = out[1]
check("IPv4 DF too big: ICMP type 3 code 4", ICMP in icmp and icmp[ICMP].type == 3 and icmp[ICMP].code == 4)
if ICMP in icmp:
    check("  next-hop MTU is what fits", icmp[ICMP].nexthopmtu == FITS)
    check("  from the gateway to the sender", icmp[IP].src == "10.1.0.254" and icmp[IP].dst == "10.1.0.1")
    rebuilt = IP(bytes(icmp[IP]))
    want_ip, want_icmp = rebuilt.chksum, rebuilt[ICMP].chksum
    del rebuilt.chksum
    del rebuilt[ICMP].chksum
    rebuilt = IP(bytes(rebuilt))
    check("  checksums as scapy computes them", rebuilt.chksum == want_ip and rebuilt[ICMP].chksum == want_icmp)
    check("  576 bytes, quoting the original", len(icmp[IP]) == 576 and bytes(icmp[ICMP].payload)[:28] == bytes(frames[1][IP])[:28])
    check("  sent back: MACs swapped", icmp.src == frames[1].dst and icmp.dst == frames[1].src)
nodf = out[2]
check("IPv4 without DF is encrypted, DF clear outside", IP in nodf and nodf[IP].proto == 50 and not (nodf[IP].flags & 2))
ptb = out[3]
check("IPv6 too big: ICMPv6 packet too big", ICMPv6PacketTooBig in ptb)
if ICMPv6PacketTooBig in ptb:
    check("  MTU is what fits", ptb[ICMPv6PacketTooBig].mtu == FITS)
    check("  from the gateway to the sender", ptb[IPv6].src == "fd01::fe" and ptb[IPv6].dst == "fd01::1")
    rebuilt = IPv6(bytes(ptb[IPv6]))
    want = rebuilt[ICMPv6PacketTooBig].cksum
    del rebuilt[ICMPv6PacketTooBig].cksum
    check("  checksum as scapy computes it", IPv6(bytes(rebuilt))[ICMPv6PacketTooBig].cksum == want)
    check("  1280 bytes in all", len(ptb[IPv6]) == 1280)
check("an IPv6 packet that fits is encrypted", IP in out[4] and out[4][IP].proto == 50)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
