#!/bin/bash
# `xesp daemon` puts malloc on transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1):
# it starts itself again with the tunable, under its own name and process id, unless the
# environment names the tunable already. What is checked is the heap's pages, not the
# environment, which glibc rewrites as it reads it.
#
# Usage: bash test_daemon_pages.sh XESP
set -u
XESP=${1:?usage: test_daemon_pages.sh XESP}
work=$(mktemp -d /tmp/xesp-pages.XXXXXX)
daemon=
cleanup() {
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
export XESP_SOCKET=$work/xesp.sock
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

# start_daemon [VAR=VALUE...]: a daemon with that environment and 3,000 SAs (about 20 MB of
# tables), answering on its socket.
for i in $(seq 3000); do
    printf 'sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi %d reqid %d mode tunnel aead rfc4106(gcm(aes)) 0x%032x01020304 128\n' \
        $((0x10000 + i)) "$i" "$i"
done >"$work/sas.conf"
start_daemon() {
    env "$@" "$XESP" daemon --socket "$XESP_SOCKET" --no-state -b "$work/sas.conf" \
        >>"$work/daemon.log" 2>&1 &
    daemon=$!
    for _ in $(seq 300); do
        [ "$("$XESP" sa list 2>/dev/null | wc -l)" = 3000 ] && return 0
        sleep 0.1
    done
    echo "the daemon did not answer with 3000 SAs; its log:"
    cat "$work/daemon.log"
    exit 1
}
stop_daemon() {
    kill "$daemon" && wait "$daemon"
    daemon=
}
huge_kib() { awk '/^AnonHugePages:/ { print $2 }' "/proc/$daemon/smaps_rollup"; }

thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)
start_daemon
check "the daemon answers under the process id it was started with" '[ -d "/proc/$daemon" ]'
check "and under its own name" '[ "$(cat "/proc/$daemon/comm")" = xesp ]'
if [[ $thp == *"[never]"* || -z $thp ]]; then
    echo "SKIP the huge page checks: transparent huge pages are off here ($thp)"
else
    check "its heap is on huge pages ($(huge_kib) KiB)" '[ "$(huge_kib)" -gt 0 ]'
    stop_daemon
    start_daemon GLIBC_TUNABLES=glibc.malloc.arena_max=4
    check "with other tunables too ($(huge_kib) KiB)" '[ "$(huge_kib)" -gt 0 ]'
    stop_daemon
    start_daemon GLIBC_TUNABLES=glibc.malloc.hugetlb=0
    check "an operator's choice of small pages is kept ($(huge_kib) KiB)" '[ "$(huge_kib)" -eq 0 ]'
fi
stop_daemon

echo "test_daemon_pages: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
