# xesp-bench's report: the tables and ratios on stdout, and the same numbers as JSON.
# Sourced by tools/xesp-bench; reads MODE_LIST, R, STATUS, MODE_ERR and the settings.

val() { echo "${R[$1]:--}"; }

# ratio NUM DEN TARGET: "value verdict", or "- n/a" when either side is missing.
ratio() {
    local n=${R[$1]:-} d=${R[$2]:-}
    if [ -z "$n" ] || [ -z "$d" ] || [ "$(calc "$d == 0" 0)" = 1 ]; then
        echo "- n/a"
        return
    fi
    local v
    v=$(calc "$n / $d" 2)
    [ "$(calc "$v >= $3" 0)" = 1 ] && echo "$v PASS" || echo "$v BELOW"
}

avg_cpu() {     # avg_cpu MODE SUFFIX: mean over the three measurements
    local s=0 n=0 k v
    for k in tcp udp64 udp1400; do
        v=${R[$MODE.$k.$2]:-}
        [ -n "$v" ] || continue
        s=$((s + v))
        n=$((n + 1))
    done
    [ $n -gt 0 ] && echo $((s / n)) || echo -
}

# print_report: the tables, then the ratios (also left in TCP_RATIO, TCP_VERDICT, UDP_RATIO,
# UDP_VERDICT and CEIL_RATIO for write_json).
print_report() {
    echo
    printf '%s: %s s per measurement, %s flows, %s sender, frame sizes with FCS (RFC 2544), %s CPUs, %s, xesp workers: %s\n' \
        "$PROG" "$DURATION" "$FLOWS" "$METHOD" "$(nproc)" "$(uname -r)" "${WORKERS:-default}"
    printf '%-10s %9s %14s %24s %20s\n' mode "TCP Gbps" "UDP 64 B Mpps" "UDP 1400 B Mpps (Gbps)" "CPU % (gateways)"
    for MODE in "${MODE_LIST[@]}"; do
        if [ "${STATUS[$MODE]}" != ok ]; then
            printf '%-10s %s\n' "$MODE" "$([ "${STATUS[$MODE]}" = failed ] && echo 'failed: ')${MODE_ERR[$MODE]}"
            continue
        fi
        printf '%-10s %9s %14s %24s %20s\n' "$MODE" "$(val "$MODE.tcp")" "$(val "$MODE.udp64")" \
            "$(val "$MODE.udp1400") ($(calc "$(val "$MODE.udp1400.gbps")" 2))" \
            "$(avg_cpu "$MODE" cpu) ($(avg_cpu "$MODE" gw))"
    done
    echo
    echo "per measurement: received Mpps / sent Mpps; CPU: machine busy % (gateway processes, % of one CPU)"
    printf '%-10s %18s %18s %12s %12s %12s\n' mode "UDP 64 B rx/tx" "UDP 1400 B rx/tx" "CPU TCP" "CPU 64 B" "CPU 1400 B"
    for MODE in "${MODE_LIST[@]}"; do
        [ "${STATUS[$MODE]}" = ok ] || continue
        printf '%-10s %18s %18s %12s %12s %12s\n' "$MODE" \
            "$(val "$MODE.udp64") / $(val "$MODE.udp64.sent")" \
            "$(val "$MODE.udp1400") / $(val "$MODE.udp1400.sent")" \
            "$(val "$MODE.tcp.cpu") ($(val "$MODE.tcp.gw"))" \
            "$(val "$MODE.udp64.cpu") ($(val "$MODE.udp64.gw"))" \
            "$(val "$MODE.udp1400.cpu") ($(val "$MODE.udp1400.gw"))"
    done
    echo
    echo "TCP Gbps of each run, lowest first (the table shows the median):"
    for MODE in "${MODE_LIST[@]}"; do
        [ "${STATUS[$MODE]}" = ok ] && printf '%-10s %s\n' "$MODE" "$(val "$MODE.tcp.runs")"
    done
    echo
    read -r TCP_RATIO TCP_VERDICT < <(ratio xesp.tcp libipsec.tcp "$TCP_TARGET")
    read -r UDP_RATIO UDP_VERDICT < <(ratio xesp.udp1400 kernel.udp1400 "$UDP_TARGET")
    read -r CEIL_RATIO _ < <(ratio kernel-xdp.tcp libipsec.tcp "$TCP_TARGET")
    printf 'xesp / libipsec, TCP Gbps:            %5s  target >= %s  %s\n' "$TCP_RATIO" "$TCP_TARGET" "$TCP_VERDICT"
    printf 'xesp / kernel, UDP 1400 B Mpps:       %5s  target >= %s  %s\n' "$UDP_RATIO" "$UDP_TARGET" "$UDP_VERDICT"
    printf 'kernel-xdp / libipsec, TCP Gbps:      %5s  the most xesp / libipsec TCP can be on this topology\n' \
        "$CEIL_RATIO"
    read -r TUN_LIB TUN_LIB_V < <(ratio xesp-tun.tcp libipsec.tcp "$TCP_TARGET")
    read -r TUN_XDP TUN_XDP_V < <(ratio xesp-tun.tcp kernel-xdp.tcp 1.0)
    read -r TUN_KERN TUN_KERN_V < <(ratio xesp-tun.tcp kernel.tcp 0.5)
    read -r TUN_U64 TUN_U64_V < <(ratio xesp-tun.udp64 xesp.udp64 1.0)
    read -r TUN_U1400 TUN_U1400_V < <(ratio xesp-tun.udp1400 xesp.udp1400 1.0)
    printf 'xesp-tun / libipsec, TCP Gbps:        %5s  target >= %s  %s\n' "$TUN_LIB" "$TCP_TARGET" "$TUN_LIB_V"
    printf 'xesp-tun / kernel-xdp, TCP Gbps:      %5s  target >= 1.0  %s\n' "$TUN_XDP" "$TUN_XDP_V"
    printf 'xesp-tun / kernel, TCP Gbps:          %5s  (0.5 would be remarkable)\n' "$TUN_KERN"
    printf 'xesp-tun / xesp, UDP 64 B Mpps:       %5s  target >= 1.0  %s\n' "$TUN_U64" "$TUN_U64_V"
    printf 'xesp-tun / xesp, UDP 1400 B Mpps:     %5s  target >= 1.0  %s\n' "$TUN_U1400" "$TUN_U1400_V"
    echo "(the machine's CPUs are shared by sender, gateways and receiver, and with anything else running: expect noise)"
}

jnum() { [ -n "${1:-}" ] && [ "$1" != - ] && echo "$1" || echo null; }
jstr() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
jverdict() { [ "$1" = n/a ] && echo null || jstr "$1"; }

write_json() {
    local first=1 k
    printf '{\n  "seconds": %s,\n  "flows": %s,\n  "sender": "%s",\n' "$DURATION" "$FLOWS" "$METHOD"
    printf '  "workers": %s,\n' "${WORKERS:-null}"  # null: the daemon's default
    printf '  "frame_size": "Ethernet frame length including the 4-byte FCS (RFC 2544)",\n'
    printf '  "cpus": %s,\n  "kernel": %s,\n  "modes": {\n' "$(nproc)" "$(jstr "$(uname -r)")"
    for MODE in "${MODE_LIST[@]}"; do
        [ $first = 1 ] || printf ',\n'
        first=0
        printf '    "%s": {\n      "status": "%s",\n      "error": %s,\n' "$MODE" "${STATUS[$MODE]}" \
            "$([ -n "${MODE_ERR[$MODE]:-}" ] && jstr "${MODE_ERR[$MODE]}" || echo null)"
        printf '      "tcp": {"gbps": %s, "runs_gbps": [%s], "cpu_machine_pct": %s, "cpu_gateways_pct": %s},\n' \
            "$(jnum "${R[$MODE.tcp]:-}")" "$(echo "${R[$MODE.tcp.runs]:-}" | sed 's/ /, /g')" \
            "$(jnum "${R[$MODE.tcp.cpu]:-}")" "$(jnum "${R[$MODE.tcp.gw]:-}")"
        for k in udp64 udp1400; do
            printf '      "%s": {"rx_mpps": %s, "rx_gbps": %s, "tx_mpps": %s, "cpu_machine_pct": %s, "cpu_gateways_pct": %s},\n' \
                "$k" "$(jnum "${R[$MODE.$k]:-}")" "$(jnum "${R[$MODE.$k.gbps]:-}")" \
                "$(jnum "${R[$MODE.$k.sent]:-}")" "$(jnum "${R[$MODE.$k.cpu]:-}")" "$(jnum "${R[$MODE.$k.gw]:-}")"
        done
        printf '      "plaintext_frames_on_wire": %s\n    }' "$(jnum "${R[$MODE.leak]:-}")"
    done
    printf '\n  },\n  "ratios": {\n'
    printf '    "xesp_over_libipsec_tcp": {"value": %s, "target": %s, "verdict": %s},\n' \
        "$(jnum "$TCP_RATIO")" "$TCP_TARGET" "$(jverdict "$TCP_VERDICT")"
    printf '    "xesp_over_kernel_udp1400_mpps": {"value": %s, "target": %s, "verdict": %s},\n' \
        "$(jnum "$UDP_RATIO")" "$UDP_TARGET" "$(jverdict "$UDP_VERDICT")"
    printf '    "kernel_xdp_over_libipsec_tcp": {"value": %s},\n' "$(jnum "$CEIL_RATIO")"
    printf '    "xesp_tun_over_libipsec_tcp": {"value": %s, "target": %s, "verdict": %s},\n' \
        "$(jnum "$TUN_LIB")" "$TCP_TARGET" "$(jverdict "$TUN_LIB_V")"
    printf '    "xesp_tun_over_kernel_xdp_tcp": {"value": %s, "target": 1.0, "verdict": %s},\n' \
        "$(jnum "$TUN_XDP")" "$(jverdict "$TUN_XDP_V")"
    printf '    "xesp_tun_over_kernel_tcp": {"value": %s},\n' "$(jnum "$TUN_KERN")"
    printf '    "xesp_tun_over_xesp_udp64_mpps": {"value": %s, "target": 1.0, "verdict": %s},\n' \
        "$(jnum "$TUN_U64")" "$(jverdict "$TUN_U64_V")"
    printf '    "xesp_tun_over_xesp_udp1400_mpps": {"value": %s, "target": 1.0, "verdict": %s}\n' \
        "$(jnum "$TUN_U1400")" "$(jverdict "$TUN_U1400_V")"
    printf '  }\n}\n'
}
