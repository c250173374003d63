#!/bin/bash
# A control request, however large, does not stop forwarding: tools/xesp-stall runs a 1 kpps
# numbered UDP flow from hostA to hostB through both gateways while gwA applies a batch of
# 10,000 lines (5,000 tunnels) and then deletes it. No datagram sent while a request runs may
# wait for it: the worst delay must stay under a third of the request's time (a data path
# that serves the request itself holds them for about all of it), and none may be lost.
#
#   hostA --1 kpps UDP--> gwA (the batches) ===== wire ===== gwB --> hostB (arrivals timed)
#
# Usage: bash test_control_stall.sh XESP
# Exit status: 0 passed, 1 failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_control_stall.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
source "$HERE/../checks.sh"
require_netns "xesp-cs$$-probe"

json=$(mktemp /tmp/xesp-stall.XXXXXX.json)
trap 'rm -f "$json"' EXIT
if ! "$HERE/../../tools/xesp-stall" --lines 10000 --build "$(dirname "$XESP")" --json "$json"; then
    echo "FAIL: xesp-stall did not run"
    exit 1
fi
"$PY" - "$json" <<'PYEOF'
import json, sys
res = json.load(open(sys.argv[1]))
ok = True
for p in res["phases"]:
    good = p["worst_delay_ms"] * 3 < p["request_s"] * 1000 and p["sent_during"] > 0
    print("%s: %s: the %d datagrams sent while the request ran (%.3f s) took at worst %.1f ms"
          % ("ok" if good else "FAIL", p["phase"], p["sent_during"], p["request_s"],
             p["worst_delay_ms"]))
    ok &= good
lost_ok = res["lost"] == 0
print("%s: %d of %d datagrams lost" % ("ok" if lost_ok else "FAIL", res["lost"], res["sent"]))
sys.exit(0 if ok and lost_ok else 1)
PYEOF
