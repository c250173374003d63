# xesp-bench's libipsec mode: strongSwan's charon with kernel-libipsec (userspace ESP over a TUN
# device) in each gateway, IKEv2 with a PSK, and the CHILD_SA up before anything is measured.
# Sourced by tools/xesp-bench (needs common.sh and gateways.sh); on failure sets ERR.

# charon_conf DIR LOCAL_IP REMOTE_IP LOCAL_ID REMOTE_ID LOCAL_TS REMOTE_TS PSK
charon_conf() {
    cat >"$1/strongswan.conf" <<CONF
charon {
    # kernel-libipsec before kernel-netlink: ESP in charon, over a TUN device; kernel-netlink
    # still does addresses and routes. openssl first: its AES-GCM is the fastest here.
    load = random nonce openssl pem pkcs1 x509 pubkey kdf aes sha1 sha2 hmac gcm kernel-libipsec kernel-netlink socket-default vici
    plugins {
        vici {
            socket = unix://$1/charon.vici
        }
    }
    filelog {
        bench {
            path = $1/charon.log
            default = 1
        }
    }
    syslog {
        daemon {
            default = -1
        }
    }
}
CONF
    cat >"$1/swanctl.conf" <<CONF
connections {
    bench {
        version = 2
        local_addrs = $2
        remote_addrs = $3
        proposals = aes128gcm16-prfsha256-x25519
        local {
            auth = psk
            id = $4
        }
        remote {
            auth = psk
            id = $5
        }
        children {
            net {
                local_ts = $6
                remote_ts = $7
                esp_proposals = aes128gcm16
            }
        }
    }
}
secrets {
    ike-bench {
        id-a = gwa
        id-b = gwb
        secret = 0x$8
    }
}
CONF
}

swanctl_at() {   # swanctl_at GW ARGS...
    local dir=$WORK/libipsec/$1
    shift
    swanctl "$@" --uri "unix://$dir/charon.vici"
}

setup_libipsec() {
    install_pkgs "${STRONGSWAN_PKGS[@]}"
    [ -x "$CHARON" ] || { ERR="$CHARON missing after installing ${STRONGSWAN_PKGS[*]}"; return 1; }
    local psk gw ns dir
    psk=$(rand_hex 24)
    mkdir -p "$WORK/libipsec/gwA" "$WORK/libipsec/gwB"
    charon_conf "$WORK/libipsec/gwA" "$GWA_PUB_IP4" "$GWB_PUB_IP4" gwa gwb "$SITE_A4" "$SITE_B4" "$psk"
    charon_conf "$WORK/libipsec/gwB" "$GWB_PUB_IP4" "$GWA_PUB_IP4" gwb gwa "$SITE_B4" "$SITE_A4" "$psk"
    for gw in gwA gwB; do
        ns=$NS_GWA
        [ $gw = gwB ] && ns=$NS_GWB
        dir=$WORK/libipsec/$gw
        # A private /run: charon keeps its pid file and default sockets there.
        ip netns exec "$ns" sh -c 'mount -t tmpfs tmpfs /run && exec env STRONGSWAN_CONF="$1" "$2"' sh \
            "$dir/strongswan.conf" "$CHARON" >"$dir/charon.out" 2>&1 &
        GW_PIDS+=($!)
    done
    for gw in gwA gwB; do
        dir=$WORK/libipsec/$gw
        wait_for 100 test -S "$dir/charon.vici" ||
            { ERR="charon in $gw did not open its vici socket; see $dir/charon.log and $dir/charon.out"; return 1; }
        swanctl_at $gw --load-all --file "$dir/swanctl.conf" >>"$dir/swanctl.log" 2>&1 ||
            { ERR="swanctl --load-all in $gw failed; see $dir/swanctl.log"; return 1; }
    done
    swanctl_at gwA --initiate --child net --timeout 20 >>"$WORK/libipsec/gwA/swanctl.log" 2>&1 ||
        { ERR="the CHILD_SA did not come up; see $WORK/libipsec/gwA/swanctl.log and charon.log"; return 1; }
    for gw in gwA gwB; do
        swanctl_at $gw --list-sas 2>/dev/null | grep -q INSTALLED ||
            { ERR="no installed CHILD_SA in $gw; see $WORK/libipsec/$gw/charon.log"; return 1; }
    done
}
