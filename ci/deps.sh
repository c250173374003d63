# Installs the Debian packages xesp needs that are not there yet. Sourced by ci/test and
# tools/xesp-demo; idempotent, and quiet when nothing is missing.
xesp_install_deps() {
    local pkgs=(build-essential cmake pkg-config clang llvm libssl-dev libipsec-mb-dev
                libcli11-dev catch2 libpcap-dev libmnl-dev nlohmann-json3-dev python3-scapy python3-cryptography tshark
                libbpf-dev libxdp-dev bpftool iproute2 iperf3 ethtool
                qemu-system-x86 busybox-static tcpdump xz-utils clang-format)
    local missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures and builds one build directory: xesp_build DIR [cmake options...]
xesp_build() {
    local dir=$1
    shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
    cmake --build "$dir" -j"$(nproc)"
}
