#!/bin/bash
# A batch that a running daemon refuses names the file and line at fault, whatever refuses it:
# the grammar, or the daemon's crypto backend (here ipsecmb, which does not implement
# ChaCha20-Poly1305). One line of error, and nothing of the batch applied; `batch --check`
# finds the same, and so does a daemon given the file at start; a single `sa add` is refused
# naming the SA the same way.
#
# Usage: bash test_daemon_batch.sh XESP
# Needs root (the daemon); skips (exit 77) without.
set -u
XESP=${1:?usage: test_daemon_batch.sh XESP}
source "$(cd "$(dirname "$0")" && pwd)/daemon_lib.sh" batch

"$XESP" daemon --socket "$XESP_SOCKET" --no-state --crypto ipsecmb >>"$work/daemon.log" 2>&1 &
daemon=$!
wait_answer 0

cat >"$work/mixed.conf" <<'CONF'
sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x100 reqid 1 mode tunnel aead rfc4106(gcm(aes)) 0x000102030405060708090a0b0c0d0e0f10111213 128
# ChaCha20-Poly1305: a good line, which this backend cannot run.
sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x101 reqid 2 mode tunnel aead rfc7539esp(chacha20,poly1305) 0x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223 128
sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x102 reqid 3 mode tunnel aead rfc4106(gcm(aes)) 0x000102030405060708090a0b0c0d0e0f10111213 128
CONF
one_line_at_3() { # ERRFILE
    cat "$1"
    [ "$(wc -l <"$1")" = 1 ] && grep -q "^xesp: mixed.conf:3: SA dst 192.0.2.2 spi 0x00000101: crypto backend 'ipsecmb'" "$1"
}
check "batch: refused" bash -c "cd '$work' && ! '$XESP' batch mixed.conf 2>err"
check "... in one line naming mixed.conf:3 and the backend" one_line_at_3 "$work/err"
check "... and nothing of it applied" [ -z "$("$XESP" sa list)" ]
check "batch --check: refused the same" bash -c "cd '$work' && ! '$XESP' batch --check mixed.conf 2>err.check"
check "... in the same words" cmp "$work/err" "$work/err.check"
# The same file given to a daemon at start (-b): refused at the same line; no daemon.
start_refused() {
    ! timeout 30 "$XESP" daemon --socket "$work/other.sock" --no-state --crypto ipsecmb \
        -b "$work/mixed.conf" 2>"$work/err.b" || return 1
    cat "$work/err.b"
    grep -q "mixed.conf:3: SA dst 192.0.2.2 spi 0x00000101: crypto backend 'ipsecmb'" "$work/err.b"
}
check "daemon -b: refused at its line" start_refused
# The same SA in a single command: refused in one line that names it as the batch does.
single_refused() {
    local out
    if out=$("$XESP" sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x103 reqid 4 mode tunnel \
        aead 'rfc7539esp(chacha20,poly1305)' \
        0x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223 128 2>&1); then
        echo "answered ok: $out"
        return 1
    fi
    echo "$out"
    [ "$(echo "$out" | wc -l)" = 1 ] &&
        [[ $out == "xesp: SA dst 192.0.2.2 spi 0x00000103: crypto backend 'ipsecmb'"* ]] &&
        [ -z "$("$XESP" sa list)" ]
}
check "sa add of the same: refused in one line naming the SA, nothing added" single_refused
sed -i '2,3d' "$work/mixed.conf"
check "without that line the batch applies" bash -c "cd '$work' && '$XESP' batch mixed.conf"
check "... both SAs" [ "$("$XESP" sa list | grep -c spi)" = 2 ]
stop_daemon
finish
