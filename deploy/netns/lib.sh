# Shared by deploy/netns/cluster.sh and deploy/netns/bench.sh (sourced, not run): the probe,
# the isotach binary, the namespaces and processes a run makes, and their teardown on every
# exit — success, failure, SIGINT and SIGTERM.
#
# The sourcing script sets NETNS_WHAT (how its messages start, e.g. "netns cluster") and may
# extend it once its arguments are parsed. Every namespace goes through netns_add and every
# process through netns_start, so the teardown knows them all.

# --- probe: root, ip netns, a bridge and a veth pair inside a throwaway namespace ----------------
# Prints why not and returns 1 when this machine cannot build the namespaces.
netns_probe() {
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

# --- the binary: $ISOTACH, else target/release/isotach, else target/debug/isotach ----------------
netns_find_isotach() {
    local repo
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    if [[ -z ${ISOTACH:-} ]]; then
        local cand
        for cand in "$repo/target/release/isotach" "$repo/target/debug/isotach"; do
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
}

# --- state and teardown ---------------------------------------------------------------------------
# netns_init: the work directory and the traps. PREFIX names this run's namespaces.
netns_init() {
    PREFIX=${ISOTACH_NETNS_PREFIX:-isotach-$$}
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/isotach-netns.XXXXXX")
    NSS=()     # namespaces we created (torn down in reverse)
    DAEMONS=() # pids of TMs and SIUs
    APPS=()    # pids of application processes
    LABELS=()  # label of each pid, by pid
    trap netns_cleanup EXIT
    trap 'echo "$NETNS_WHAT: interrupted" >&2; exit 1' INT TERM
}

# Runs on every exit: stops every process (SIGTERM, then SIGKILL after 3 s), kills anything
# else left in our namespaces, deletes them and the work directory (unless KEEP=1).
netns_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    local pid ns i
    for pid in "${APPS[@]}" "${DAEMONS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for _ in $(seq 1 30); do
        local alive=0
        for pid in "${APPS[@]}" "${DAEMONS[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${APPS[@]}" "${DAEMONS[@]}"; do
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
        echo "$NETNS_WHAT: logs and config kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}

# netns_add NS: a namespace with its loopback up, recorded for the teardown.
netns_add() {
    ip netns add "$1" || return 1
    NSS+=("$1")
    ip -n "$1" link set lo up
}

# netns_start KIND LABEL NS ARGS...: runs `isotach ARGS...` in namespace NS, output in
# $WORK/LABEL.log; KIND is `daemon` (stopped by netns_stop_daemons) or `app` (awaited by
# netns_wait_apps). `ip netns exec` execs the command, so $! is the isotach process itself.
netns_start() {
    local kind=$1 label=$2 ns=$3
    shift 3
    RUST_LOG=${RUST_LOG:-info} NO_COLOR=${NO_COLOR:-1} ip netns exec "$ns" "$ISOTACH" "$@" \
        </dev/null >"$WORK/$label.log" 2>&1 &
    local pid=$!
    LABELS[pid]=$label
    if [[ $kind == daemon ]]; then DAEMONS+=("$pid"); else APPS+=("$pid"); fi
}

# netns_fail WHY...: the run failed; prints the tail of every log and exits 1.
netns_fail() {
    echo "$NETNS_WHAT: FAILED: $*" >&2
    local f
    for f in "$WORK"/*.log; do
        [[ -e $f ]] || continue
        echo "--- $(basename "$f")" >&2
        tail -n 25 "$f" >&2
    done
    exit 1
}

# netns_wait_apps DEADLINE_S: waits until every application exited 0 while every daemon stays
# up; fails on the first application that exits otherwise, a daemon that exits, or the
# deadline. Sets ELAPSED (seconds, two decimals).
netns_wait_apps() {
    local deadline_s=$1 pid rc t0 us
    t0=${EPOCHREALTIME/./}
    local end=$(($(date +%s) + deadline_s))
    local -A done_rc=()
    while ((${#done_rc[@]} < ${#APPS[@]})); do
        for pid in "${APPS[@]}"; do
            [[ -n ${done_rc[$pid]:-} ]] && continue
            if ! kill -0 "$pid" 2>/dev/null; then
                rc=0
                wait "$pid" || rc=$?
                done_rc[$pid]=$rc
                ((rc == 0)) || netns_fail "${LABELS[pid]} exited with $rc"
            fi
        done
        for pid in "${DAEMONS[@]}"; do
            kill -0 "$pid" 2>/dev/null ||
                netns_fail "${LABELS[pid]} exited before the applications finished"
        done
        (($(date +%s) < end)) ||
            netns_fail "deadline of ${deadline_s}s passed (${#done_rc[@]} of ${#APPS[@]} applications done)"
        if ((${#done_rc[@]} < ${#APPS[@]})); then sleep 0.1; fi
    done
    us=$((${EPOCHREALTIME/./} - t0))
    ELAPSED=$(printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000)))
}

# netns_stop_daemons: SIGTERM to every daemon; each must exit 0 within 5 s.
netns_stop_daemons() {
    local pid rc
    for pid in "${DAEMONS[@]}"; do
        kill -TERM "$pid"
    done
    for pid in "${DAEMONS[@]}"; do
        rc=0
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && netns_fail "${LABELS[pid]} did not stop within 5 s of SIGTERM"
        wait "$pid" || rc=$?
        ((rc == 0)) || netns_fail "${LABELS[pid]} exited with $rc after SIGTERM"
    done
    DAEMONS=()
}
