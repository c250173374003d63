#!/bin/bash
# Keys leave the daemon's memory with their SA. An SA is added through the control socket,
# listed with its key, and carried over a restart in the state file; once it is deleted, its
# key is nowhere in the daemon's writable memory, as bytes or as text: not in freed heap blocks
# (the request's JSON, the state file and journal as they were read, the lines written), not
# in what finished calls left on a thread's stack, not in the crypto contexts.
#
# Usage: bash test_key_memory.sh XESP
# Needs root (the daemon, and reading its memory through /proc/PID/mem); skips (exit 77)
# without.
set -u
XESP=${1:?usage: test_key_memory.sh XESP}
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/daemon_lib.sh" keymem

# A key of this run's own: nothing else in the daemon's memory holds it.
KEY=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
SALT=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
SA_ID="src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1001"
SA="$SA_ID reqid 1 mode tunnel aead rfc4106(gcm(aes)) 0x$KEY$SALT 128"

start_daemon() {
    "$XESP" daemon --socket "$XESP_SOCKET" --state "$work/xesp.state" >>"$work/daemon.log" 2>&1 &
    daemon=$!
    wait_answer "${1:-0}"
}
# The counts of the key's bytes, of its text (the first 16 digits, as `sa list` and the
# state file write it), and of the socket's path, which the daemon holds as text all along.
scan() {
    "$PY" "$HERE/scan_memory.py" "$daemon" "$KEY" "t:${KEY:0:16}" "t:$XESP_SOCKET" | paste -sd' '
}

start_daemon
if ! "$PY" "$HERE/scan_memory.py" "$daemon" 00 >/dev/null 2>&1; then
    echo "SKIP: cannot read /proc/$daemon/mem (needs root or ptrace rights)"
    exit 77
fi
# shows TEXT CMD...: CMD's output holds TEXT.
shows() {
    local text=$1
    shift
    "$@" | grep -q -- "$text"
}
# shellcheck disable=SC2086
check "sa add through the daemon" "$XESP" sa add $SA
check "sa list --show-keys shows the key" shows "0x$KEY$SALT" "$XESP" sa list --show-keys
check "sa get --show-keys shows it" shows "$KEY" "$XESP" sa get dst 192.0.2.2 spi 0x1001 --show-keys
read -r bytes text path <<<"$(scan)"
# The check can see a key: while the SA lives, its configuration and crypto context hold it;
# and it can see text.
check "while the SA lives, its key is in memory (found $bytes times)" [ "$bytes" -ge 1 ]
check "text is seen: the socket's path (found $path times)" [ "$path" -ge 1 ]
stop_daemon
check "the state file holds the SA across a restart" \
    grep -q "$KEY" "$work/xesp.state" "$work/xesp.state.journal"

start_daemon 1
check "the restarted daemon has the SA" shows "spi 0x0*1001" "$XESP" sa list
read -r bytes text path <<<"$(scan)"
check "read back from the state file, its key is in memory" [ "$bytes" -ge 1 ]
"$XESP" sa list --show-keys >/dev/null
# shellcheck disable=SC2086
check "sa del" "$XESP" sa del $SA_ID
# Readers of the old tables let go of the SA within a round of the data thread: up to 10 s on
# a loaded machine.
for _ in $(seq 20); do
    read -r bytes text path <<<"$(scan)"
    [ "$bytes" -eq 0 ] && [ "$text" -eq 0 ] && break
    sleep 0.5
done
check "after sa del, the key's bytes are nowhere in the daemon's memory (found $bytes)" [ "$bytes" -eq 0 ]
check "nor its text (found $text)" [ "$text" -eq 0 ]
check "the daemon's log never held the key" [ "$(grep -ci -- "$KEY" "$work/daemon.log")" -eq 0 ]

finish
