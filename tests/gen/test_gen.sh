#!/bin/bash
# xesp-gen: frames sent by `tx` are counted by `rx`, over a veth pair, with both senders.
#
#   netns $NS_A                        netns $NS_B
#   +----------------------------+     +-------------------------------------------+
#   | ga0  10.9.0.1/24           |-----| gb0  10.9.0.2/24                          |
#   | xesp-gen tx (xsk, packet)  |     | xesp-gen rx: XDP counts and drops UDP/7009 |
#   +----------------------------+     +-------------------------------------------+
#
# Asserts, for each sender and for 64 and 1400-byte frames: rx counts more than 0 and no more
# than tx sent, every counted frame has the size asked for (size - 4 bytes without FCS), and
# tx found gb0's MAC by ARP while rx's program was attached (non-bench traffic passes). Also:
# a paced sender stays under its rate, the datagrams are as a host's UDP socket sends them (DF,
# id 0, the checksum right), and a destination without a route and a size below 64 are refused
# with a message. No rate is asserted from below: this is a functional test.
#
# Usage: test_gen.sh XESP_GEN
# Exit status: 0 all passed, 1 a check failed, 77 skipped (not root, no netns, veth or XDP).
set -u
gen=$1

if [ "$(id -u)" != 0 ]; then
    echo "SKIP: needs root (network namespaces, XDP, AF_XDP)"
    exit 77
fi
command -v ip >/dev/null 2>&1 || { echo "SKIP: no ip (iproute2)"; exit 77; }

NS_A=xesp-gen-a-$$
NS_B=xesp-gen-b-$$
work=$(mktemp -d /tmp/xesp-test-gen.XXXXXX)
cleanup() {
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! ip netns add "$NS_A" 2>/dev/null || ! ip netns add "$NS_B" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces"
    exit 77
fi
if ! ip link add ga0 numtxqueues 2 numrxqueues 2 netns "$NS_A" type veth \
    peer name gb0 numtxqueues 2 numrxqueues 2 netns "$NS_B" 2>/dev/null; then
    echo "SKIP: cannot create veth pairs"
    exit 77
fi
ip -n "$NS_A" addr add 10.9.0.1/24 dev ga0
ip -n "$NS_B" addr add 10.9.0.2/24 dev gb0
ip -n "$NS_A" link set ga0 up
ip -n "$NS_B" link set gb0 up

passed=0
failed=0
# check WHAT CONDITION [DETAIL]: DETAIL (e.g. a command's stderr) is shown on failure.
check() {
    if eval "$2"; then
        echo "ok   - $1"
        passed=$((passed + 1))
    else
        echo "FAIL - $1${3:+: $3}"
        failed=$((failed + 1))
    fi
}

# json_num FILE KEY: the number KEY has in the one-line JSON object in FILE.
json_num() {
    sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1"
}

# run METHOD SIZE: rx on gb0, then tx from ga0 for half a second.
run() {
    local method=$1 size=$2 rx=$work/rx-$1-$2 tx=$work/tx-$1-$2 pid i
    ip netns exec "$NS_B" "$gen" rx --dev gb0 --seconds 20 --idle 0.5 --json >"$rx" 2>"$rx.err" &
    pid=$!
    for i in $(seq 100); do
        grep -q attached "$rx.err" 2>/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    if ! grep -q attached "$rx.err"; then
        wait $pid
        if grep -qiE 'operation not supported|invalid argument' "$rx.err"; then
            echo "SKIP: no XDP on veth here: $(cat "$rx.err")"
            exit 77
        fi
        check "$method $size: rx attaches" false "$(head -c 300 "$rx.err")"
        return
    fi
    ip netns exec "$NS_A" "$gen" tx --dev ga0 --src 10.9.0.1 --dst 10.9.0.2 --size "$size" \
        --seconds 0.5 --flows 4 --method "$method" --json >"$tx" 2>"$tx.err"
    local tx_rc=$?
    wait $pid
    local rx_rc=$?
    local sent received bytes
    sent=$(json_num "$tx" sent)
    received=$(json_num "$rx" received)
    bytes=$(json_num "$rx" bytes)
    check "$method $size: tx exits 0" "[ $tx_rc = 0 ] && [ -n '$sent' ]" "$(head -c 300 "$tx.err")"
    check "$method $size: rx exits 0" "[ $rx_rc = 0 ] && [ -n '$received' ]" \
        "$(grep -v attached "$rx.err" | head -c 300)"
    [ -n "$sent" ] && [ -n "$received" ] || return
    check "$method $size: rx counted frames ($received of $sent)" "[ $received -gt 0 ]"
    check "$method $size: rx counted no more than tx sent ($received <= $sent)" \
        "[ $received -le $sent ]"
    check "$method $size: every frame is $((size - 4)) bytes without FCS" \
        "[ '$bytes' = $((received * (size - 4))) ]"
}

for method in xsk packet; do
    for size in 64 1400; do
        run "$method" "$size"
    done
done

# Pacing only ever holds a sender back, so an upper bound holds however slow the machine:
# 1000 frames/s over the time it reports, plus one burst.
ip netns exec "$NS_A" "$gen" tx --dev ga0 --src 10.9.0.1 --dst 10.9.0.2 --seconds 0.5 --mpps 0.001 \
    --json >"$work/paced" 2>"$work/paced.err"
rc=$?
sent=$(json_num "$work/paced" sent)
bound=$(awk -v s="$(json_num "$work/paced" seconds)" 'BEGIN { printf "%d", 1000 * s + 64 }')
check "--mpps 0.001: sent some, and no more than the rate allows ($sent <= $bound)" \
    "[ $rc = 0 ] && [ '${sent:-0}' -gt 0 ] && [ '${sent:-0}' -le '$bound' ]" "$(cat "$work/paced.err")"

# --pairs 5 --pair-step 256: the frames go from 10.9.k.1 to 10.9.k.2 for k = 0..4, all five
# (a capture on gb0, where nothing is attached).
ip netns exec "$NS_B" tcpdump -i gb0 -n -U -w "$work/pairs.pcap" udp port 7009 2>"$work/tcpdump.err" &
tcpdump_pid=$!
for _ in $(seq 50); do grep -q listening "$work/tcpdump.err" 2>/dev/null && break; sleep 0.1; done
ip netns exec "$NS_A" "$gen" tx --dev ga0 --src 10.9.0.1 --dst 10.9.0.2 --seconds 0.2 --mpps 0.01 \
    --flows 1 --pairs 5 --pair-step 256 --json >"$work/pairs" 2>"$work/pairs.err"
rc=$?
sleep 0.3
kill "$tcpdump_pid" 2>/dev/null
wait "$tcpdump_pid" 2>/dev/null
pairs=$(tcpdump -n -r "$work/pairs.pcap" 2>/dev/null | awk '{ print $3, $5 }' | sort -u | tr '\n' ';')
want='10.9.0.1.20000 10.9.0.2.7009:;10.9.1.1.20000 10.9.1.2.7009:;10.9.2.1.20000 10.9.2.2.7009:;10.9.3.1.20000 10.9.3.2.7009:;10.9.4.1.20000 10.9.4.2.7009:;'
check "--pairs 5: five address pairs, a subnet apart" "[ $rc = 0 ] && [ '$pairs' = '$want' ]" \
    "got '$pairs'; $(head -c 300 "$work/pairs.err")"

# Each datagram as a host's UDP socket sends it, scapy judging: DF set, id 0, the UDP
# checksum what scapy computes for it.
judged=$(/usr/bin/python3 -c '
import sys
from scapy.all import rdpcap, IP, UDP
n = good = 0
for p in rdpcap(sys.argv[1]):
    if UDP not in p or p[UDP].dport != 7009:
        continue
    n += 1
    ip = p[IP]
    redo = IP(bytes(ip))
    sent = redo[UDP].chksum
    del redo[UDP].chksum
    good += ip.flags == "DF" and ip.id == 0 and sent != 0 and IP(bytes(redo))[UDP].chksum == sent
print(good, n)' "$work/pairs.pcap" 2>&1)
read -r good frames <<<"$judged"
check "the datagrams have DF, id 0 and a right UDP checksum ($good of $frames)" \
    "[ '${frames:-0}' -gt 0 ] 2>/dev/null && [ '$good' = '$frames' ]" "$judged"

out=$(ip netns exec "$NS_A" "$gen" tx --dev ga0 --src 10.9.0.1 --dst 192.0.2.99 --seconds 0.1 2>&1)
rc=$?
check "no route: refused, saying so" "[ $rc != 0 ] && [[ \$out == *'no route to 192.0.2.99'* ]]" "$out"
out=$(ip netns exec "$NS_A" "$gen" tx --dev ga0 --src 10.9.0.1 --dst 10.9.0.2 --size 63 2>&1)
rc=$?
check "size 63: refused" "[ $rc != 0 ]" "$out"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
