# xesp-bench's gateways for the kernel, kernel-xdp, xesp and xesp-tun modes: each mode's setup_MODE
# starts what forwards in gwA and gwB (nothing for the kernel, xesp daemons otherwise), and
# stop_gateways ends whatever a mode started (GW_PIDS), charons included.
# Sourced by tools/xesp-bench (needs common.sh); on failure a setup sets ERR.

stop_gateways() {
    local pid i
    [ ${#GW_PIDS[@]} -eq 0 ] && return 0
    kill -TERM "${GW_PIDS[@]}" 2>/dev/null
    for i in $(seq 50); do
        for pid in "${GW_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && break; pid=; done
        [ -z "$pid" ] && break
        sleep 0.1
    done
    kill -KILL "${GW_PIDS[@]}" 2>/dev/null
    wait "${GW_PIDS[@]}" 2>/dev/null
    GW_PIDS=()
}

setup_kernel() { return 0; }

# `xesp daemon --help` exits 0 even where there is no such subcommand (CLI11 reads --help
# first): look for it among the subcommands instead.
xesp_has_daemon() { "$XESP" --help 2>/dev/null | sed -n '/^Subcommands:/,$p' | grep -qE '^ +daemon( |$)'; }

# xesp: the protected interfaces in xdp mode; xesp-tun: in tun mode (`iface add ... mode tun`).
setup_xesp_tun() {
    setup_xesp tun
}

setup_xesp() {
    local seed gw
    # The topology's own gateway configs (AES-128-GCM tunnels, IPv4 and IPv6, out and fwd
    # policies between the sites) with keys from a seed of this run.
    seed=$(rand_hex 16)
    for gw in gwA gwB; do
        "$TOPO" config $gw seed="$seed" >"$WORK/$MODE/$gw.conf" ||
            { ERR="xesp-topo config $gw failed"; return 1; }
    done
    start_xesp "${1:-xdp}"
}

# No SA, no policy: the classifier passes every packet to the kernel, which forwards it.
setup_kernel_xdp() {
    : >"$WORK/$MODE/gwA.conf"
    : >"$WORK/$MODE/gwB.conf"
    start_xesp
}

# start_xesp [PROT-MODE]: a daemon in each gateway with $WORK/$MODE/gwX.conf, on both
# interfaces, the protected one in PROT-MODE (xdp or tun; default xdp).
start_xesp() {
    local gw ns sock pid prot pub prot_mode=${1:-xdp}
    mkdir -p /run/xesp
    for gw in gwA gwB; do
        ns=$NS_GWA
        [ $gw = gwB ] && ns=$NS_GWB
        sock=/run/xesp/${XESP_TOPO_PREFIX}$gw.sock
        rm -f "$sock"
        # ip netns exec remounts /sys: libxdp and libbpf want a bpffs there. --no-state: every
        # run starts from its config alone, not from what an earlier run saved.
        ip netns exec "$ns" sh -c 'mount -t bpf bpf /sys/fs/bpf 2>/dev/null; exec "$@"' sh \
            "$XESP" daemon -b "$WORK/$MODE/$gw.conf" --socket "$sock" --crypto "$CRYPTO" --no-state \
            ${WORKERS:+--workers "$WORKERS"} >"$WORK/$MODE/$gw.log" 2>&1 &
        GW_PIDS+=($!)
    done
    for gw in gwA gwB; do
        ns=$NS_GWA prot=$GWA_PROT_IF pub=$GWA_PUB_IF
        [ $gw = gwB ] && ns=$NS_GWB prot=$GWB_PROT_IF pub=$GWB_PUB_IF
        sock=/run/xesp/${XESP_TOPO_PREFIX}$gw.sock
        pid=${GW_PIDS[0]}
        [ $gw = gwB ] && pid=${GW_PIDS[1]}
        if ! wait_for 100 test -S "$sock" || ! wait_for 50 env XESP_SOCKET="$sock" "$XESP" iface list; then
            kill -0 "$pid" 2>/dev/null &&
                ERR="xesp daemon in $gw does not answer on $sock after 10 s; see $WORK/$MODE/$gw.log" ||
                ERR="xesp daemon in $gw exited: $(tail -1 "$WORK/$MODE/$gw.log"); see $WORK/$MODE/$gw.log"
            return 1
        fi
        ip netns exec "$ns" env XESP_SOCKET="$sock" "$XESP" iface add "$prot" role protected mode "$prot_mode" \
            >>"$WORK/$MODE/$gw.cli.log" 2>&1 &&
            ip netns exec "$ns" env XESP_SOCKET="$sock" "$XESP" iface add "$pub" role public \
                >>"$WORK/$MODE/$gw.cli.log" 2>&1 ||
            { ERR="xesp iface add in $gw failed: $(tail -1 "$WORK/$MODE/$gw.cli.log")"; return 1; }
    done
}
