# xesp-bench's guard on the wire: counts (and in the IPsec modes drops) plaintext between the
# gateways, so a gateway that leaks cannot post a flattering number.
# Sourced by tools/xesp-bench; reads NS_WIRE, WIRE_A_IF and WIRE_B_IF.


# guard_on drop|count
guard_on() {
    local verdict=
    [ "$1" = drop ] && verdict=drop
    ip netns exec "$NS_WIRE" nft -f - <<NFT
table netdev xesp_bench {
    chain a { type filter hook ingress device "$WIRE_A_IF" priority 0;
              ip saddr 10.0.0.0/8 counter $verdict
              ip saddr != 10.0.0.0/8 ip daddr 10.0.0.0/8 counter $verdict
              ip6 saddr fd00::/8 counter $verdict
    }
    chain b { type filter hook ingress device "$WIRE_B_IF" priority 0;
              ip saddr 10.0.0.0/8 counter $verdict
              ip saddr != 10.0.0.0/8 ip daddr 10.0.0.0/8 counter $verdict
              ip6 saddr fd00::/8 counter $verdict
    }
}
NFT
}

# Frames the guard counted (the rules do not overlap: each frame counts once).
guard_count() {
    ip netns exec "$NS_WIRE" nft list table netdev xesp_bench 2>/dev/null |
        awk '{ for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }'
}
