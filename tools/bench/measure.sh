# xesp-bench's measurements: the CPU it took, iperf3 TCP, xesp-gen UDP, and the probe that
# checks a mode works. Each stores its numbers in R[mode.measure(.detail)] and, on failure,
# sets ERR to one line saying what failed and where its log is.
# Sourced by tools/xesp-bench (needs common.sh); reads MODE, WORK, DURATION, TCP_RUNS, FLOWS,
# METHOD, GEN, GW_PIDS and the topology's names.

# Busy and total jiffies of the whole machine: user nice system idle iowait irq softirq steal.
machine_ticks() { awk '/^cpu / { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat; }

# utime + stime of the gateway processes, all threads (fields 14 and 15 of /proc/PID/stat,
# counted after the command name, which may hold spaces).
gateway_ticks() {
    local pid sum=0 t
    for pid in "${GW_PIDS[@]}"; do
        t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }')
        sum=$((sum + ${t:-0}))
    done
    echo $sum
}

HZ=$(getconf CLK_TCK)
cpu_begin() {
    read -r CPU_B0 CPU_T0 < <(machine_ticks)
    CPU_G0=$(gateway_ticks)
    CPU_W0=$(date +%s.%N)
}
# cpu_end KEY: R[mode.KEY.cpu] (machine busy %) and R[mode.KEY.gw] (gateways, % of one CPU).
cpu_end() {
    local b1 t1 g1 w1
    read -r b1 t1 < <(machine_ticks)
    g1=$(gateway_ticks)
    w1=$(date +%s.%N)
    R[$MODE.$1.cpu]=$(calc "100 * ($b1 - $CPU_B0) / (($t1 - $CPU_T0) > 0 ? ($t1 - $CPU_T0) : 1)" 0)
    if [ ${#GW_PIDS[@]} -gt 0 ]; then
        R[$MODE.$1.gw]=$(calc "100 * ($g1 - $CPU_G0) / $HZ / ($w1 - $CPU_W0)" 0)
    fi
}

listening() { ip netns exec "$NS_HOSTB" ss -ltnH "sport = :5201" | grep -q .; }

# One iperf3 run: its received Mbit/s in MBPS.
tcp_once() {
    local log=$WORK/$MODE/iperf3.$1.log spid rc
    ip netns exec "$NS_HOSTB" iperf3 -s -1 -B "$HOSTB_IP4" >"$WORK/$MODE/iperf3-server.log" 2>&1 &
    spid=$!
    BG_PIDS+=("$spid")
    wait_for 50 listening ||
        { ERR="TCP: the iperf3 server in hostB did not start; see $WORK/$MODE/iperf3-server.log"; return 1; }
    ip netns exec "$NS_HOSTA" iperf3 -c "$HOSTB_IP4" -t "$DURATION" -O 1 -f m \
        --connect-timeout 5000 >"$log" 2>&1
    rc=$?
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    MBPS=$(awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$log" | tail -1)
    [ $rc = 0 ] && [ -n "$MBPS" ] ||
        { ERR="TCP: iperf3 hostA -> hostB failed: $(last_words "$log" $rc); see $log"; return 1; }
}

# --tcp-runs runs; the median counts (one stream's rate swings from run to run, libipsec's
# most), and every run is shown.
measure_tcp() {
    local i runs=()
    cpu_begin
    for i in $(seq "$TCP_RUNS"); do
        tcp_once "$i" || return 1
        runs+=("$(calc "$MBPS / 1000")")
    done
    cpu_end tcp
    R[$MODE.tcp.runs]=$(printf '%s\n' "${runs[@]}" | sort -g | tr '\n' ' ' | sed 's/ $//')
    R[$MODE.tcp]=$(printf '%s\n' "${runs[@]}" | sort -g | awk '{ v[NR] = $1 }
        END { print (NR % 2) ? v[(NR + 1) / 2] : sprintf("%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
}

# gen_run SIZE SECONDS TAG: rx on hostb0, tx from hosta0; leaves the JSON in $WORK/$MODE/TAG.*.
gen_run() {
    local size=$1 secs=$2 tag=$3 rx=$WORK/$MODE/$3.rx tx=$WORK/$MODE/$3.tx rpid
    # rx stops one second after the last frame; its --seconds only bounds a run where none come.
    ip netns exec "$NS_HOSTB" "$GEN" rx --dev "$HOSTB_IF" --seconds $((${secs%.*} + 30)) --idle 1 --json \
        >"$rx" 2>"$rx.err" &
    rpid=$!
    BG_PIDS+=("$rpid")
    if ! wait_for 100 grep -q attached "$rx.err"; then
        kill "$rpid" 2>/dev/null
        ERR="UDP: xesp-gen rx did not attach to $HOSTB_IF: $(head -1 "$rx.err")"
        return 1
    fi
    [ "$tag" = probe ] || cpu_begin
    ip netns exec "$NS_HOSTA" "$GEN" tx --dev "$HOSTA_IF" --src "$HOSTA_IP4" --dst "$HOSTB_IP4" \
        --size "$size" --seconds "$secs" --flows "$FLOWS" --method "$METHOD" --json >"$tx" 2>"$tx.err"
    local rc=$?
    [ "$tag" = probe ] || cpu_end "$tag"
    if [ $rc != 0 ]; then
        kill "$rpid" 2>/dev/null
        ERR="UDP: xesp-gen tx failed: $(last_words "$tx.err" $rc)"
        return 1
    fi
    wait "$rpid" || { rc=$?; ERR="UDP: xesp-gen rx failed: $(last_words "$rx.err" $rc)"; return 1; }
}

measure_udp() {
    local size=$1 tag=udp$1
    gen_run "$size" "$DURATION" "$tag" || return 1
    R[$MODE.$tag]=$(json_num "$WORK/$MODE/$tag.rx" mpps)
    R[$MODE.$tag.gbps]=$(json_num "$WORK/$MODE/$tag.rx" gbps)
    R[$MODE.$tag.sent]=$(json_num "$WORK/$MODE/$tag.tx" mpps)
}

# A short burst that must get through: the mode works, and every neighbour is resolved.
probe() {
    gen_run 64 0.3 probe || return 1
    local got
    got=$(json_num "$WORK/$MODE/probe.rx" received)
    [ "${got:-0}" -gt 0 ] ||
        { ERR="hostA cannot reach hostB through the gateways (0 of the probe's frames arrived)"; return 1; }
}
