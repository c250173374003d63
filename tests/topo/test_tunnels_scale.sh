#!/bin/bash
# Many tunnels, correctly: tools/xesp-tunnels at 2,000 tunnels (4,000 SAs and 4,000 policies on
# each gateway). The daemon loads them all; 20 `sa add` on a loaded gateway all succeed (and
# their deletes); make-before-break rekeys on both gateways under a UDP flow over 8 tunnels
# lose no datagram through tunnel 0, and gwB never sees ESP for an SA it does not have (the SAs
# of the storm with time limits, as IKE's are). The generated config of one tunnel is
# xesp-topo's IPv4 tunnel, line for line. Correctness only:
# no figure of speed is asserted.
#
#   hostA --UDP over 8 tunnels--> gwA ===== wire (rekeys on both gateways) ===== gwB --> hostB
#
# Usage: bash test_tunnels_scale.sh XESP
# Exit status: 0 passed, 1 failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_tunnels_scale.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/../../tools/xesp-tunnels
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
source "$HERE/../checks.sh"
require_netns "xesp-ts$$-probe"

N=2000
dir=$(mktemp -d /tmp/xesp-tunnels-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
build=$(dirname "$XESP")

# field FILE EXPR: a value of the JSON in FILE (EXPR in Python, the object is r).
field() { "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print($2)" "$1"; }

# xesp-topo's config also has an in policy beside each fwd one, for the gateway's own traffic
# through the tunnel; the generated tunnels carry only forwarded traffic, and have none.
"$TOOL" gen --tunnels 1 --out "$dir/one" --seed s >/dev/null
check "gen --tunnels 1 is xesp-topo's IPv4 tunnel (gwA)" \
    diff <("$TOPO" config gwA seed=s | grep -v -e ':' -e ' dir in ') "$dir/one/gwA.conf"
check "gen --tunnels 1 is xesp-topo's IPv4 tunnel (gwB)" \
    diff <("$TOPO" config gwB seed=s | grep -v -e ':' -e ' dir in ') "$dir/one/gwB.conf"

"$TOOL" gen --tunnels 3 --out "$dir/limited" --lifetime 600 >/dev/null
limited=$(grep -c '^sa add .* limit time-hard 600$' "$dir/limited/gwA.conf")
[ "$limited" = 6 ] && pass "gen --lifetime: every SA has its time-hard limit" ||
    fail "gen --lifetime: every SA has its time-hard limit" "$limited of 6"

if "$TOOL" load --tunnels $N --build "$build" --json "$dir/load.json"; then
    sas=$(field "$dir/load.json" 'r["sas"]')
    [ "$sas" = $((2 * N)) ] && pass "load: all $((2 * N)) SAs of $N tunnels" ||
        fail "load: all $((2 * N)) SAs of $N tunnels" "the daemon lists $sas"
else
    fail "load: $N tunnels" "xesp-tunnels load did not run"
fi

if "$TOOL" latency --tunnels $N --count 20 --build "$build" --json "$dir/latency.json"; then
    for kind in add del; do
        ok=$(field "$dir/latency.json" "r['$kind']['ok']")
        [ "$ok" = 20 ] && pass "latency: 20 of 20 sa $kind succeeded" ||
            fail "latency: 20 of 20 sa $kind succeeded" \
                "$ok; $(field "$dir/latency.json" "r['$kind']['failed'][:1]")"
    done
    after=$(field "$dir/latency.json" 'r["sas_after"]')
    [ "$after" = $((2 * N)) ] && pass "latency: the gateway is back to $((2 * N)) SAs" ||
        fail "latency: the gateway is back to $((2 * N)) SAs" "it holds $after"
    lost=$(field "$dir/latency.json" 'r["flow"]["lost"]')
    [ "$lost" = 0 ] && pass "latency: no datagram lost meanwhile" ||
        fail "latency: no datagram lost meanwhile" "$lost lost"
else
    fail "latency: $N tunnels" "xesp-tunnels latency did not run"
fi

# Every SA with a time limit, as an IKE daemon's are: each rekey adds two to the gateways'
# rounds of time limits and takes two out (SaTable::timed()).
if "$TOOL" storm --tunnels $N --rate 2 --seconds 8 --flows 8 --quiet 2 --lifetime 3600 \
    --build "$build" --json "$dir/storm.json"; then
    rekeys=$(field "$dir/storm.json" 'r["rekeys"]')
    errors=$(field "$dir/storm.json" 'len(r["errors"])')
    [ "$rekeys" -ge 8 ] && [ "$errors" = 0 ] && pass "storm: $rekeys rekeys, none refused" ||
        fail "storm: every rekey applied" "$rekeys rekeys; $(field "$dir/storm.json" 'r["errors"][:1]')"
    t0=$(field "$dir/storm.json" 'r["flow"]["tunnel0_lost"]')
    sent=$(field "$dir/storm.json" 'r["flow"]["tunnel0_sent"]')
    [ "$t0" = 0 ] && [ "$sent" -gt 1000 ] && pass "storm: 0 of $sent datagrams lost through tunnel 0" ||
        fail "storm: no datagram lost through tunnel 0" \
            "$t0 of $sent lost; the gateways dropped $(field "$dir/storm.json" 'r["drops"]')"
    gone=$(field "$dir/storm.json" 'r["sent_with_deleted_sa"]')
    [ "$gone" = 0 ] && pass "storm: no packet for an SA gwB does not have" ||
        fail "storm: no packet for an SA gwB does not have" "$gone ($(field "$dir/storm.json" 'r["gwB_unknown_sa"]'))"
    # The quiet seconds before the storm are measured apart from it.
    qgap=$(field "$dir/storm.json" 'r["flow_quiet"]["datapath_gap_ms"]')
    gap=$(field "$dir/storm.json" 'r["flow"]["datapath_gap_ms"]')
    [ "$qgap" != None ] && [ "$gap" != None ] && pass "storm: gaps without rekeys ($qgap ms) and with them ($gap ms)" ||
        fail "storm: gaps measured with and without rekeys" "quiet $qgap, storm $gap"
    both=$(field "$dir/storm.json" '"%d %d" % (r["sas_gwA"], r["sas_gwB"])')
    [ "$both" = "$((2 * N)) $((2 * N))" ] && pass "storm: both gateways end with $((2 * N)) SAs" ||
        fail "storm: both gateways end with $((2 * N)) SAs" "gwA, gwB: $both"
else
    fail "storm: $N tunnels" "xesp-tunnels storm did not run"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
