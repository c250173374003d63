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
