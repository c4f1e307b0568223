#!/usr/bin/env bash
# Runs one command as root in a throwaway virtual machine booted from a stock distribution kernel,
# for machines whose own kernel cannot shape links (containers and VMs built without
# CONFIG_NET_SCH_NETEM): `vm.sh -- deploy/netns/bench.sh --json` takes the shaped figures there.
#
# The guest sees this machine's root file system over 9p (so the same binaries, the same
# repository and the same tools, /tmp included), under an overlay whose writes stay in the
# guest's memory, with a fresh /run; it loads the kernel's
# sch_netem, veth and bridge modules, runs COMMAND in the caller's working directory with the
# environment variables named below, and powers off. The command's stdout and stderr become
# this script's, and so does its exit status. Nothing the guest does outlives it: its network
# namespaces, processes and writes go with the VM; the host's files cannot be written (the 9p
# export is read-only). The command, its scripts and its binaries must live outside /run.
#
# usage: vm.sh [options] -- COMMAND [ARG...]
#        vm.sh --probe        exit 0 if this machine can run it (and say with which kernel and
#                             accelerator), 77 (with a reason) if not
# options:
#   --kernel PATH    kernel image (default: the newest /boot/vmlinuz-* whose modules include
#                    sch_netem, veth, bridge and the 9p file system)
#   --cpus N         virtual CPUs, 1..=64 (default: this machine's)
#   --memory MIB     guest memory, 256..=65536 MiB (2048)
#   --accel A        kvm, tcg or auto (auto): kvm needs hardware virtualisation (the kvm_intel or
#                    kvm_amd module); tcg emulates every instruction, so CPU-bound figures come
#                    out many times slower than on the host (measure the dilation in the same
#                    run: see docs/bench.md, "Real hosts")
#   --timeout S      seconds before the VM is stopped, 10..=86400 (900); exit 124 then
#   --env NAME       pass the host's NAME into the guest too (repeatable); always passed when set:
#                    ISOTACH, DEADLINE_S, ISOTACH_NETNS_PREFIX, KEEP, RUST_LOG, RUST_BACKTRACE
#
# Needs: root is not required, but the command usually is root inside; qemu-system-x86_64,
# a statically linked busybox, kmod's modprobe, cpio and gzip (Debian: qemu-system-x86,
# busybox-static, kmod, cpio, gzip; the kernel: linux-image-amd64).
#
# Exit: the command's status; 2 usage error or the VM could not be prepared; 77 (--probe) cannot
# run here; 124 the timeout stopped the VM; 125 the VM ended without the command's status
# (the console log is printed).
set -euo pipefail

WHAT="netns vm"
usage() {
    echo "usage: $0 [--kernel PATH] [--cpus N] [--memory MIB] [--accel kvm|tcg|auto]" \
        "[--timeout S] [--env NAME]... -- COMMAND [ARG...] | $0 --probe" >&2
    exit 2
}
bad() {
    echo "error: $*" >&2
    usage
}
in_range() { [[ $1 =~ ^[0-9]{1,9}$ ]] && (($1 >= $2 && $1 <= $3)); }

# The modules the guest needs: the 9p root before switching to it, then the shaping and links.
BOOT_MODULES=(virtio_pci 9pnet_virtio 9p overlay)
NET_MODULES=(sch_netem veth bridge)

# module_file VER NAME: the module's path under /lib/modules/VER, or nothing.
module_file() {
    modprobe -S "$1" --show-depends "$2" 2>/dev/null | awk '$1 == "insmod" { f = $2 } END { print f }'
}

# kernel_ok IMAGE: prints why IMAGE cannot boot the guest and returns 1, else returns 0.
kernel_ok() {
    local image=$1 ver m
    [[ -r $image ]] || { echo "no kernel image $image" && return 1; }
    ver=${image##*/vmlinuz-}
    [[ $ver != "$image" ]] || { echo "$image is not named vmlinuz-VERSION" && return 1; }
    [[ -d /lib/modules/$ver ]] || { echo "no /lib/modules/$ver for $image" && return 1; }
    for m in "${BOOT_MODULES[@]}" "${NET_MODULES[@]}"; do
        [[ -n $(module_file "$ver" "$m") ]] ||
            { echo "kernel $ver has no module $m" && return 1; }
    done
}

# find_kernel: the newest /boot/vmlinuz-* that kernel_ok accepts.
find_kernel() {
    local image
    for image in $(printf '%s\n' /boot/vmlinuz-* | sort -rV); do
        kernel_ok "$image" >/dev/null && { echo "$image" && return 0; }
    done
    return 1
}

# tools_ok: prints what is missing and returns 1.
tools_ok() {
    local t
    for t in qemu-system-x86_64 modprobe cpio gzip; do
        command -v "$t" >/dev/null 2>&1 || { echo "no \`$t\` command" && return 1; }
    done
    local busybox
    busybox=$(command -v busybox || true)
    [[ -n $busybox ]] || { echo "no \`busybox\` command (busybox-static)" && return 1; }
    if ! LC_ALL=C file -L "$busybox" 2>/dev/null | grep -q "statically linked"; then
        # Without `file`, ldd says "not a dynamic executable" for a static one.
        LC_ALL=C ldd "$busybox" 2>&1 | grep -q "not a dynamic" ||
            { echo "$busybox is not statically linked (busybox-static)" && return 1; }
    fi
}

# pick_accel WANT: kvm or tcg. kvm only with hardware virtualisation behind /dev/kvm: a /dev/kvm
# from another hypervisor (such as a PVM host's kvm_pvm) boots only kernels built for it.
pick_accel() {
    local hw=0
    [[ -r /dev/kvm && -w /dev/kvm ]] && [[ -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ]] &&
        hw=1
    case $1 in
    auto) ((hw)) && echo kvm || echo tcg ;;
    kvm) ((hw)) || { echo "error: --accel kvm: no hardware virtualisation behind /dev/kvm" >&2 &&
        return 1; }
        echo kvm ;;
    tcg) echo tcg ;;
    esac
}

if [[ ${1:-} == --probe ]]; then
    if ! why=$(tools_ok); then
        echo "$WHAT: cannot run here: $why"
        exit 77
    fi
    if ! kernel=$(find_kernel); then
        echo "$WHAT: cannot run here: no /boot/vmlinuz-* with modules for ${BOOT_MODULES[*]}" \
            "${NET_MODULES[*]} (Debian: linux-image-amd64)"
        exit 77
    fi
    echo "$WHAT: this machine can run it (kernel $kernel, accelerator $(pick_accel auto))"
    exit 0
fi

# --- arguments ------------------------------------------------------------------------------------
KERNEL="" CPUS=$(nproc) MEMORY_MIB=2048 ACCEL=auto TIMEOUT_S=900
PASS=(ISOTACH DEADLINE_S ISOTACH_NETNS_PREFIX KEEP RUST_LOG RUST_BACKTRACE)
while (($#)); do
    case $1 in
    --) shift && break ;;
    --kernel | --cpus | --memory | --accel | --timeout | --env) ;;
    *) bad "unknown argument \`$1\` (the command goes after --)" ;;
    esac
    (($# >= 2)) || bad "$1 needs a value"
    case $1 in
    --kernel) KERNEL=$2 ;;
    --cpus) in_range "$2" 1 64 || bad "--cpus must be in 1..=64"
        CPUS=$2 ;;
    --memory) in_range "$2" 256 65536 || bad "--memory must be in 256..=65536 MiB"
        MEMORY_MIB=$2 ;;
    --accel) [[ $2 =~ ^(kvm|tcg|auto)$ ]] || bad "--accel is kvm, tcg or auto"
        ACCEL=$2 ;;
    --timeout) in_range "$2" 10 86400 || bad "--timeout must be in 10..=86400 seconds"
        TIMEOUT_S=$2 ;;
    --env) [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || bad "--env takes a variable name, not \`$2\`"
        PASS+=("$2") ;;
    esac
    shift 2
done
(($#)) || bad "no command (give it after --)"

if ! why=$(tools_ok); then
    echo "error: $WHAT: cannot run here: $why" >&2
    exit 2
fi
if [[ -z $KERNEL ]]; then
    KERNEL=$(find_kernel) || {
        echo "error: $WHAT: no /boot/vmlinuz-* with modules for ${BOOT_MODULES[*]}" \
            "${NET_MODULES[*]} (Debian: linux-image-amd64)" >&2
        exit 2
    }
elif ! why=$(kernel_ok "$KERNEL"); then
    echo "error: $WHAT: --kernel: $why" >&2
    exit 2
fi
ACCEL=$(pick_accel "$ACCEL") || exit 2
BUSYBOX=$(command -v busybox)
VER=${KERNEL##*/vmlinuz-}

# --- the initramfs: busybox, the 9p modules, an init that switches to the host's root -------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/isotach-vm.XXXXXX")
QEMU_PID=""
cleanup() {
    # Stop the VM and wait for it: nothing of the run outlives this script.
    if [[ -n $QEMU_PID ]]; then
        kill "$QEMU_PID" 2>/dev/null || true
        wait "$QEMU_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "$WHAT: interrupted" >&2; exit 130' INT TERM

ROOT=$WORK/initrd OUT=$WORK/out
mkdir -p "$ROOT"/{bin,dev,proc,sys,newroot,modules} "$OUT"
cp "$BUSYBOX" "$ROOT/bin/busybox"
for m in "${BOOT_MODULES[@]}"; do modprobe -S "$VER" --show-depends "$m"; done |
    awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r path; do
    name=$(basename "$path")
    case $name in
    *.ko) cp "$path" "$ROOT/modules/$name" ;;
    *.ko.xz) xz -dc "$path" >"$ROOT/modules/${name%.xz}" ;;
    *.ko.zst) zstd -qdc "$path" >"$ROOT/modules/${name%.zst}" ;;
    *.ko.gz) gzip -dc "$path" >"$ROOT/modules/${name%.gz}" ;;
    *) echo "error: $WHAT: cannot unpack module $path" >&2 && exit 2 ;;
    esac
    echo "${name%.ko*}.ko" >>"$ROOT/modules/order"
done

cat >"$ROOT/init" <<'EOF'
#!/bin/busybox sh
# PID 1 of the initramfs: mount the host's root read-only over 9p and continue there.
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules/order); do $B insmod /modules/$m || echo "vm: insmod $m failed"; done
# The host's root, read-only, under an overlay whose upper layer is this VM's memory: the
# command may write anywhere (its temporary files, /tmp included) and the host sees none of it.
$B mkdir -p /lower /rw
if ! $B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower ||
    ! $B mount -t tmpfs -o mode=0755 tmpfs /rw || ! $B mkdir -p /rw/upper /rw/work ||
    ! $B mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot; then
    echo "vm: cannot mount the host's root"
    $B poweroff -f
fi
$B mount -t tmpfs -o mode=0755 tmpfs /newroot/run
$B mkdir -p /newroot/run/isotach-vm
$B mount -t 9p -o trans=virtio,version=9p2000.L,rw out /newroot/run/isotach-vm
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount --move /dev /newroot/dev
exec $B switch_root /newroot /bin/bash /run/isotach-vm/guest.sh
EOF
chmod +x "$ROOT/init"
(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) >"$WORK/initrd.gz"

# --- the guest's script: set up, run the command, record its status, power off --------------------
{
    echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root"
    for name in "${PASS[@]}"; do
        [[ -z ${!name+x} ]] || printf 'export %s=%q\n' "$name" "${!name}"
    done
    printf 'CWD=%q\n' "$PWD"
    printf 'set --'
    printf ' %q' "$@"
    echo
    cat <<'EOF'
O=/run/isotach-vm
B=/bin/busybox
# What udev would have made: /dev/fd for bash's process substitution, a pty and shm mount.
$B ln -sf /proc/self/fd /dev/fd
$B ln -sf /proc/self/fd/0 /dev/stdin
$B ln -sf /proc/self/fd/1 /dev/stdout
$B ln -sf /proc/self/fd/2 /dev/stderr
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts devpts /dev/pts
$B mount -t tmpfs tmpfs /dev/shm
# `ip netns` bind-mounts namespaces under /run/netns: the root must propagate mounts.
$B mount --make-rshared /
$B hostname isotach-vm
# Loopback up, as an init system would leave it (the guest has no other interface).
$B ip link set lo up
for m in sch_netem veth bridge; do modprobe "$m" || echo "vm: modprobe $m failed" >&2; done
status=0
cd "$CWD" && "$@" >"$O/stdout" 2>"$O/stderr" || status=$?
echo "$status" >"$O/status"
sync
$B poweroff -f
EOF
} >"$OUT/guest.sh"

# --- run ------------------------------------------------------------------------------------------
ACCEL_ARGS=(-accel "tcg,thread=multi" -cpu max)
[[ $ACCEL == tcg ]] || ACCEL_ARGS=(-accel kvm -cpu host)
echo "$WHAT: booting $KERNEL ($ACCEL, $CPUS CPUs, $MEMORY_MIB MiB)" >&2
timeout --foreground -k 5 "$TIMEOUT_S" qemu-system-x86_64 "${ACCEL_ARGS[@]}" \
    -smp "$CPUS" -m "$MEMORY_MIB" -nographic -no-reboot -nic none \
    -kernel "$KERNEL" -initrd "$WORK/initrd.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=passthrough" \
    </dev/null >"$WORK/console.log" 2>&1 &
QEMU_PID=$!
qemu_status=0
wait "$QEMU_PID" || qemu_status=$?
QEMU_PID=""

[[ ! -f $OUT/stdout ]] || cat "$OUT/stdout"
[[ ! -f $OUT/stderr ]] || cat "$OUT/stderr" >&2
if ((qemu_status == 124)); then
    echo "error: $WHAT: stopped after --timeout $TIMEOUT_S s" >&2
    exit 124
fi
if [[ ! -f $OUT/status ]]; then
    echo "error: $WHAT: the VM ended without the command's status (qemu exit $qemu_status);" \
        "its console:" >&2
    tail -n 40 "$WORK/console.log" >&2
    exit 125
fi
exit "$(cat "$OUT/status")"
