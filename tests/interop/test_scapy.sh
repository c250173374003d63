#!/bin/bash
# ESP interop of `xesp pcap` with scapy, over the whole case matrix (esp_cases.py):
#
#   scapy seal --> IN.pcap --[xesp pcap, inbound SA]--> OUT.pcap == plaintext
#   plaintext  --> IN.pcap --[xesp pcap, outbound SA]--> OUT.pcap --> scapy open == plaintext
#
# with both crypto backends (openssl, ipsecmb). See run_interop.py for what each case checks.
#
# Usage: bash test_scapy.sh XESP PYTHON
# Exit: 0 all passed, 1 a case failed, 77 PYTHON has no scapy (or no cryptography for it).
set -u

XESP=${1:?usage: test_scapy.sh XESP PYTHON}
PYTHON=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "SKIP: no Python interpreter at $PYTHON"
    exit 77
fi
if ! "$PYTHON" -c 'import scapy.layers.ipsec' >/dev/null 2>&1; then
    echo "SKIP: $PYTHON cannot import scapy (Debian: apt-get install python3-scapy)"
    exit 77
fi
if ! "$PYTHON" -c 'from scapy.config import conf; import sys; sys.exit(not conf.crypto_valid)' \
        >/dev/null 2>&1; then
    echo "SKIP: scapy under $PYTHON has no 'cryptography' module, so no ESP crypto" \
         "(Debian: apt-get install python3-cryptography)"
    exit 77
fi
if [ ! -x "$XESP" ]; then
    echo "FAIL: $XESP is not an executable"
    exit 1
fi

WORK=$(mktemp -d /tmp/xesp-scapy.XXXXXX)
# Kept when a case fails, for a look at its captures and batches.
trap '[ "$?" -eq 0 ] && rm -rf "$WORK"' EXIT

"$PYTHON" "$HERE/run_interop.py" "$XESP" --work "$WORK"
