#!/bin/bash
# `xesp bench pipeline`: what goes through the gateway's pipeline comes out whole and in each
# SA's order, encap and decap, with one worker and with several, one SA and many, big bursts
# and bursts of one; every packet that comes out is checked against the plaintext that went
# in, encap's decrypted again by the other backend (--verify); bad options fail with one line
# and no figures. `bench cpus` gives its figures for two CPUs, and refuses anything else.
# `bench keys` runs each SA count it is given, every SA's cipher decrypting what it encrypted.
#
# Usage: bash test_pipeline.sh XESP
set -u
XESP=${1:?usage: test_pipeline.sh XESP}
PY=/usr/bin/python3
. "$(dirname "$0")/../checks.sh"
work=$(mktemp -d /tmp/xesp-pipeline.XXXXXX)
trap 'rm -rf "$work"' EXIT

# run NAME ARGS...: the bench as JSON; every packet out, in order, and decrypting.
run() {
    local name=$1
    shift
    if ! "$XESP" bench pipeline --json --verify "$@" >"$work/out.json" 2>"$work/err"; then
        fail "$name" "$(head -1 "$work/err")"
        return
    fi
    local got
    got=$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
print("ok" if r["lost"] == 0 and r["out_of_order"] == 0 and r["bad"] == 0 and r["mpps"] > 0
      and sum(w["jobs"] for w in r["per_worker"]) >= 1 and r["latency_ns"]["p50"] > 0
      else "lost %d, out of order %d, bad %d" % (r["lost"], r["out_of_order"], r["bad"]))
' "$work/out.json" "$packets")
    [ "$got" = ok ] && pass "$name" || fail "$name" "$got"
}

packets=200000
run "1 worker, 1 SA" --workers 1 --packets $packets
run "2 workers, 1 SA" --workers 2 --packets $packets
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["per_worker"][1]["jobs"] > 0 else 1)' "$work/out.json" &&
    pass "2 workers: the worker thread ran jobs" || fail "2 workers: the worker thread ran jobs" "$(cat "$work/out.json")"
run "3 workers on 2 CPUs, 1000 SAs" --workers 3 --cpus 0,1 --sas 1000 --packets $packets
run "2 workers, bursts of 1, 64 B" --workers 2 --burst 1 --size 64 --packets $packets
run "2 workers, a small limit" --workers 2 --limit 1 --packets $packets
run "2 workers, AES-256-GCM, 100 SAs" --workers 2 --transform aes256gcm --sas 100 --packets $packets
run "2 workers, 20000 SAs" --workers 2 --sas 20000 --packets $packets
run "2 workers, AES-CBC and HMAC-SHA256 (random IVs), 10 SAs" --workers 2 --transform aes128cbc-sha256 --sas 10 --packets 20000
run "2 workers, 4096 frames taken in turn" --workers 2 --frames 4096 --packets $packets
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["frames"] == 4096 else 1)' "$work/out.json" &&
    pass "--frames: the JSON says it" || fail "--frames: the JSON says it" "$(cat "$work/out.json")"
run "decap, 1 worker, 1 SA" --direction decap --workers 1 --packets $packets
run "decap, 2 workers, 1000 SAs" --direction decap --workers 2 --sas 1000 --packets $packets
run "decap, 2 workers, bursts of 1, 64 B" --direction decap --workers 2 --burst 1 --size 64 --packets $packets
run "decap, OpenSSL, AES-CBC and HMAC-SHA1, 10 SAs" --direction decap --workers 1 --crypto openssl --transform aes128cbc-sha1 --sas 10 --packets $packets
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["direction"] == "decap" and r["crypto"] == "openssl" else 1)' "$work/out.json" &&
    pass "decap: the JSON says the direction and backend" || fail "decap: the JSON says the direction and backend" "$(cat "$work/out.json")"

# `bench cpus`: the hand-over between the first two CPUs this process may run on, if it has two,
# and one SA's cipher on one of them and on both.
two=$("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); print("%d,%d" % (c[0], c[1]) if len(c) > 1 else "")')
if [ -n "$two" ]; then
    if "$XESP" bench cpus --cpus "$two" --seconds 0.05 --size 1400 --json >"$work/cpus.json" 2>"$work/err"; then
        got=$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
ok = (r["cpus"] == [int(c) for c in sys.argv[2].split(",")] and r["size"] == 1400 and
      r["line_round_trip_ns"] > 0 and r["frame_round_trip_ns"] > r["line_round_trip_ns"] and
      r["frame_writes_one_cpu_ns"] > 0 and
      [s["cpu"] for s in r["stalls"]] == r["cpus"] and
      r["cipher"]["transform"] == "aes128gcm" and r["cipher"]["crypto"] == "ipsecmb" and
      r["cipher"]["one_cpu_mpps"] > 0 and r["cipher"]["both_cpus_mpps"] > 0 and
      all((s["over_1ms"] > 0) == (s["longest_ns"] > 1000000) and
          (s["over_100us"] > 0) == (s["longest_ns"] > 100000) and
          s["over_100us"] >= s["over_1ms"] for s in r["stalls"]))
print("ok" if ok else json.dumps(r))
' "$work/cpus.json" "$two")
        [ "$got" = ok ] && pass "bench cpus: a line, a frame, the stalls and the cipher of CPUs $two" ||
            fail "bench cpus: a line, a frame, the stalls and the cipher of CPUs $two" "$got"
    else
        fail "bench cpus" "$(head -1 "$work/err")"
    fi
else
    echo "SKIP: bench cpus needs two CPUs; this process may run on one"
fi
# refused NAME ARGS...: `xesp ARGS` exits non-zero with one line on stderr and nothing on stdout.
refused() {
    local name=$1
    shift
    if "$XESP" "$@" >"$work/out" 2>"$work/err"; then
        fail "$name is refused" "it ran"
    elif [ "$(wc -l <"$work/err")" = 1 ] && [ ! -s "$work/out" ]; then
        pass "$name is refused: $(cat "$work/err")"
    else
        fail "$name is refused with one line" "$(cat "$work/err")"
    fi
}
for bad in "--cpus 0" "--cpus 1,1" "--cpus 0,x" "--size 4" "--seconds 0"; do
    refused "bench cpus $bad" bench cpus $bad
done

# `bench keys`: every count it was given, in order, the first the ratios' base; both backends.
keys_run() {
    local name=$1 want=$2
    shift 2
    if ! "$XESP" bench keys --seconds 0.05 --rounds 2 --json "$@" >"$work/keys.json" 2>"$work/err"; then
        fail "$name" "$(head -1 "$work/err")"
        return
    fi
    got=$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
c = r["counts"]
ok = ([x["keys"] for x in c] == [int(k) for k in sys.argv[2].split(",")] and r["rounds"] == 2 and
      all(x["encrypt_ns"] > 0 and abs(x["encrypt_mpps"] * x["encrypt_ns"] - 1e3) < 1e-6 and
          abs(x["ratio"] - c[0]["encrypt_ns"] / x["encrypt_ns"]) < 1e-9 for x in c) and
      r["key_state_bytes"] > 0)
print("ok" if ok else json.dumps(r))
' "$work/keys.json" "$want")
    [ "$got" = ok ] && pass "$name" || fail "$name" "$got"
}
keys_run "bench keys: 1 and 300 SAs, AES-128-GCM" 1,300 --keys 1,300
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r["crypto"] == "ipsecmb" and r["key_state_bytes"] >= 1000 and r["transform"] == "aes128gcm" and r["size"] == 1400 else 1)' "$work/keys.json" &&
    pass "bench keys: AES-GCM's state with intel-ipsec-mb holds the hash key's powers" ||
    fail "bench keys: AES-GCM's state with intel-ipsec-mb holds the hash key's powers" "$(cat "$work/keys.json")"
keys_run "bench keys: 50, 1 and 7 SAs, OpenSSL, AES-CBC and HMAC-SHA256, 64 B" 50,1,7 --keys 50,1,7 \
    --crypto openssl --transform aes128cbc-sha256 --size 64
for bad in "--keys 0" "--keys 100001" "--keys 1,x" "--keys ," "--keys 2x" "--transform nope" \
    "--crypto nope" "--seconds 0" "--rounds 0" "--size 20"; do
    refused "bench keys $bad" bench keys $bad
done

# Bad options: one line, exit non-zero, nothing on stdout.
for bad in "--sas 0" "--sas 100001" "--burst 0" "--burst 65" "--size 20" "--workers 0" \
    "--transform nope" "--cpus 0,x" "--workers 2 --crypto openssl" "--direction sideways"; do
    refused "bench pipeline $bad" bench pipeline --packets 1000 $bad
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
