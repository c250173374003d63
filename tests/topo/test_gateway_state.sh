#!/bin/bash
# The state file under crashes and failures: a sequence number is never sent twice under one
# key, and never beyond what the file holds.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB
#   10.1.0.2   xesp      192.0.2.x   xesp      10.2.0.2
#              daemon                daemon
#              ^ kill -9, restart    ^ capture on wire-a: every ESP frame gwA sends, by
#                from its state file   (SPI, sequence number)
#
# Asserts: under a UDP stream and pings from hostA to hostB, 20 `kill -9` of gwA's daemon at
# random moments, each followed by a restart from the same state file (some with the config
# file, which names no counter, given again), and an `sa update` with new limits (same key)
# in the middle, put no (SPI, sequence number) pair on the wire twice, and the tunnel works
# after the last restart; with the state directory read-only the SA stops at the reservation
# the file holds (out-seq-unreserved counts the rest, nothing above it reaches the wire) and
# sends again once the directory is writable, and an interface change meanwhile is undone and
# refused (an `iface add` over what an earlier daemon left keeps a program on the interface, an
# `iface del` keeps ours on a device the interface was, renamed since);
# a second daemon on the same state file, and a daemon given a world-writable state directory,
# refuse to start with a one-line error.
#
# Usage: bash test_gateway_state.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_gateway_state.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-s$$-

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"
trap 'umount -l "$WORK/ro" 2>/dev/null; cleanup' EXIT

# A small reservation, so that the file is rewritten often under the test's few thousand
# packets a second and a kill often lands between two writes.
RESERVE=500

start=$SECONDS
check "topology up" "$TOPO" up
step "daemons up with the tunnel config, interfaces added" up_pair
if [ "$failed" != 0 ]; then
    finish
    exit 1
fi
# The pair as the rest of the test restarts it: gwA with the small reservation.
stop_gw gwA
step "gwA restarted with --seq-reserve $RESERVE" start_gw gwA --seq-reserve "$RESERVE"

# stream NODE DST: UDP to DST port 5300 as fast as a 1 ms sleep allows, until $WORK/stop exists.
stream() {
    "$TOPO" exec "$1" "$PY" -c "
import os, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
i = 0
while not os.path.exists('$WORK/stop'):
    s.sendto(b'state-test %d' % i, ('$2', 5300))
    i += 1
    time.sleep(0.001)"
}
# capture_start FILE: wire_capture.py in the background writing every ESP frame to FILE
# until $WORK/stop exists; returns once it captures.
capture_start() {
    rm -f "$WORK/stop" "$WORK/capturing"
    "$PY" "$HERE/wire_capture.py" --netns "$NS_WIRE" --dev "$WIRE_IF" --esp-seq "$1" -- \
        bash -c "touch '$WORK/capturing'; while [ ! -e '$WORK/stop' ]; do sleep 0.05; done" \
        >/dev/null 2>"$WORK/capture.err" &
    CAPTURE=$!
    for _ in $(seq 50); do [ -e "$WORK/capturing" ] && return 0; sleep 0.1; done
    return 1
}
capture_stop() {
    touch "$WORK/stop"
    wait "$CAPTURE"
}
# repeats FILE SRC: the (SPI, sequence number) pairs SRC sent more than once, one a line;
# fails if SRC sent fewer than MIN frames.
repeats() {
    "$PY" - "$@" <<'PYEOF'
import collections, sys
path, src, least = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = collections.Counter()
for line in open(path):
    s, spi, seq = line.split()
    if s == src:
        seen[(int(spi), int(seq))] += 1
twice = [(hex(spi), seq, n) for (spi, seq), n in seen.items() if n > 1]
print(f"{sum(seen.values())} ESP frames from {src}, {len(seen)} distinct, {len(twice)} repeated",
      file=sys.stderr)
for t in sorted(twice)[:10]:
    print("sent %d times: spi %s seq %d" % (t[2], t[0], t[1]))
sys.exit(1 if twice or sum(seen.values()) < least else 0)
PYEOF
}

# ---- 20 crashes under traffic ----------------------------------------------------------------

# The update changes the SA's limits and keeps its key: a new SA for the engine, whose
# config names no counter.
updated_sa() {
    local line
    line=$(grep "spi 0x1001 " "$WORK/gwA.conf")
    echo "${line/sa add/sa update} limit packet-hard 1000000000"
}

crashes() {
    local i conf=()
    capture_start "$WORK/esp.seq" || { echo "no capture"; return 1; }
    stream hostA "$HOSTB_IP4" >/dev/null 2>&1 &
    local streamer=$!
    ping_cmd hostA "$HOSTB_IP4" -c 100000 -i 0.02 -W 1
    "${PING[@]}" >/dev/null 2>&1 &
    local pinger=$!
    for i in $(seq 20); do
        sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
        kill -9 "${DPID[gwA]}"
        wait "${DPID[gwA]}" 2>/dev/null
        unset "DPID[gwA]"
        # Every fourth restart names the config file again: it gives no counter, or an
        # older one than the running SA's.
        conf=()
        [ $((i % 4)) = 0 ] && conf=(-b "$WORK/gwA.conf")
        start_gw gwA --seq-reserve "$RESERVE" "${conf[@]}" ||
            { capture_stop; kill "$streamer" "$pinger"; return 1; }
        if [ "$i" = 10 ]; then
            eval "cli gwA $(updated_sa)" >/dev/null ||
                { capture_stop; kill "$streamer" "$pinger"; return 1; }
        fi
    done
    sleep 1
    capture_stop
    wait "$streamer"
    kill "$pinger" 2>/dev/null
    wait "$pinger" 2>/dev/null
    repeats "$WORK/esp.seq" "$GWA_PUB_IP4" 2000
}
step "20 kill -9 under traffic, restarts from the state file: no (SPI, seq) sent twice" crashes
grep 'ESP frames' "$WORK/step.out" | sed 's/^/     /'
check "after the crashes the tunnel works" ping_from hostA "$HOSTB_IP4" -c 3
reserved_ok() {
    local o r
    o=$(stat gwA 'sas[spi=0x1001].oseq')
    r=$(stat gwA 'sas[spi=0x1001].oseq_reserved')
    echo "oseq $o, reserved $r"
    [ "$r" -ge "$o" ] && [ "$r" -gt 0 ]
}
check "xesp stats shows each SA's reservation, at or above its counter" reserved_ok
check "the state file is 0600 and no temporary is left" bash -c \
    "[ \$(stat -c %a '$WORK/gwA.state') = 600 ] && [ ! -e '$WORK/gwA.state.tmp' ]"

# ---- The state file cannot be written ------------------------------------------------------

# file_reservation SPI: the reservation (replay-oseq) the state file holds for SPI.
file_reservation() {
    "$PY" -c "
import json, re, sys
cfg = json.load(open('$WORK/ro/gwA.state'))['config']
line = next(l for l in cfg.splitlines() if ' spi 0x%08x ' % int('$1', 0) in l)
print(re.search(r'replay-oseq (\d+)', line).group(1))"
}
# ro_again: the directory read-only again (busy while the writer has its temporary open: tried
# again).
ro_again() {
    for _ in $(seq 20); do mount -o remount,ro "$WORK/ro" 2>/dev/null && return 0; sleep 0.05; done
    return 1
}
read_only() {
    local before after reserved top
    mkdir -p "$WORK/ro"
    mount -t tmpfs -o size=4m,mode=0700 tmpfs "$WORK/ro" || return 1
    stop_gw gwA
    cp "$WORK/gwA.state" "$WORK/ro/gwA.state" || return 1
    STATE_DIR=$WORK/ro start_gw gwA --seq-reserve "$RESERVE" || return 1
    ping_from hostA "$HOSTB_IP4" -c 2 -i 0.2 >/dev/null || { echo "no tunnel before"; return 1; }
    ro_again
    touch "$WORK/ro/probe" 2>/dev/null && { echo "the directory is still writable"; return 1; }
    before=$(stat gwA 'drops.out-seq-unreserved')
    reserved=$(file_reservation 0x1001)
    capture_start "$WORK/ro-esp.seq" || return 1
    udp_cmd hostA "$HOSTB_IP4" 3000 ro-marker 0.001
    "${UDP[@]}" >/dev/null 2>&1
    capture_stop
    after=$(stat gwA 'drops.out-seq-unreserved')
    top=$(awk -v s="$GWA_PUB_IP4" '$1 == s && $2 == 4097 {if ($3 > m) m = $3} END {print m + 0}' \
        "$WORK/ro-esp.seq")
    echo "out-seq-unreserved $before -> $after; highest sequence number sent $top," \
        "reserved in the file $reserved" | tee "$WORK/ro.summary"
    [ "$after" -gt "$before" ] && [ "$top" -le "$reserved" ] && [ "$top" -gt 0 ] &&
        grep -q 'cannot ' "$WORK/gwA.log"
}
step "state directory read-only: the SA stops at its reservation, counted" read_only
sed 's/^/     /' "$WORK/ro.summary" 2>/dev/null
# ... and an interface change is undone and refused, in one line naming the file: the
# interfaces stay what a restart would bring back (the tunnel works again below).
iface_unsaved() {
    local out before after other=tun
    [ "$PROT_MODE" = tun ] && other=xdp
    before=$(cli gwA iface list | cut -d' ' -f1-5 | sort) || return 1
    if out=$(cli gwA iface del "$GWA_PROT_IF" 2>&1); then
        echo "iface del answered ok: $out"
        return 1
    fi
    echo "iface del: $out"
    [ "$(echo "$out" | wc -l)" = 1 ] && [[ $out == *"not done: "*"$WORK/ro/gwA.state"* ]] || return 1
    if out=$(cli gwA iface add "$GWA_PROT_IF" role protected mode $other 2>&1); then
        echo "iface add ... mode $other answered ok: $out"
        return 1
    fi
    echo "iface add ... mode $other: $out"
    [[ $out == *"not done: "*"$WORK/ro/gwA.state"* ]] || return 1
    after=$(cli gwA iface list | cut -d' ' -f1-5 | sort) || return 1
    [ "$before" = "$after" ] || { echo "interfaces were: $before; now: $after"; return 1; }
}
check "state directory read-only: an interface change is undone and refused" iface_unsaved
# ... and the undo of an `iface add` over what an earlier daemon left leaves a program on the
# interface: the leftover dropped what is protected, and detaching would hand it to the kernel.
leftover_kept() {
    local out pid
    "$TOPO" exec gwA ip link add xs-left type veth peer name xs-leftp || return 1
    "$TOPO" exec gwA ip link set xs-left up && "$TOPO" exec gwA ip link set xs-leftp up || return 1
    "$TOPO" exec gwA "$XESP" daemon --socket "$WORK/left.sock" --no-state >>"$WORK/left.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        XESP_SOCKET=$WORK/left.sock "$XESP" iface add xs-left role protected 2>/dev/null && break
        sleep 0.1
    done
    kill -TERM "$pid"
    wait "$pid"
    "$TOPO" exec gwA ip link show xs-left | grep -q ' xdp' || {
        echo "no program left on xs-left: $(tail -n 3 "$WORK/left.log")"
        return 1
    }
    if out=$(cli gwA iface add xs-left role protected 2>&1); then
        echo "iface add over the leftover answered ok: $out"
        return 1
    fi
    echo "iface add xs-left: $out"
    [[ $out == *"not done: "* ]] || return 1
    "$TOPO" exec gwA ip link show xs-left | grep -q ' xdp' || {
        echo "the undo took every program off xs-left"
        return 1
    }
    ! cli gwA iface list | grep -q '^xs-left ' || return 1
    # ... which drops what it would hand over (no socket behind its entry), counted.
    local before after mac
    mac=$("$TOPO" exec gwA cat /sys/class/net/xs-left/address) || return 1
    before=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" xs-left xsk-missing) || return 1
    "$TOPO" exec gwA "$PY" -c "
from scapy.all import Ether, IP, UDP, sendp
sendp(Ether(dst='$mac') / IP(src='10.1.0.9', dst='10.2.0.2') / UDP(dport=5300) /
      b'left', iface='xs-leftp', count=20, verbose=False)" || return 1
    after=$("$TOPO" exec gwA "$PY" "$HERE/xdp_counter.py" xs-left xsk-missing) || return 1
    echo "xsk-missing on xs-left: $before -> $after"
    [ $((after - before)) -ge 20 ] || return 1
    # Handing it back to the kernel writes nothing and works with the directory read-only.
    cli gwA iface del xs-left && ! "$TOPO" exec gwA ip link show xs-left | grep -q ' xdp'
}
check "state directory read-only: the undo of an add over a leftover keeps a program on" \
    leftover_kept
"$TOPO" exec gwA ip link del xs-left 2>/dev/null
# ... and the undo of an `iface del` keeps our program on a device the interface was, renamed
# since: the del would have handed it back to the kernel, but it is not done.
renamed_listed() { cli gwA iface list | grep -qF "  renamed xs-ren2 (index $1) keeps our program"; }
renamed_kept() {
    local out index
    "$TOPO" exec gwA ip link add xs-ren type veth peer name xs-renp || return 1
    "$TOPO" exec gwA ip link set xs-ren up && "$TOPO" exec gwA ip link set xs-renp up || return 1
    mount -o remount,rw "$WORK/ro" || return 1
    cli gwA iface add xs-ren role protected mode xdp || return 1
    ro_again || { echo "the directory stays writable"; return 1; }
    index=$("$TOPO" exec gwA cat /sys/class/net/xs-ren/ifindex) || return 1
    "$TOPO" exec gwA ip link set xs-ren down && "$TOPO" exec gwA ip link set xs-ren name xs-ren2 &&
        "$TOPO" exec gwA ip link set xs-ren2 up || return 1
    for _ in $(seq 50); do renamed_listed "$index" && break; sleep 0.1; done
    renamed_listed "$index" || { echo "iface list: $(cli gwA iface list)"; return 1; }
    if out=$(cli gwA iface del xs-ren 2>&1); then
        echo "iface del answered ok: $out"
        return 1
    fi
    echo "iface del xs-ren: $out"
    [[ $out == *"not done: "* ]] || return 1
    xdp_attached gwA xs-ren2 || { echo "the undone del took the program off xs-ren2"; return 1; }
    renamed_listed "$index" || { echo "iface list: $(cli gwA iface list)"; return 1; }
    # Saved, the del hands it back.
    mount -o remount,rw "$WORK/ro" || return 1
    cli gwA iface del xs-ren && ! xdp_attached gwA xs-ren2
}
check "state directory read-only: the undo of an iface del keeps a renamed device's program" \
    renamed_kept
"$TOPO" exec gwA ip link del xs-ren2 2>/dev/null
"$TOPO" exec gwA ip link del xs-ren 2>/dev/null
writable_again() {
    mount -o remount,rw "$WORK/ro" || return 1
    for _ in $(seq 10); do
        ping_from hostA "$HOSTB_IP4" -c 1 -W 1 >/dev/null 2>&1 && break
    done
    ping_from hostA "$HOSTB_IP4" -c 3
}
check "writable again: the SA sends again" writable_again

# ---- Guards on the file ----------------------------------------------------------------------

refused() { # WANT ARGS...: the daemon exits non-zero with one line containing WANT
    local want=$1 out rc
    shift
    out=$("$TOPO" exec gwA timeout 10 "$XESP" daemon --socket "$WORK/other.sock" "$@" 2>&1)
    rc=$?
    echo "exit $rc: $out"
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$(echo "$out" | wc -l)" = 1 ] &&
        [[ $out == *"$want"* ]]
}
check "a second daemon on the same state file refuses, naming it" \
    refused "state file $WORK/ro/gwA.state is in use by another xesp daemon" \
    --state "$WORK/ro/gwA.state"
mkdir -m 0777 "$WORK/open"
chmod 0777 "$WORK/open"
check "a world-writable state directory is refused" \
    refused "state directory $WORK/open is writable by others" --state "$WORK/open/gw.state"

stop_gw gwA
umount "$WORK/ro"
stop_gw gwB
finish
