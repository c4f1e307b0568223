#!/usr/bin/env bash
# A multi-host isotach cluster on one machine: K network namespaces ("hosts") joined by veth
# pairs to a bridge, one SIU and one dining philosopher (`isotach philo`) per namespace, token
# managers in the first TMS namespaces. Waits for every philosopher to exit 0 (with a
# deadline), stops the daemons with SIGTERM and checks they exit 0, prints one result line, and
# tears everything down on exit — on success, on failure and on SIGINT/SIGTERM.
#
# usage: cluster.sh K [MEALS]        run a cluster of K hosts (2..=200), MEALS meals each (20)
#        cluster.sh --probe          exit 0 if this machine can run it, 77 (with a reason) if not
#
# environment:
#   ISOTACH              the isotach binary (default: target/release/isotach, else
#                        target/debug/isotach, relative to the repository)
#   TMS                  token managers (switches), 1..=K (default 1); host i uses switch i % TMS,
#                        switch j runs in namespace j, switches are trunked in a line
#   DEADLINE_S           seconds before the run is declared failed (default 40)
#   ISOTACH_NETNS_PREFIX namespace name prefix (default isotach-PID, unique per run)
#   KEEP=1               keep the work directory (config and logs) after the run
#
# Layout: namespace PREFIX-hub holds the bridge br0 and the veth ends v0..v(K-1); namespace
# PREFIX-nI holds eth0 with 10.77.0.(I+1)/24. Nothing is created in the caller's namespace, and
# deleting the namespaces removes every link. Addresses: TM j listens on 10.77.0.(j+1):7400,
# SIU i on 10.77.0.(i+1):7410, philosopher i on 10.77.0.(i+1):7420.
#
# Exit: 0 every philosopher ate every meal and every daemon stopped cleanly; 1 the run failed
# (logs are printed); 2 usage error or the cluster could not be built; 77 (--probe) cannot run.
set -euo pipefail

die_usage() {
    echo "usage: $0 K [MEALS] | $0 --probe" >&2
    exit 2
}

# --- probe: root, ip netns, a bridge and a veth pair inside a throwaway namespace ----------------
probe() {
    if [[ $(id -u) != 0 ]]; then
        echo "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        return 1
    fi
    if ! command -v ip >/dev/null 2>&1; then
        echo "no \`ip\` command (iproute2)"
        return 1
    fi
    local ns="isotach-probe-$$"
    if ! ip netns add "$ns" 2>/dev/null; then
        echo "\`ip netns add\` failed (no CAP_SYS_ADMIN/CAP_NET_ADMIN, or /run/netns unusable)"
        return 1
    fi
    local ok=0 why=""
    if ! ip -n "$ns" link add pbr0 type bridge 2>/dev/null; then
        ok=1 why="cannot create a bridge (no bridge support in the kernel?)"
    elif ! ip -n "$ns" link add pv0 type veth peer name pv1 2>/dev/null; then
        ok=1 why="cannot create a veth pair (no veth support in the kernel?)"
    fi
    ip netns del "$ns" 2>/dev/null || true
    [[ $ok == 0 ]] || echo "$why"
    return $ok
}

if [[ ${1:-} == --probe ]]; then
    if reason=$(probe); then
        echo "netns cluster: this machine can run it"
        exit 0
    fi
    echo "netns cluster: cannot run here: $reason"
    exit 77
fi

K=${1:-}
MEALS=${2:-20}
TMS=${TMS:-1}
DEADLINE_S=${DEADLINE_S:-40}
[[ $K =~ ^[0-9]+$ ]] && ((K >= 2 && K <= 200)) || die_usage
[[ $MEALS =~ ^[0-9]+$ ]] && ((MEALS >= 1)) || die_usage
[[ $TMS =~ ^[0-9]+$ ]] && ((TMS >= 1 && TMS <= K)) || {
    echo "TMS must be in 1..=$K" >&2
    exit 2
}
[[ $DEADLINE_S =~ ^[0-9]+$ ]] && ((DEADLINE_S >= 1)) || {
    echo "DEADLINE_S must be a positive number of seconds" >&2
    exit 2
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -z ${ISOTACH:-} ]]; then
    for cand in "$REPO/target/release/isotach" "$REPO/target/debug/isotach"; do
        if [[ -x $cand ]]; then
            ISOTACH=$cand
            break
        fi
    done
fi
if [[ -z ${ISOTACH:-} || ! -x $ISOTACH ]]; then
    echo "error: no isotach binary (set ISOTACH, or cargo build --release -p isotach-cli)" >&2
    exit 2
fi

if ! reason=$(probe); then
    echo "error: cannot build network namespaces here: $reason" >&2
    exit 2
fi

PREFIX=${ISOTACH_NETNS_PREFIX:-isotach-$$}
HUB="$PREFIX-hub"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/isotach-netns.XXXXXX")
NSS=()      # namespaces we created (torn down in reverse)
DAEMONS=()  # pids of TMs and SIUs
PHILOS=()   # pids of philosophers
LABELS=()   # label of each pid, by pid
STATUS=0

# --- teardown: runs on every exit -----------------------------------------------------------------
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    local pid ns
    for pid in "${PHILOS[@]}" "${DAEMONS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for _ in $(seq 1 30); do
        local alive=0
        for pid in "${PHILOS[@]}" "${DAEMONS[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${PHILOS[@]}" "${DAEMONS[@]}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    # Anything else still inside our namespaces was started by this run: stop it too.
    for ns in "${NSS[@]}"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null
        done
    done
    for ((i = ${#NSS[@]} - 1; i >= 0; i--)); do
        ip netns del "${NSS[i]}" 2>/dev/null
    done
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "netns cluster: logs and config kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "netns cluster: interrupted" >&2; exit 1' INT TERM

addr() { echo "10.77.0.$(($1 + 1))"; }

# --- the network ----------------------------------------------------------------------------------
build_network() {
    ip netns add "$HUB"
    NSS+=("$HUB")
    ip -n "$HUB" link set lo up
    ip -n "$HUB" link add br0 type bridge
    ip -n "$HUB" link set br0 up
    local i ns
    for ((i = 0; i < K; i++)); do
        ns="$PREFIX-n$i"
        ip netns add "$ns"
        NSS+=("$ns")
        ip -n "$ns" link set lo up
        ip -n "$HUB" link add "v$i" type veth peer name eth0 netns "$ns"
        ip -n "$HUB" link set "v$i" master br0
        ip -n "$HUB" link set "v$i" up
        ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
}
if ! build_network; then
    echo "error: could not build the namespaces and links" >&2
    exit 2
fi

# --- the config -----------------------------------------------------------------------------------
CONFIG="$WORK/cluster.toml"
{
    echo "# Generated by deploy/netns/cluster.sh: $K hosts, $TMS token manager(s)."
    echo '[transport]'
    echo 'kind = "udp"'
    for ((j = 0; j < TMS; j++)); do
        printf '\n[[switch]]\nname = "tm%d"\nlisten = "%s:7400"\n' "$j" "$(addr "$j")"
    done
    for ((j = 0; j + 1 < TMS; j++)); do
        printf '\n[[trunk]]\nbetween = ["tm%d", "tm%d"]\n' "$j" "$((j + 1))"
    done
    for ((i = 0; i < K; i++)); do
        printf '\n[[host]]\nname = "h%d"\nswitch = "tm%d"\nsiu = "%s:7410"\napp = "%s:7420"\n' \
            "$i" "$((i % TMS))" "$(addr "$i")" "$(addr "$i")"
    done
} >"$CONFIG"
if ! "$ISOTACH" check-config "$CONFIG" >/dev/null; then
    echo "error: the generated config is invalid: $CONFIG" >&2
    exit 2
fi

# --- the processes --------------------------------------------------------------------------------
# `ip netns exec` execs the command, so $! is the isotach process itself.
start() { # start LIST LABEL NS ARGS...
    local list=$1 label=$2 ns=$3
    shift 3
    RUST_LOG=${RUST_LOG:-info} NO_COLOR=${NO_COLOR:-1} ip netns exec "$ns" "$ISOTACH" "$@" \
        </dev/null >"$WORK/$label.log" 2>&1 &
    local pid=$!
    LABELS[pid]=$label
    if [[ $list == daemon ]]; then DAEMONS+=("$pid"); else PHILOS+=("$pid"); fi
}
for ((i = 0; i < K; i++)); do
    ns="$PREFIX-n$i"
    if ((i < TMS)); then
        start daemon "tm$i" "$ns" tm --config "$CONFIG" --name "tm$i"
    fi
    start daemon "siu-h$i" "$ns" siu --config "$CONFIG" --host "h$i"
    start philo "philo-h$i" "$ns" philo --config "$CONFIG" --host "h$i" \
        --meals "$MEALS" --timeout-s "$DEADLINE_S"
done

fail() {
    echo "netns cluster: K=$K tms=$TMS meals=$MEALS: FAILED: $*" >&2
    local f
    for f in "$WORK"/*.log; do
        echo "--- $(basename "$f")" >&2
        tail -n 25 "$f" >&2
    done
    exit 1
}

# --- wait for the philosophers (and watch the daemons) -------------------------------------------
T0=${EPOCHREALTIME/./}
END=$(($(date +%s) + DEADLINE_S))
declare -A DONE=()
while ((${#DONE[@]} < K)); do
    for pid in "${PHILOS[@]}"; do
        [[ -n ${DONE[$pid]:-} ]] && continue
        if ! kill -0 "$pid" 2>/dev/null; then
            rc=0
            wait "$pid" || rc=$?
            DONE[$pid]=$rc
            ((rc == 0)) || fail "${LABELS[pid]} exited with $rc"
        fi
    done
    for pid in "${DAEMONS[@]}"; do
        kill -0 "$pid" 2>/dev/null || fail "${LABELS[pid]} exited before the philosophers finished"
    done
    (($(date +%s) < END)) || fail "deadline of ${DEADLINE_S}s passed (${#DONE[@]} of $K philosophers done)"
    if ((${#DONE[@]} < K)); then sleep 0.1; fi
done
US=$((${EPOCHREALTIME/./} - T0))
ELAPSED=$(printf '%d.%02d' $((US / 1000000)) $((US % 1000000 / 10000)))

# --- graceful shutdown: SIGTERM, every daemon exits 0 ---------------------------------------------
for pid in "${DAEMONS[@]}"; do
    kill -TERM "$pid"
done
for pid in "${DAEMONS[@]}"; do
    rc=0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && fail "${LABELS[pid]} did not stop within 5 s of SIGTERM"
    wait "$pid" || rc=$?
    ((rc == 0)) || fail "${LABELS[pid]} exited with $rc after SIGTERM"
done
DAEMONS=()

for ((i = 0; i < K; i++)); do
    grep -h '^philosopher' "$WORK/philo-h$i.log" || true
done
echo "netns cluster: K=$K tms=$TMS meals=$MEALS: ok: $K philosophers ate $((K * MEALS)) meals in ${ELAPSED}s across $K namespaces; daemons stopped cleanly"
exit "$STATUS"
