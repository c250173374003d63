# Shared by the tests of one daemon outside any topology (test_key_memory.sh,
# test_daemon_pages.sh): a work directory and socket of the test's own, the daemon stopped
# and the directory removed at exit, and the checks of tests/checks.sh.
#
# Usage: source daemon_lib.sh NAME (the work directory's prefix); start a daemon as
# `... & daemon=$!`, stop it with stop_daemon, end with finish. Skips (exit 77) unless root:
# a daemon loads BPF programs at start.
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (the daemon loads BPF programs)"; exit 77; }
work=$(mktemp -d "/tmp/xesp-$1.XXXXXX")
daemon=
cleanup() {
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
export XESP_SOCKET=$work/xesp.sock
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"
stop_daemon() {
    kill "$daemon" && wait "$daemon"
    daemon=
}
# wait_answer COUNT: until the daemon lists COUNT SAs (at most 30 s); exits with its log if not.
wait_answer() {
    local listed
    for _ in $(seq 300); do
        listed=$("$XESP" sa list 2>/dev/null) && [ "$(grep -c . <<<"$listed")" = "$1" ] && return 0
        kill -0 "$daemon" 2>/dev/null || break
        sleep 0.1
    done
    echo "the daemon did not answer with $1 SAs; its log:"
    cat "$work/daemon.log"
    exit 1
}
finish() {
    echo "$(basename "$0" .sh): $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
