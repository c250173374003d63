# pass/fail bookkeeping for the shell tests: source it, call pass/fail/check, and end with
#   echo "$passed passed, $failed failed"; [ "$failed" = 0 ]
passed=0
failed=0
pass() {
    echo "ok   $1"
    passed=$((passed + 1))
}
fail() {
    echo "FAIL $1${2:+: $2}"
    failed=$((failed + 1))
}
# check NAME CMD...: passes when CMD succeeds; CMD's output is shown only on failure.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        pass "$name"
    else
        fail "$name" "$(echo "$out" | tail -n 3 | tr '\n' ' ')"
    fi
}

# require_netns NAME: exits 77 (ctest: skipped), saying why, unless this is root with iproute2
# and can make network namespaces and veth pairs; NAME is the throwaway namespace it tries.
require_netns() {
    if [ "$(id -u)" != 0 ]; then
        echo "SKIP: needs root (network namespaces)"
        exit 77
    fi
    if ! command -v ip >/dev/null 2>&1; then
        echo "SKIP: no ip (iproute2): cannot make network namespaces"
        exit 77
    fi
    if ! ip netns add "$1" 2>/dev/null; then
        echo "SKIP: cannot create network namespaces"
        exit 77
    fi
    if ! ip -n "$1" link add p0 type veth peer name p1 2>/dev/null; then
        ip netns del "$1"
        echo "SKIP: cannot create veth pairs"
        exit 77
    fi
    ip netns del "$1"
}
