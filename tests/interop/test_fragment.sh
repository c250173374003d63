#!/bin/bash
# Fragmenting the outer packet (userspace/esp/fragment.h), checked by scapy:
#
#   scapy plain IPv4/IPv6 ---+
#                            +--> IN.pcap --[fragment_tool MTU]--> OUT.pcap --> scapy
#   xesp pcap: ESP ----------+      (one run per MTU)                 defragment / defragment6,
#                                                                     every fragment parsed,
#                                                                     ESP decrypted
#
# See check_fragment.py for what each case checks. fragment_tool is the driver built next to
# the unit tests; CMake passes its path in XESP_FRAGMENT_TOOL.
#
# Usage: bash test_fragment.sh XESP PYTHON
# Exit: 0 all passed, 1 a case failed, 77 PYTHON has no scapy (or no cryptography for it).
set -u

XESP=${1:?usage: test_fragment.sh XESP PYTHON}
PYTHON=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=${XESP_FRAGMENT_TOOL:-$(dirname "$XESP")/tests/fragment_tool}

if ! "$PYTHON" -c 'from scapy.config import conf; import sys; sys.exit(not conf.crypto_valid)' \
        >/dev/null 2>&1; then
    echo "SKIP: $PYTHON has no scapy with 'cryptography'" \
         "(Debian: apt-get install python3-scapy python3-cryptography)"
    exit 77
fi
for exe in "$XESP" "$TOOL"; do
    if [ ! -x "$exe" ]; then
        echo "FAIL: $exe is not an executable"
        exit 1
    fi
done

WORK=$(mktemp -d /tmp/xesp-fragment.XXXXXX)
# Kept when a case fails, for a look at its captures.
trap '[ "$?" -eq 0 ] && rm -rf "$WORK"' EXIT

"$PYTHON" "$HERE/check_fragment.py" "$XESP" "$TOOL" "$WORK"
