#!/usr/bin/env bash
# vm_run.sh: runs a script inside a Debian kernel under qemu and returns its exit status.
#
#   host                                     guest (qemu -accel tcg -cpu max, 2 CPUs, 1 GiB)
#   apt-get download linux-image-...  --->   that kernel, its modules (insmod, deps first)
#   files named on the command line   --->   the same paths, with their `ldd` closure
#   busybox-static, bash              --->   /usr/bin (busybox applets where nothing else is)
#   GUEST_SCRIPT                      --->   run by bash as root; its output on our stdout
#
# Usage: vm_run.sh [-t SECONDS] [-m MODULE,...] [-e NAME=VALUE]... KERNEL GUEST_SCRIPT [FILE|DIR...]
#   KERNEL  a Debian 12 kernel: a series (6.1, 6.12), taking the newest of the archive, or the
#           exact release of a package (6.1.0-57-amd64, 6.12.118+deb12-amd64).
#   -t      give up after SECONDS (default 600): exit status 124.
#   -m      modules to load besides the default ones (veth, bridge, sch_ingress, cls_bpf).
#   -e      a variable for the guest script's environment.
#   FILE    carried to the same absolute path; executables and shared libraries bring the
#           libraries `ldd` names. A DIR is carried whole.
# In the guest: /proc, /sys, /sys/fs/bpf and /dev are mounted (the root, /tmp and /run are
# the initramfs, writable), lo is up,
# PATH=/usr/sbin:/usr/bin, and XESP_VM_KERNEL holds the kernel's release.
# Exit status: the guest script's; 124 on timeout; 125 if the VM could not be prepared or
# booted; 77 if qemu or busybox-static is missing (the message says which).
#
# The kernel package is downloaded once and kept, unpacked, under XESP_VM_CACHE (default
# /var/cache/xesp-vm). /dev/kvm is not used: the kvm of some hosts cannot boot these kernels,
# and TCG boots one in about 5 s.
set -euo pipefail

PROG=vm_run.sh
CACHE=${XESP_VM_CACHE:-/var/cache/xesp-vm}
TIMEOUT=600
EXTRA_MODULES=
GUEST_ENV=()
DEFAULT_MODULES=(veth bridge sch_ingress cls_bpf)

die() { echo "$PROG: $*" >&2; exit 125; }
usage() { sed -n '10,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while getopts "t:m:e:h" o; do
    case $o in
    t) TIMEOUT=$OPTARG ;;
    m) EXTRA_MODULES=$OPTARG ;;
    e) [[ $OPTARG =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "-e $OPTARG: expected NAME=VALUE"
       GUEST_ENV+=("$OPTARG") ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || usage
KSPEC=$1 SCRIPT=$2
shift 2
[ -r "$SCRIPT" ] || die "cannot read the guest script '$SCRIPT'"

for c in qemu-system-x86_64:qemu-system-x86 /bin/busybox:busybox-static; do
    command -v "${c%%:*}" >/dev/null 2>&1 || {
        echo "$PROG: ${c%%:*} not found; install it (apt-get install ${c#*:})" >&2
        exit 77
    }
done
# The list is read whole first: with pipefail, grep -q closing the pipe early kills busybox
# with SIGPIPE and the check fails at random.
applets=$(/bin/busybox --list)
grep -qx insmod <<<"$applets" || {
    echo "$PROG: /bin/busybox has no insmod; install busybox-static" >&2
    exit 77
}

# ---- The kernel: package name, download, unpack ------------------------------------------

# kernel_package SPEC: the linux-image package for SPEC.
kernel_package() {
    local spec=$1 re
    if [[ $spec == *-amd64 ]]; then
        echo "linux-image-$spec"
        return
    fi
    [[ $spec =~ ^[0-9]+\.[0-9]+$ ]] ||
        die "kernel '$spec': expected a series (6.1) or a release (6.1.0-57-amd64)"
    # 6.1 is packaged as 6.1.0-ABI-amd64, 6.12 as 6.12.PATCH+deb12-amd64.
    re="^linux-image-${spec//./\\.}(\\.0-[0-9]+|\\.[0-9]+\\+deb[0-9]+)-amd64\$"
    local name
    name=$(apt-cache pkgnames linux-image- 2>/dev/null | grep -E "$re" | sort -V | tail -n 1)
    if [ -z "$name" ]; then     # no package lists: the newest kernel of that series unpacked
        name=$(ls "$CACHE" 2>/dev/null | sed 's/^/linux-image-/' | grep -E "$re" | sort -V |
               tail -n 1)
        [ -n "$name" ] || die "no linux-image package of the $spec series; run apt-get update"
    fi
    echo "$name"
}

PKG=$(kernel_package "$KSPEC")
KREL=${PKG#linux-image-}
KDIR=$CACHE/$KREL
if [ ! -e "$KDIR/.unpacked" ]; then
    mkdir -p "$CACHE"
    deb=$(ls "$CACHE"/"${PKG}"_*.deb 2>/dev/null | head -n 1 || true)
    if [ -z "$deb" ]; then
        echo "$PROG: downloading $PKG" >&2
        rc=0
        (cd "$CACHE" && apt-get download -q "$PKG") >"$CACHE/download.log" 2>&1 || rc=$?
        # apt's warning that it downloads as root into a directory _apt cannot write is noise.
        grep -v '^W: Download is performed unsandboxed' "$CACHE/download.log" >&2 || true
        [ "$rc" = 0 ] || die "apt-get download $PKG failed"
        deb=$(ls "$CACHE"/"${PKG}"_*.deb | head -n 1)
    fi
    rm -rf "$KDIR"
    dpkg-deb -x "$deb" "$KDIR" || { rm -f "$deb"; die "cannot unpack $deb; removed it, run again"; }
    touch "$KDIR/.unpacked"
fi
VMLINUZ=$KDIR/boot/vmlinuz-$KREL
MODDIR=$KDIR/lib/modules/$KREL
[ -r "$VMLINUZ" ] || die "$PKG has no boot/vmlinuz-$KREL"

# ---- The initramfs ------------------------------------------------------------------------

WORK=$(mktemp -d /tmp/xesp-vm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib,usr/lib64,proc,sys,dev,tmp,run,etc,root,var,modules}
ln -s usr/bin "$ROOT/bin"
ln -s usr/sbin "$ROOT/sbin"
ln -s usr/lib "$ROOT/lib"
ln -s usr/lib64 "$ROOT/lib64"
ln -s ../run "$ROOT/var/run"

# carry PATH: the file PATH names, copied to its real path (the guest's /bin, /lib... are
# links into /usr, as on the host).
carry() {
    local src=$1 dst
    dst=$(realpath -m "$src")
    [ -e "$ROOT$dst" ] && return 0
    mkdir -p "$ROOT$(dirname "$dst")"
    cp -a "$(realpath "$src")" "$ROOT$dst"
    # The path it was named by, if that differs only by a symlink outside the merged /usr.
    if [ "$src" != "$dst" ] && [[ $src == /* ]] && [ ! -e "$ROOT$src" ]; then
        mkdir -p "$ROOT$(dirname "$src")"
        ln -s "$dst" "$ROOT$src" 2>/dev/null || true
    fi
}
# carry_elf FILE: FILE and the libraries ldd names.
carry_elf() {
    local lib
    carry "$1"
    for lib in $(ldd "$1" 2>/dev/null | grep -oE '/[^ ]+' || true); do
        carry "$lib"
    done
}
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }

carry_elf /usr/bin/bash
for f in "$@"; do
    [ -e "$f" ] || die "cannot carry '$f': no such file"
    f=$(realpath -s "$f")
    if [ -d "$f" ]; then
        mkdir -p "$ROOT$(dirname "$(realpath -m "$f")")"
        cp -a "$(realpath "$f")" "$ROOT$(realpath -m "$f")"
        while IFS= read -r -d '' x; do
            is_elf "$x" && carry_elf "$x"
        done < <(find "$f" -type f -perm -u+x -print0)
    elif is_elf "$f"; then
        carry_elf "$f"
    else
        carry "$f"
    fi
done
cp /bin/busybox "$ROOT/usr/bin/busybox"
for a in $(/bin/busybox --list); do
    [ -e "$ROOT/usr/bin/$a" ] || [ -e "$ROOT/usr/sbin/$a" ] || ln -s busybox "$ROOT/usr/bin/$a"
done
cp "$SCRIPT" "$ROOT/guest.sh"
for e in "${GUEST_ENV[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done >"$ROOT/guest.env"

# Modules: each one after those it depends on, decompressed for busybox's insmod.
declare -A MOD_DONE=()
: >"$ROOT/modules/order"
add_module() {
    local name=${1//-/_} file dep
    [ -n "${MOD_DONE[$name]:-}" ] && return 0
    MOD_DONE[$name]=1
    file=$(find "$MODDIR/kernel" -regextype posix-extended \
        -regex ".*/(${name}|${name//_/-})\\.ko(\\.xz)?" -print -quit)
    if [ -z "$file" ]; then
        grep -qE "/(${name}|${name//_/-})\\.ko\$" "$MODDIR/modules.builtin" && return 0
        die "kernel $KREL has no module $1"
    fi
    case $file in
    *.xz) xz -dc "$file" >"$ROOT/modules/$name.ko" ;;
    *) cp "$file" "$ROOT/modules/$name.ko" ;;
    esac
    for dep in $(tr '\0' '\n' <"$ROOT/modules/$name.ko" | sed -n 's/^depends=//p' | tr ',' ' '); do
        add_module "$dep"
    done
    echo "$name" >>"$ROOT/modules/order"
}
for m in "${DEFAULT_MODULES[@]}" ${EXTRA_MODULES//,/ }; do
    add_module "$m"
done

cat >"$ROOT/init" <<EOF
#!/bin/busybox sh
export PATH=/usr/sbin:/usr/bin XESP_VM_KERNEL=$KREL HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t bpf bpf /sys/fs/bpf
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts
echo 'root:x:0:0:root:/root:/bin/sh' >/etc/passwd
echo 'root:x:0:' >/etc/group
for m in \$(cat /modules/order); do
    insmod /modules/\$m.ko || echo "xesp-vm: insmod \$m failed"
done
ip link set lo up
echo "xesp-vm: kernel \$(uname -r), running the guest script"
cd /root
. /guest.env
/usr/bin/bash /guest.sh </dev/null
echo "xesp-vm: exit status \$?"
sync
poweroff -f
EOF
chmod +x "$ROOT/init"
(cd "$ROOT" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) >"$WORK/initrd" || die "cannot build the initramfs"

# ---- Boot ---------------------------------------------------------------------------------

# A kernel under TCG with two vCPUs now and then dies while it boots (an int3 Oops as it
# patches its own text), before the guest script starts. Such a boot is tried again, up to
# three times; a guest that died once its script ran is a failure like any other.
for attempt in 1 2 3; do
    echo "$PROG: booting $KREL ($(du -m "$WORK/initrd" | cut -f1) MB initramfs)" >&2
    set +e
    timeout --foreground -k 5 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1G \
        -nographic -no-reboot -monitor none -serial stdio -net none \
        -kernel "$VMLINUZ" -initrd "$WORK/initrd" \
        -append "console=ttyS0 quiet loglevel=3 panic=-1 oops=panic rdinit=/init" \
        </dev/null 2>&1 | tr -d '\r' |
        sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' \
            -e '/^SeaBIOS /d; s/^Booting from ROM\.*//; /^$/d' | tee "$WORK/console"
    qrc=${PIPESTATUS[0]}
    set -e
    [ "$qrc" = 124 ] && { echo "$PROG: timed out after $TIMEOUT s" >&2; exit 124; }
    rc=$(sed -n 's/^xesp-vm: exit status \([0-9]*\)$/\1/p' "$WORK/console" | tail -n 1)
    [ -n "$rc" ] && exit "$rc"
    grep -q '^xesp-vm: kernel ' "$WORK/console" ||
        ! grep -q -E 'Kernel panic|Oops' "$WORK/console" || [ "$attempt" = 3 ] ||
        { echo "$PROG: the kernel died before the guest script started (boot $attempt of 3)" >&2
          continue; }
    die "the guest ended without an exit status (qemu: $qrc)"
done
