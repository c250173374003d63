#!/bin/bash
# xesp encrypts, Wireshark's own ESP code (tshark) decrypts and checks the ICV.
#
#   plain.pcap --[xesp pcap, outbound SA]--> esp.pcap --[tshark -o uat:esp_sa:...]--> fields
#
#   10.1.0.7 -> 10.2.0.9 UDP, tunnel 192.0.2.1 -> 192.0.2.2, IPv4, no ESN, no NAT-T
#
# Transforms: AES-GCM-128 (ICV 16) and AES-CBC-128 + HMAC-SHA-256-128, the two tshark 4.0
# decrypts. Every frame must show esp.icv_good = 1 and the inner UDP payload sent; a run with a
# wrong key must not (so a tshark that checks nothing cannot pass).
#
# Usage: bash test_tshark.sh XESP PYTHON
set -u

XESP=${1:?usage: test_tshark.sh XESP PYTHON}
PYTHON=${2:-/usr/bin/python3}

if ! command -v tshark >/dev/null 2>&1; then
    echo "SKIP: tshark is not installed"
    exit 77
fi
if [ ! -x "$XESP" ]; then
    echo "FAIL: $XESP is not an executable"
    exit 1
fi

WORK=$(mktemp -d /tmp/xesp-tshark.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# Plaintext frames and the expected payloads: UDP 10.1.0.7:40000 -> 10.2.0.9:40001 with
# payloads of 0, 1, 13, 64, 255 and 1000 bytes. Pure Python: no scapy needed here.
"$PYTHON" - "$WORK" <<'EOF' || exit 1
import struct, sys

work = sys.argv[1]

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF

src, dst = bytes([10, 1, 0, 7]), bytes([10, 2, 0, 9])
frames, payloads = [], []
for i, n in enumerate((0, 1, 13, 64, 255, 1000)):
    payload = bytes((i * 37 + k * 11) & 0xFF for k in range(n))
    udp = struct.pack("!HHHH", 40000, 40001, 8 + n, 0) + payload
    c = csum(src + dst + struct.pack("!BBH", 0, 17, len(udp)) + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0x100 + i, 0, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    frames.append(bytes.fromhex("020000000002020000000001") + b"\x08\x00" + ip + udp)
    payloads.append(payload.hex())
with open(f"{work}/plain.pcap", "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i, fr in enumerate(frames):
        f.write(struct.pack("<IIII", 1700000000 + i, 0, len(fr), len(fr)) + fr)
with open(f"{work}/payloads", "w") as f:
    f.write("\n".join(payloads) + "\n")
EOF

# A key with its last bit flipped.
flip_key() {
    local k=$1
    printf '%s%x' "${k%?}" $(( 0x${k: -1} ^ 1 ))
}

# check NAME SPI XFRM-ALGO TSHARK-ENC ENC-KEY TSHARK-AUTH AUTH-KEY
check() {
    local name=$1 spi=$2 algo=$3 tenc=$4 ekey=$5 tauth=$6 akey=$7
    local dir="$WORK/$name"
    mkdir -p "$dir"
    cat >"$dir/conf" <<EOF
sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi $spi reqid 1 mode tunnel $algo replay-window 64
policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel
EOF
    if ! "$XESP" pcap -b "$dir/conf" --in "$WORK/plain.pcap" --out "$dir/esp.pcap" \
            >"$dir/xesp.out" 2>&1; then
        echo "FAIL $name: xesp pcap failed: $(tail -n 3 "$dir/xesp.out")"
        return 1
    fi
    # The wrong key is the one the ICV depends on: the AEAD key, or the HMAC key.
    local sa_ok sa_bad head="\"IPv4\",\"192.0.2.1\",\"192.0.2.2\",\"$spi\",\"$tenc\""
    if [ "$tauth" = NULL ]; then
        sa_ok="$head,\"0x$ekey\",\"NULL\",\"\""
        sa_bad="$head,\"0x$(flip_key "$ekey")\",\"NULL\",\"\""
    else
        sa_ok="$head,\"0x$ekey\",\"$tauth\",\"0x$akey\""
        sa_bad="$head,\"0x$ekey\",\"$tauth\",\"0x$(flip_key "$akey")\""
    fi
    local fields=(-T fields -E separator=/t -e frame.number -e esp.spi -e esp.sequence
                  -e esp.icv_good -e ip.src -e ip.dst -e udp.dstport -e data.data)
    tshark -n -r "$dir/esp.pcap" -o esp.enable_encryption_decode:TRUE \
        -o esp.enable_authentication_check:TRUE -o "uat:esp_sa:$sa_ok" \
        "${fields[@]}" >"$dir/good.tsv" 2>"$dir/good.err"
    tshark -n -r "$dir/esp.pcap" -o esp.enable_encryption_decode:TRUE \
        -o esp.enable_authentication_check:TRUE -o "uat:esp_sa:$sa_bad" \
        "${fields[@]}" >"$dir/bad.tsv" 2>"$dir/bad.err"
    "$PYTHON" - "$name" "$spi" "$WORK/payloads" "$dir/good.tsv" "$dir/bad.tsv" <<'EOF'
import sys

name, spi, payload_file, good, bad = sys.argv[1:]
payloads = open(payload_file).read().split("\n")[:-1]
rows = [l.rstrip("\n").split("\t") for l in open(good) if l.strip()]
problems = []
if len(rows) != len(payloads):
    problems.append(f"tshark shows {len(rows)} frames, expected {len(payloads)}")
for k, (row, want) in enumerate(zip(rows, payloads)):
    row += [""] * (8 - len(row))
    num, r_spi, seq, icv_good, ips, ipd, dport, data = row[:8]
    where = f"frame {num}"
    if int(r_spi, 16) != int(spi, 16):
        problems.append(f"{where}: SPI {r_spi}, expected {spi}")
    if seq != str(k + 1):
        problems.append(f"{where}: sequence {seq}, expected {k + 1}")
    if icv_good != "1":
        problems.append(f"{where}: esp.icv_good is {icv_good or 'missing'}")
    if ips != "192.0.2.1,10.1.0.7" or ipd != "192.0.2.2,10.2.0.9":
        problems.append(f"{where}: addresses {ips} -> {ipd}, expected outer 192.0.2.1 -> "
                        "192.0.2.2 around 10.1.0.7 -> 10.2.0.9")
    if dport != "40001":
        problems.append(f"{where}: inner UDP port {dport or 'missing'}, expected 40001")
    if data.replace(":", "") != want:
        problems.append(f"{where}: inner payload {len(data.replace(':', '')) // 2} bytes "
                        f"differs from the {len(want) // 2} bytes sent")
bad_rows = [l.rstrip("\n").split("\t") for l in open(bad) if l.strip()]
if len(bad_rows) != len(payloads) or any(len(r) < 4 or r[3] != "0" for r in bad_rows):
    problems.append("with a wrong key tshark does not report every ICV bad: the check "
                    "proves nothing")
if problems:
    print(f"FAIL {name}: " + "; ".join(problems[:6]))
    sys.exit(1)
print(f"ok   {name}: {len(rows)} frames, tshark decrypts them and finds every ICV good")
EOF
}

GCM_KEY=00112233445566778899aabbccddeeff01020304       # 16-byte key + 4-byte salt
CBC_KEY=000102030405060708090a0b0c0d0e0f
HMAC_KEY=$(printf '%02x' $(seq 100 131))

fails=0
check aes128gcm 0x0000a001 "aead 'rfc4106(gcm(aes))' 0x$GCM_KEY 128" \
    "AES-GCM with 16 octet ICV [RFC4106]" "$GCM_KEY" NULL "" || fails=$((fails + 1))
check aes128cbc-sha256 0x0000a002 \
    "enc 'cbc(aes)' 0x$CBC_KEY auth-trunc 'hmac(sha256)' 0x$HMAC_KEY 128" \
    "AES-CBC [RFC3602]" "$CBC_KEY" "HMAC-SHA-256-128 [RFC4868]" "$HMAC_KEY" ||
    fails=$((fails + 1))

echo "$((2 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
