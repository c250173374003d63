#!/bin/bash
# `xesp daemon` puts malloc on transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1):
# it starts itself again with the tunable, under its own name and process id, unless the
# environment names the tunable already. So does `xesp bench pipeline`, which runs the same
# data path over the same tables. What is checked is the heap's pages, not the
# environment, which glibc rewrites as it reads it.
#
# Usage: bash test_daemon_pages.sh XESP
# Needs root (the daemon) and transparent huge pages in `madvise` mode (Debian's default: in
# `always` mode every process has them, asked or not); skips (exit 77) without.
set -u
XESP=${1:?usage: test_daemon_pages.sh XESP}
source "$(cd "$(dirname "$0")" && pwd)/daemon_lib.sh" pages
thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)
if [[ $thp != *"[madvise]"* ]]; then
    echo "SKIP: transparent huge pages are not in madvise mode here (${thp:-none})"
    exit 77
fi

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
    wait_answer 3000
}
huge_kib() { awk '/^AnonHugePages:/ { print $2 }' "/proc/$daemon/smaps_rollup"; }

start_daemon
# The pid is the one started, alive (not a zombie left by a process that went on elsewhere),
# answering with its SAs (wait_answer), under its own name.
alive() { kill -0 "$daemon" && ! grep -q "^State:.*Z" "/proc/$daemon/status"; }
check "the daemon answers under the process id it was started with" alive
name=$(basename "$XESP")
check "and under its own name" [ "$(cat "/proc/$daemon/comm")" = "${name:0:15}" ]
check "its heap is on huge pages ($(huge_kib) KiB)" [ "$(huge_kib)" -gt 0 ]
stop_daemon
start_daemon GLIBC_TUNABLES=glibc.malloc.arena_max=4
check "with other tunables too ($(huge_kib) KiB)" [ "$(huge_kib)" -gt 0 ]
stop_daemon
start_daemon GLIBC_TUNABLES=glibc.malloc.hugetlb=0
check "an operator's choice of small pages is kept ($(huge_kib) KiB)" [ "$(huge_kib)" -eq 0 ]
stop_daemon

# bench_pages [VAR=VALUE...]: the huge pages of a bench pipeline over 20,000 SAs (about 60 MB
# of tables), read while it runs.
bench_pages() {
    env "$@" "$XESP" bench pipeline --workers 1 --sas 20000 --packets 1000000000 >/dev/null 2>&1 &
    daemon=$!
    local kib=0
    for _ in $(seq 50); do
        sleep 0.2
        kib=$(huge_kib 2>/dev/null) || break
        [ "${kib:-0}" -gt 0 ] && break
    done
    stop_daemon 2>/dev/null
    echo "${kib:-0}"
}
kib=$(bench_pages)
check "bench pipeline's heap is on huge pages too ($kib KiB)" [ "$kib" -gt 0 ]
kib=$(bench_pages GLIBC_TUNABLES=glibc.malloc.hugetlb=0)
check "unless the operator says not ($kib KiB)" [ "$kib" -eq 0 ]

finish
