#!/bin/bash
# Interfaces whose devices leave gwA's namespace under the daemon, and come back.
#
#   hostA ---- gwA ===== wire ===== gwB ---- hostB        gone0 -- gone1: a veth pair inside
#              gwa-prot, gwa-pub (xesp daemon)                    gwA; gone0 protected
#
# A device moved to another namespace keeps its XDP program but loses its tc programs, and its
# AF_XDP sockets are unbound; a deleted one loses all. Asserts, with the protected interfaces
# in $XESP_PROT_MODE (xdp or tun):
#   - gwA's public interface moved away and straight back: attached again (its egress guard
#     back), hostA pings hostB through the tunnel, and the gateway's own traffic for a
#     protected flow is encrypted, none of it in the clear on the wire;
#   - gwA's public interface back as a bridge, which takes no XDP program: not attached, but
#     the egress guard alone on it, across a restart too; the gateway's own protected traffic
#     still encrypted (the kernel sends the ESP), none of it in the clear on the wire; `iface
#     del` takes the guard off;
#   - the same as the first for gwA's protected interface;
#   - the local link (xesp-local) deleted, an end of it moved to another namespace, moved
#     away and back, or renamed: made again (what is left of the old pair deleted), and the
#     gateway's own traffic (and in tun mode the hosts' UDP) encrypted again; what the deleted
#     pair dropped still counted in drop-local-link;
#   - gone0 deleted: `iface list` shows it absent (`-j` too), its classifier entry is gone;
#     made anew: attached again, with the new device's MAC;
#   - while absent, `iface add` in the other mode is taken, and applies when it is back;
#   - a restart keeps it absent from the state file, and attaches it once it is made;
#   - renamed: absent, our program parked on the renamed device, which `iface list` names,
#     a device made anew under the old name attached too; `iface del` of the old name, or
#     --detach-on-exit, takes it off both; a restart lists it again (the state file);
#   - `iface del` of an absent interface forgets it: made again, it is left alone;
#   - (xdp mode) back as a device that takes no XDP program: kept absent, said so, across a
#     restart too; `iface add` of it in tun mode attaches it.
#
# Usage: bash test_iface_gone.sh XESP
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns/veth/XDP).
set -u

XESP=${1:?usage: test_iface_gone.sh XESP}
HERE=$(cd "$(dirname "$0")" && pwd)
TOPO=$HERE/../../tools/xesp-topo
PY=/usr/bin/python3
export XESP_TOPO_PREFIX=xesp-v$$-
PARK=${XESP_TOPO_PREFIX}park

source "$HERE/lib.sh"
source "$HERE/gateway_lib.sh"
other_mode=xdp
[ "$PROT_MODE" = xdp ] && other_mode=tun

start=$SECONDS
check "topology up" "$TOPO" up
ip netns add "$PARK" || exit 1
trap 'ip netns del "$PARK" 2>/dev/null; cleanup' EXIT
step "daemons up, interfaces added ($PROT_MODE mode)" up_pair
check "hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 2

# readdress DEV ADDR4 ADDR6: gwA's DEV up with its addresses (a move or a delete takes them)
# and, for the public one, the routes over it.
readdress() {
    local dev=$1
    "$TOPO" exec gwA ip link set "$dev" up &&
        "$TOPO" exec gwA ip addr add "$2/24" dev "$dev" &&
        "$TOPO" exec gwA ip addr add "$3/64" dev "$dev" nodad || return 1
    if [ "$dev" = "$GWA_PUB_IF" ]; then
        "$TOPO" exec gwA ip route add "$SITE_B4" via "$GWB_PUB_IP4" &&
            "$TOPO" exec gwA ip -6 route add "$SITE_B6" via "$GWB_PUB_IP6" || return 1
    fi
}
# away_and_back DEV ADDR4 ADDR6: gwA's DEV to another namespace and at once back.
away_and_back() {
    "$TOPO" exec gwA ip link set "$1" netns "$PARK" &&
        ip -n "$PARK" link set "$1" netns "$NS_GWA" && readdress "$@"
}
# remake_pub: gwA's public veth deleted (its end on the wire goes with it) and made anew under
# the same names, in the wire's bridge. It has a new MAC: gwB forgets the old one, as a
# gratuitous ARP would have it do.
remake_pub() {
    local q=${XESP_TOPO_QUEUES:-2}
    "$TOPO" exec gwA ip link del "$GWA_PUB_IF" &&
        ip link add "$GWA_PUB_IF" numtxqueues "$q" numrxqueues "$q" netns "$NS_GWA" type veth \
            peer name "$WIRE_A_IF" numtxqueues "$q" numrxqueues "$q" netns "$NS_WIRE" &&
        ip -n "$NS_WIRE" link set "$WIRE_A_IF" master "$WIRE_BR" &&
        ip netns exec "$NS_WIRE" ethtool -K "$WIRE_A_IF" gro on >/dev/null &&
        ip -n "$NS_WIRE" link set "$WIRE_A_IF" up &&
        ip netns exec "$NS_GWA" ethtool -K "$GWA_PUB_IF" gro on >/dev/null &&
        readdress "$GWA_PUB_IF" "$GWA_PUB_IP4" "$GWA_PUB_IP6" &&
        "$TOPO" exec gwB ip neigh flush dev "$GWB_PUB_IF"
}

# logged N REGEX: the daemon's log has a line matching REGEX (extended) at least N times,
# within 5 s.
logged() {
    for _ in $(seq 50); do
        [ "$(grep -cE -- "$2" "$WORK/gwA.log")" -ge "$1" ] && return 0
        sleep 0.1
    done
    echo "log: $(tail -n 5 "$WORK/gwA.log")"
    return 1
}

BACK='here again \(index [0-9]+\): attached as'  # the log line of an interface attached again
# rename FROM TO: a running device cannot be renamed.
rename() {
    "$TOPO" exec gwA ip link set "$1" down && "$TOPO" exec gwA ip link set "$1" name "$2" &&
        "$TOPO" exec gwA ip link set "$2" up
}
egress_guard() {
    "$TOPO" exec gwA tc filter show dev "$GWA_PUB_IF" egress | grep -q xesp_tc_egress
}

# encrypted NODE COUNT [SOURCE]: COUNT datagrams from NODE (bound to SOURCE, if given) to
# hostB: hostB gets them all, the wire sees none in the clear.
encrypted() {
    local got n marker=m$RANDOM
    sink_start hostB "$HOSTB_IP4" 2 || return 1
    FILTERS=("contains $marker")
    got=$(wire_counts "$TOPO" exec "$1" "$PY" -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if '${3:-}':
    s.bind(('${3:-}', 0))
for i in range($2):
    s.sendto(b'$marker', ('$HOSTB_IP4', 5300))
    time.sleep(0.02)")
    sink_count n
    echo "hostB got $n of $2; plaintext on the wire: $got"
    [ "$n" = "$2" ] && [ "$got" = "0 " ]
}
hosts_encrypted() { encrypted hostA 10; }
own_encrypted() { encrypted gwA 5 "$GWA_PROT_IP4"; }  # the gateway's own, from its inside

# ---- gwA's public interface away and back -------------------------------------------------------
check "the public interface moved away and back at once" away_and_back "$GWA_PUB_IF" \
    "$GWA_PUB_IP4" "$GWA_PUB_IP6"
check "... the daemon saw it go and attached it again" logged 1 "$GWA_PUB_IF: $BACK"
check "... its egress guard is back" egress_guard
check "... hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "... hostA's datagrams reach hostB, none in the clear on the wire" hosts_encrypted
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted

# ---- gwA's public interface deleted and made anew -----------------------------------------------
check "the public interface deleted and made anew" remake_pub
check "... the daemon saw it go and attached the new one" logged 2 "$GWA_PUB_IF: $BACK"
check "... its egress guard is on it" egress_guard
# Both gateways have to find the other's MAC by ARP: one ping not counted.
ping_from hostA "$HOSTB_IP4" -c 1 >/dev/null 2>&1
check "... hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "... hostA's datagrams reach hostB, none in the clear on the wire" hosts_encrypted
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted

# ---- gwA's public interface back as a device that takes no XDP program -------------------------
# A bridge under its name, with a veth port on the wire: not attached, but the egress guard
# alone goes on it, so that the gateway's own protected plaintext goes to the local link to be
# encrypted instead of leaving in the clear.
pub_as_bridge() {
    "$TOPO" exec gwA ip link del "$GWA_PUB_IF" &&
        ip link add gwa-pubport netns "$NS_GWA" type veth peer name "$WIRE_A_IF" \
            netns "$NS_WIRE" &&
        ip -n "$NS_WIRE" link set "$WIRE_A_IF" master "$WIRE_BR" &&
        ip -n "$NS_WIRE" link set "$WIRE_A_IF" up &&
        "$TOPO" exec gwA ip link add "$GWA_PUB_IF" type bridge &&
        "$TOPO" exec gwA ip link set gwa-pubport master "$GWA_PUB_IF" &&
        "$TOPO" exec gwA ip link set gwa-pubport up &&
        readdress "$GWA_PUB_IF" "$GWA_PUB_IP4" "$GWA_PUB_IP6"
}
GUARD_ALONE="$GWA_PUB_IF: its egress guard alone is on it"
guard_alone() { logged "$1" "$GUARD_ALONE" && egress_guard; }
guard_id() {
    "$TOPO" exec gwA tc filter show dev "$GWA_PUB_IF" egress | grep -o ' id [0-9]*' | head -n 1
}
# guard_anew N OLD: as guard_alone, and the guard is not the program OLD (the last daemon's).
guard_anew() {
    local now
    now=$(guard_id)
    echo "egress guard:$now (was:$2)"
    guard_alone "$1" && [ -n "$now" ] && [ "$now" != "$2" ]
}
bridge_to_veth() { "$TOPO" exec gwA ip link del gwa-pubport && remake_pub; }
check "the public interface deleted, a bridge made under its name" pub_as_bridge
check "... not attached, the log says why" \
    logged 1 "$GWA_PUB_IF: here again \(index [0-9]+\), but not attached"
check "... its egress guard alone is on it" guard_alone 1
check "... the gateway's own traffic for a protected flow is encrypted (through the local \
link, sent by the kernel), none in the clear" own_encrypted
old_guard=$(guard_id)
step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
step "... restarted from the state file" start_gw gwA
check "... kept absent, the egress guard put on it again" guard_anew 2 "$old_guard"
check "... the gateway's own traffic is encrypted, none in the clear" own_encrypted
# The bridge renamed: it keeps the guard, listed under the interface, until `iface del`.
br_listed() { # IFINDEX: within 5 s
    for _ in $(seq 50); do
        cli gwA iface list | grep -qF "  renamed gwa-br (index $1) keeps our program" && return 0
        sleep 0.1
    done
    cli gwA iface list
    return 1
}
br_guarded() { "$TOPO" exec gwA tc filter show dev gwa-br egress | grep -q xesp_tc_egress; }
br_unguarded() { "$TOPO" exec gwA ip link show dev gwa-br >/dev/null && ! br_guarded; }
bridge=$("$TOPO" exec gwA cat "/sys/class/net/$GWA_PUB_IF/ifindex")
check "... renamed gwa-br" rename "$GWA_PUB_IF" gwa-br
check "... iface list names it under the interface" br_listed "$bridge"
check "... the guard still on it" br_guarded
check "... iface del of it" cli gwA iface del "$GWA_PUB_IF"
check "... takes the guard off the renamed bridge" br_unguarded
check "... renamed back" rename gwa-br "$GWA_PUB_IF"
check "a veth made again under its name" bridge_to_veth
check "... iface add of it" cli gwA iface add "$GWA_PUB_IF" role public
ping_from hostA "$HOSTB_IP4" -c 1 >/dev/null 2>&1
check "... hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted

# ---- gwA's protected interface away and back ----------------------------------------------------
check "the protected interface moved away and back at once" away_and_back "$GWA_PROT_IF" \
    "$GWA_PROT_IP4" "$GWA_PROT_IP6"
check "... the daemon saw it go and attached it again" logged 1 "$GWA_PROT_IF: $BACK"
check "... its $PROT_MODE-mode program is on it" prot_attached gwA "$GWA_PROT_IF"
check "... hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "... hostA's datagrams reach hostB, none in the clear on the wire" hosts_encrypted

# ---- the local link deleted, and moved away and back --------------------------------------------
# until CMD...: CMD succeeds within 5 s.
until_ok() {
    for _ in $(seq 50); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    "$@"
}
local_index() { "$TOPO" exec gwA cat /sys/class/net/xesp-local/ifindex; }
# local_remade OLD: the local link is here again, under an index other than OLD, up, and the
# gateway's end has its XDP program.
local_remade() {
    local now
    now=$(local_index) || return 1
    echo "xesp-local: index $now (was $1)"
    [ "$now" != "$1" ] && xdp_attached gwA xesp-local-gw &&
        "$TOPO" exec gwA ip link show xesp-local | grep -q 'state UP'
}
# local_back N OLD: the local link made again (N-th time) under an index other than OLD, and
# the gateway told the egress guard about it (its N+1-th "encrypted too" line).
local_back() {
    until_ok local_remade "$2" && logged "$1" "local link xesp-local: gone" &&
        logged "$(($1 + 1))" "local link xesp-local: the gateway's own traffic"
}
# What the local link dropped stays counted when it goes: its gateway end down, the kernel end
# drops the gateway's own traffic for a protected flow (tx_dropped), and drop-local-link counts
# it, before the pair goes and after it is made again.
local_drops() { stat gwA gateway.drop-local-link; }
local_dropping() {
    local before after
    before=$(local_drops) || return 1
    "$TOPO" exec gwA ip link set xesp-local-gw down || return 1
    "$TOPO" exec gwA "$PY" -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('$GWA_PROT_IP4', 0))
for _ in range(10):
    s.sendto(b'local-drop', ('$HOSTB_IP4', 5300))" || return 1
    for _ in $(seq 20); do
        after=$(local_drops) || return 1
        [ "$after" -ge $((before + 10)) ] && break
        sleep 0.1
    done
    echo "drop-local-link $before -> $after"
    echo "$after" >"$WORK/local_drops"
    [ "$after" -ge $((before + 10)) ]
}
local_drops_kept() {
    local n was
    n=$(local_drops) && was=$(cat "$WORK/local_drops") || return 1
    echo "drop-local-link $n, $was before the pair went"
    [ "$n" = "$was" ]  # the new pair has dropped nothing
}
check "the local link's gateway end down: the gateway's own traffic dropped, counted" \
    local_dropping
old_local=$(local_index)
check "the local link deleted under the daemon" "$TOPO" exec gwA ip link del xesp-local
check "... made again, the log says so" local_back 1 "$old_local"
check "... drop-local-link still counts what the old pair dropped" local_drops_kept
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted
check "... hostA's datagrams reach hostB, none in the clear on the wire" hosts_encrypted
old_local=$(local_index)
check "the local link's kernel end moved to another namespace" \
    "$TOPO" exec gwA ip link set xesp-local netns "$PARK"
check "... made again, the log says so" local_back 2 "$old_local"
check "... the pair that went is deleted" bash -c "! ip -n '$PARK' link show xesp-local"
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted
# The daemon stopped (SIGSTOP) while its gateway end goes away and comes back: under the same
# index, which only the link event tells.
old_local=$(local_index)
gw_end=$("$TOPO" exec gwA cat /sys/class/net/xesp-local-gw/ifindex)
kill -STOP "${DPID[gwA]}"
check "the local link's gateway end moved away and back, the daemon stopped meanwhile" bash -c "
    '$TOPO' exec gwA ip link set xesp-local-gw netns '$PARK' &&
    ip -n '$PARK' link set xesp-local-gw netns '$NS_GWA' &&
    [ \"\$('$TOPO' exec gwA cat /sys/class/net/xesp-local-gw/ifindex)\" = $gw_end ]"
kill -CONT "${DPID[gwA]}"
check "... made again, the log says so" local_back 3 "$old_local"
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted
check "... hostA's datagrams reach hostB, none in the clear on the wire" hosts_encrypted
old_local=$(local_index)
check "the local link's gateway end renamed" rename xesp-local-gw xl-renamed
check "... made again, the log says so" local_back 4 "$old_local"
check "... the renamed end is deleted with its pair" bash -c \
    "! '$TOPO' exec gwA ip link show xl-renamed 2>/dev/null"
check "... the gateway's own traffic for a protected flow is encrypted, none in the clear" \
    own_encrypted

# ---- a protected interface deleted, and made anew ---------------------------------------------
make_gone0() {
    "$TOPO" exec gwA ip link add gone0 type veth peer name gone1 &&
        "$TOPO" exec gwA ip link set gone0 up && "$TOPO" exec gwA ip link set gone1 up
}
# listed MODE STATE: `iface list` shows gone0 in MODE, absent or (STATE "here") with a socket
# per queue and its device's MAC; `-j` agrees.
listed() {
    local text json mac
    text=$(cli gwA iface list) || return 1
    json=$(cli gwA iface list -j) || return 1
    echo "$text"
    if [ "$2" = absent ]; then
        echo "$text" | grep -q "^gone0 role protected mode $1 absent" || return 1
        echo "$json" | "$PY" -c '
import json, sys
i = [i for i in json.load(sys.stdin) if i["name"] == "gone0"][0]
sys.exit(0 if i.get("absent") is True and i["ifindex"] == 0 and not i["macs"] else 1)'
    else
        mac=$("$TOPO" exec gwA cat /sys/class/net/gone0/address)
        echo "$text" | grep -q "^gone0 role protected mode $1 .*macs $mac" || return 1
        echo "$json" | "$PY" -c '
import json, sys
i = [i for i in json.load(sys.stdin) if i["name"] == "gone0"][0]
sys.exit(0 if "absent" not in i and i["ifindex"] > 0 else 1)'
    fi
}
# in_map IFINDEX: whether the classifier's `ifaces` map (that of gwA's public interface's
# program) has an entry for IFINDEX.
in_map() {
    "$TOPO" exec gwA "$PY" -c '
import json, subprocess, sys
def run(*cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
prog = run("ip", "-j", "-d", "link", "show", "dev", sys.argv[1])[0]["xdp"]["prog"]["id"]
for m in run("bpftool", "-j", "prog", "show", "id", str(prog))["map_ids"]:
    if run("bpftool", "-j", "map", "show", "id", str(m))["name"] != "ifaces":
        continue
    keys = []
    for e in run("bpftool", "-j", "map", "dump", "id", str(m)):
        k = e.get("key", e.get("formatted", {}).get("key"))
        keys.append(int.from_bytes(bytes(int(b, 16) for b in k), "little")
                    if isinstance(k, list) else int(k))
    print("ifaces map keys:", keys)
    sys.exit(0 if int(sys.argv[2]) in keys else 1)
sys.exit(2)' "$GWA_PUB_IF" "$1"
}
not_in_map() { # the map read, its keys printed, IFINDEX not among them
    local out rc
    out=$(in_map "$1" 2>&1)
    rc=$?
    echo "$out"
    [ $rc = 1 ] && echo "$out" | grep -q '^ifaces map keys:'
}
mode_on() { # MODE: gone0 carries MODE's program, and not the other's
    local PROT_MODE=$1
    prot_attached gwA gone0 || return 1
    if [ "$1" = xdp ]; then
        ! "$TOPO" exec gwA tc filter show dev gone0 ingress | grep -q xesp
    else
        ! xdp_attached gwA gone0
    fi
}

check "gone0 made and added" make_gone0
check "... iface add gone0 role protected mode $PROT_MODE" \
    cli gwA iface add gone0 role protected mode "$PROT_MODE"
old_index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
check "... its classifier entry is in the map" in_map "$old_index"
check "gone0 deleted" "$TOPO" exec gwA ip link del gone0
check "... iface list shows it absent" until_ok listed "$PROT_MODE" absent
check "... its classifier entry is gone from the map" not_in_map "$old_index"
check "... the log says so" logged 1 "gone0: gone from this network namespace"
refused_public() {
    local out
    out=$(cli gwA iface add gone0 role public 2>&1) && return 1
    echo "$out"
    echo "$out" | grep -q 'already added as protected (absent)'
}
check "... iface add gone0 role public is refused: it is added already" refused_public
check "gone0 made anew" make_gone0
check "... attached again, with its new MAC" until_ok listed "$PROT_MODE" here
check "... its $PROT_MODE-mode program is on it" mode_on "$PROT_MODE"

# kept_on DEV IFINDEX: DEV still has the $PROT_MODE-mode program, and its entry is in the map.
kept_on() {
    prot_attached gwA "$1" && in_map "$2"
}
index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
check "gone0 renamed gone9" rename gone0 gone9
check "... gone0 absent" until_ok listed "$PROT_MODE" absent
check "... our program stays on gone9, its entry kept (parked)" kept_on gone9 "$index"
check "gone9 renamed gone0 again" rename gone9 gone0
check "... attached again" until_ok listed "$PROT_MODE" here
check "... the log says so" logged 2 "gone0: $BACK"

# released DEV [IFINDEX]: DEV is here with none of our programs, and IFINDEX no entry in the
# map.
released() {
    "$TOPO" exec gwA ip link show dev "$1" >/dev/null || return 1
    ! xdp_attached gwA "$1" && ! "$TOPO" exec gwA tc filter show dev "$1" ingress |
        grep -q xesp && { [ -z "${2:-}" ] || not_in_map "$2"; }
}
# renamed_listed: iface list names gone9 (index $index) under gone0, -j too.
renamed_listed() {
    local text line="  renamed gone9 (index $index) keeps our program, parked, until"
    text=$(cli gwA iface list) || return 1
    echo "$text"
    echo "$text" | grep -qF "$line \`xesp iface del gone0\`" &&
        cli gwA iface list -j | "$PY" -c '
import json, sys
i = [i for i in json.load(sys.stdin) if i["name"] == "gone0"][0]
sys.exit(0 if i.get("renamed") == [{"name": "gone9", "ifindex": int(sys.argv[1])}] else 1)' "$index"
}
still_parked() { renamed_listed && prot_attached gwA gone9 && in_map "$index"; }
new_gone0() {
    "$TOPO" exec gwA ip link add gone0 type veth peer name gone2 &&
        "$TOPO" exec gwA ip link set gone0 up && "$TOPO" exec gwA ip link set gone2 up
}
readd() {
    "$TOPO" exec gwA ip link del gone0 && rename gone9 gone0 &&
        cli gwA iface add gone0 role protected mode "$PROT_MODE"
}
index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
check "gone0 renamed gone9 again" rename gone0 gone9
check "... iface list names gone9 under gone0" until_ok renamed_listed
check "a new gone0 made" new_gone0
check "... attached" until_ok listed "$PROT_MODE" here
new_index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
check "... gone9 still listed under gone0, our program still on it, parked" still_parked
check "... iface del gone0" cli gwA iface del gone0
check "... takes our program off the new gone0, its entry out of the map" \
    released gone0 "$new_index"
check "... and off gone9, its entry out of the map" released gone9 "$index"
check "the new gone0 deleted, gone9 renamed gone0 and added again" readd
check "... attached" until_ok listed "$PROT_MODE" here
index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
step "... restarted with --detach-on-exit" start_gw gwA --detach-on-exit
check "gone0 renamed gone9 under that daemon" rename gone0 gone9
check "... absent" until_ok listed "$PROT_MODE" absent
step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
check "... our program is taken off gone9 as it stops" released gone9
step "... restarted" start_gw gwA
check "gone9 renamed gone0" rename gone9 gone0
check "... attached again" until_ok listed "$PROT_MODE" here
# A restart, after a crash too, keeps the renamed device listed (the state file is written
# when the list changes), and `iface del` of the old name hands it back.
listed_parked() { renamed_listed && prot_attached gwA gone9; }
saved_renamed() {
    "$PY" -c '
import json, sys
st = json.load(open(sys.argv[1]))
sys.exit(0 if st.get("renamed") == [{"ifindex": int(sys.argv[2]), "was": "gone0"}] else 1)' \
        "$WORK/gwA.state" "$index"
}
killed() {
    stop_gw gwA KILL
    local rc=$?
    [ "$rc" = 137 ] || [ "$rc" = 0 ]
}
del_hands_back() { cli gwA iface del gone0 && released gone9; }
back_added() { rename gone9 gone0 && cli gwA iface add gone0 role protected mode "$PROT_MODE"; }
index=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
check "gone0 renamed gone9 once more" rename gone0 gone9
check "... iface list names gone9 under gone0" until_ok renamed_listed
check "... the state file lists it" until_ok saved_renamed
step "... daemon killed (kill -9)" killed
step "... restarted from the state file" start_gw gwA
check "... gone9 still listed under gone0, our program still on it" until_ok listed_parked
# ... and with gone0 gone from the file (a del whose save a stop cut short), listed alone.
step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
check "... gone0 taken out of the state file's interfaces" "$PY" -c '
import json, sys
st = json.load(open(sys.argv[1]))
st["ifaces"] = [i for i in st["ifaces"] if i["name"] != "gone0"]
json.dump(st, open(sys.argv[1], "w"))' "$WORK/gwA.state"
step "... restarted from the state file" start_gw gwA
check "... iface list names gone9 as what gone0 was" until_ok bash -c \
    "XESP_SOCKET='$WORK/gwA.sock' '$XESP' iface list | grep -qF \
    'gone9 (index $index), which was gone0, keeps our program, parked, until'"
check "... iface del gone0 takes our program off gone9" del_hands_back
check "gone9 renamed gone0 and added again" back_added
check "... attached" until_ok listed "$PROT_MODE" here

check "gone0 deleted again" "$TOPO" exec gwA ip link del gone0
check "... absent" until_ok listed "$PROT_MODE" absent
check "... iface add in $other_mode mode while absent" \
    cli gwA iface add gone0 role protected mode "$other_mode"
check "... iface list shows the new mode, absent" listed "$other_mode" absent
step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
step "... restarted from the state file" start_gw gwA
check "... gone0 kept absent, in $other_mode mode" listed "$other_mode" absent
check "... hostA pings hostB through the tunnel" ping_from hostA "$HOSTB_IP4" -c 3
check "gone0 made anew" make_gone0
check "... attached in $other_mode mode" until_ok listed "$other_mode" here
check "... its $other_mode-mode program is on it, not the other" mode_on "$other_mode"

check "gone0 deleted a third time" "$TOPO" exec gwA ip link del gone0
check "... absent" until_ok listed "$other_mode" absent
check "... iface del of it" cli gwA iface del gone0
not_listed() {
    local text
    text=$(cli gwA iface list) || return 1
    echo "$text"
    ! echo "$text" | grep -q '^gone0 '
}
check "... gone from iface list" not_listed
check "gone0 made anew" make_gone0
sleep 0.5
check "... left alone: no program on it" bash -c "! '$TOPO' exec gwA ip -d link show gone0 |
    grep -q prog/xdp && ! '$TOPO' exec gwA tc filter show dev gone0 ingress | grep -q xesp"

# ---- a device of the name that cannot be attached -----------------------------------------------
# A bridge takes no XDP program in driver mode: in xdp mode, gone0 back as a bridge fails.
failed_on() { # IFINDEX: iface list says gone0 is here but not attached, -j names IFINDEX
    local text json
    text=$(cli gwA iface list) || return 1
    json=$(cli gwA iface list -j) || return 1
    echo "$text"
    echo "$text" | grep -q "^gone0 role protected mode xdp absent: a device of that name is here" &&
        echo "$json" | "$PY" -c '
import json, sys
i = [i for i in json.load(sys.stdin) if i["name"] == "gone0"][0]
sys.exit(0 if i.get("absent") and i.get("failed_ifindex") == int(sys.argv[1]) else 1)' "$1"
}
if [ "$PROT_MODE" = xdp ]; then
    check "gone0 added again (xdp mode)" cli gwA iface add gone0 role protected mode xdp
    check "gone0 deleted, and a bridge made under its name" bash -c "
        '$TOPO' exec gwA ip link del gone0 && '$TOPO' exec gwA ip link add gone0 type bridge &&
        '$TOPO' exec gwA ip link set gone0 up"
    bridge=$("$TOPO" exec gwA cat /sys/class/net/gone0/ifindex)
    check "... not attached: iface list says so, -j names the device" until_ok failed_on "$bridge"
    check "... the log says why" logged 1 "gone0: here again \(index $bridge\), but not attached"
    step "... daemon stopped (SIGTERM)" stop_gw gwA TERM
    step "... restarted from the state file" start_gw gwA
    check "... still kept, absent, not attached" failed_on "$bridge"
    check "... iface add of it in tun mode" cli gwA iface add gone0 role protected mode tun
    check "... attached in tun mode on the bridge" until_ok listed tun here
    check "... its tun-mode program is on it, not the other" mode_on tun
    check "... iface del of it" cli gwA iface del gone0
    "$TOPO" exec gwA ip link del gone0
fi
check "the tunnel still carries hostA's pings" ping_from hostA "$HOSTB_IP4" -c 2

finish
