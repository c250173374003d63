# xesp-bench's small helpers: arithmetic, waiting, reading results, installing packages.
# Sourced by tools/xesp-bench; uses its PROG and die.

# install_pkgs PKG...: installs those not installed yet.
install_pkgs() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "$PROG: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        die "could not install ${missing[*]} (apt-get install failed); install them by hand and run again"
}

calc() { awk "BEGIN { printf \"%.${2:-3}f\", ($1) }"; }

# last_words LOG STATUS: why a command failed, in a few words.
last_words() {
    local line
    line=$(grep -v attached "$1" 2>/dev/null | grep -m1 -i error)
    [ -n "$line" ] || line=$(grep -v attached "$1" 2>/dev/null | tail -1)
    [ "$2" -gt 128 ] && line="killed by signal $(($2 - 128))${line:+; $line}"
    echo "${line:-exit status $2}"
}

# json_num FILE KEY: the number KEY has in the one-line JSON object in FILE.
json_num() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1"; }

# wait_for TRIES CMD...: runs CMD every 0.1 s until it succeeds, at most TRIES times.
wait_for() {
    local tries=$1 i
    shift
    for i in $(seq "$tries"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

rand_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
