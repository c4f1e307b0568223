#!/usr/bin/env bash
# The bank workload on a tree of real network namespaces, measured against a ping between two of
# them in the same run.
#
# One namespace per switch and per host. The root switch's namespace holds a bridge; each leaf
# switch's namespace holds a bridge joined to the root's by a veth pair (the trunk), and each
# host's namespace an eth0 joined by a veth pair to its leaf's bridge. Every veth end is shaped
# with `tc netem` (DELAY one-way per link and direction, with JITTER and optional LOSS), so a
# packet crossing a link waits DELAY, and host to host across the root is four links. Each
# switch runs its token manager (`isotach tm`) on its bridge's address, each host its SIU
# (`isotach siu`) and one application process (`isotach transfers`: atomic transfers between
# replicated accounts). Host 0 then reads every account and the total must be conserved.
#
# It measures, in one run: the ping round trip between host 0 and the last host (across the
# root, four links, when there are two leaves or more) and between host 0 and the next host on
# its leaf (two links), before the daemons start; then the pulse period the applications saw,
# the transfer latency p50/p99 (merged over every host), the throughput and how busy the
# machine's CPUs were; and prints each figure as a ratio to the first ping's p50. It tears
# everything down on exit — on success, on failure and on SIGINT/SIGTERM.
#
# usage: bench.sh [options]          run the bench
#        bench.sh --probe            exit 0 if this machine can run it (and say whether it can
#                                    shape links), 77 (with a reason) if not
# options:
#   --hosts N        SIU hosts, 2..=200 (8); spread in blocks over the leaves
#   --leaves L       leaf switches under the root switch, 1..=16 (2): L + 1 token managers
#   --seconds S      measurement window of the workload (3)
#   --clients C      transfers each host keeps in flight (4)
#   --accounts A     accounts (256)
#   --idiom I        sched-assign (read+sched, then assign) or add (one isochron of two adds)
#   --delay-us D     one-way delay of every link and direction, µs (50)
#   --jitter-us J    jitter of that delay, µs (5; netem reorders packets when it jitters)
#   --loss-pct P     packet loss on every link and direction, percent (0)
#   --unshaped       no netem: the links are plain veth pairs (for kernels without netem)
#   --embedded-siu   each host's SIU runs inside its application process (`isotach transfers
#                    --embedded-siu`) instead of as an `isotach siu` daemon
#   --pings N        pings in each baseline series (200, at 10 ms intervals)
#   --token-timeout-us T  the cluster's lost-token timer, `[timing] token-timeout-us` (default:
#                    the config's, or 8 x (delay + jitter) when that is longer: the timer must
#                    outlast a link's round trip, or every token is repeated for nothing)
#   --json           print one JSON object on stdout instead of the summary lines
#
# environment:
#   ISOTACH              the isotach binary (default: target/release/isotach, else
#                        target/debug/isotach, relative to the repository)
#   DEADLINE_S           seconds before the workload is declared failed (3 x seconds + 40)
#   ISOTACH_NETNS_PREFIX namespace name prefix (default isotach-PID, unique per run)
#   KEEP=1               keep the work directory (config, logs, histograms) after the run
#
# Addresses: switch j (0 the root) listens on 10.77.0.(j+1):7400 (its bridge br0); host i has
# 10.77.1.(i+1)/16 on its eth0, SIU port 7410, application port 7420. Namespaces:
# PREFIX-s0…sL, PREFIX-h0…h(N-1). Nothing is created in the caller's namespace.
#
# Exit: 0 every host finished, the total was conserved and every daemon stopped cleanly; 1 the
# run failed (logs are printed); 2 usage error, or the network could not be built (also: netem
# missing without --unshaped); 77 (--probe) cannot run.
set -euo pipefail

# shellcheck source=deploy/netns/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NETNS_WHAT="netns bench"

usage() {
    echo "usage: $0 [--hosts N] [--leaves L] [--seconds S] [--clients C] [--accounts A]" \
        "[--idiom sched-assign|add] [--delay-us D] [--jitter-us J] [--loss-pct P] [--unshaped]" \
        "[--embedded-siu] [--pings N] [--json] | $0 --probe" >&2
    exit 2
}
bad() {
    echo "error: $*" >&2
    usage
}

# --- probe: netem and ping, beyond what netns_probe checks ----------------------------------------
# Prints why links cannot be shaped and returns 1 when netem is missing (after trying
# `modprobe sch_netem`).
netem_probe() {
    if ! command -v tc >/dev/null 2>&1; then
        echo "no \`tc\` command (iproute2)"
        return 1
    fi
    local ns="isotach-netem-probe-$$" ok=1 modprobe="no \`modprobe\` to load it"
    ip netns add "$ns" 2>/dev/null || {
        echo "\`ip netns add\` failed"
        return 1
    }
    if ip -n "$ns" link add pv0 type veth peer name pv1 2>/dev/null; then
        local try
        for try in 1 2; do
            if tc -n "$ns" qdisc add dev pv0 root netem delay 50us 5us 2>/dev/null; then
                ok=0
                break
            fi
            if ((try == 1)) && command -v modprobe >/dev/null 2>&1; then
                modprobe sch_netem 2>/dev/null && modprobe="loaded sch_netem, still refused" ||
                    modprobe="\`modprobe sch_netem\` failed"
            fi
        done
    fi
    ip netns del "$ns" 2>/dev/null || true
    ((ok == 0)) || echo "\`tc qdisc add … netem\` refused: no netem qdisc in this kernel (CONFIG_NET_SCH_NETEM; $modprobe)"
    return $ok
}
ping_probe() {
    command -v ping >/dev/null 2>&1 || {
        echo "no \`ping\` command (iputils-ping)"
        return 1
    }
}

if [[ ${1:-} == --probe ]]; then
    if ! reason=$(netns_probe) || ! reason=$(ping_probe); then
        echo "netns bench: cannot run here: $reason"
        exit 77
    fi
    if reason=$(netem_probe); then
        echo "netns bench: this machine can run it (links shaped with netem)"
    else
        echo "netns bench: this machine can run it unshaped only (--unshaped): $reason"
    fi
    exit 0
fi

# --- arguments ------------------------------------------------------------------------------------
HOSTS=8 LEAVES=2 WINDOW_S=3 CLIENTS=4 ACCOUNTS=256 IDIOM=sched-assign
DELAY_US=50 JITTER_US=5 LOSS_PCT=0 SHAPED=1 SHAPING_GIVEN=0 PINGS=200 JSON=0 EMBEDDED=0
TOKEN_TIMEOUT_US=""
# in_range VALUE LO HI: VALUE is an integer in LO..=HI.
in_range() { [[ $1 =~ ^[0-9]{1,9}$ ]] && (($1 >= $2 && $1 <= $3)); }
# decimal VALUE: a non-negative decimal number.
decimal() { [[ $1 =~ ^[0-9]{1,9}(\.[0-9]{1,9})?$ ]]; }
while (($#)); do
    flag=$1
    case $flag in
    --unshaped) SHAPED=0 && shift && continue ;;
    --json) JSON=1 && shift && continue ;;
    --embedded-siu) EMBEDDED=1 && shift && continue ;;
    --hosts | --leaves | --seconds | --clients | --accounts | --idiom | --delay-us | --jitter-us | \
        --loss-pct | --pings | --token-timeout-us) ;;
    *) bad "unknown argument \`$flag\`" ;;
    esac
    (($# >= 2)) || bad "$flag needs a value"
    value=$2
    shift 2
    case $flag in
    --hosts) in_range "$value" 2 200 || bad "--hosts must be in 2..=200"
        HOSTS=$value ;;
    --leaves) in_range "$value" 1 16 || bad "--leaves must be in 1..=16"
        LEAVES=$value ;;
    --seconds) decimal "$value" && awk -v s="$value" 'BEGIN { exit !(s >= 0.01 && s <= 3600) }' ||
        bad "--seconds must be in 0.01..=3600"
        WINDOW_S=$value ;;
    --clients) in_range "$value" 1 256 || bad "--clients must be in 1..=256"
        CLIENTS=$value ;;
    --accounts) in_range "$value" 2 4096 || bad "--accounts must be in 2..=4096"
        ACCOUNTS=$value ;;
    --idiom) [[ $value == sched-assign || $value == add ]] || bad "--idiom is sched-assign or add"
        IDIOM=$value ;;
    --delay-us) in_range "$value" 0 1000000 || bad "--delay-us must be in 0..=1000000"
        DELAY_US=$value SHAPING_GIVEN=1 ;;
    --jitter-us) in_range "$value" 0 1000000 || bad "--jitter-us must be in 0..=1000000"
        JITTER_US=$value SHAPING_GIVEN=1 ;;
    --loss-pct) decimal "$value" && awk -v p="$value" 'BEGIN { exit !(p < 100) }' ||
        bad "--loss-pct must be a percentage below 100"
        LOSS_PCT=$value SHAPING_GIVEN=1 ;;
    --pings) in_range "$value" 2 100000 || bad "--pings must be in 2..=100000"
        PINGS=$value ;;
    --token-timeout-us) in_range "$value" 100 10000000 ||
        bad "--token-timeout-us must be in 100..=10000000 (the config's bounds)"
        TOKEN_TIMEOUT_US=$value ;;
    esac
done
((HOSTS >= LEAVES)) || bad "--hosts ($HOSTS) must be at least --leaves ($LEAVES)"
((SHAPED || !SHAPING_GIVEN)) || bad "--unshaped takes no --delay-us, --jitter-us or --loss-pct"
DEADLINE_S=${DEADLINE_S:-$(awk -v s="$WINDOW_S" 'BEGIN { printf "%d", 3 * s + 40 }')}
in_range "$DEADLINE_S" 1 86400 || bad "DEADLINE_S must be in 1..=86400 seconds"

netns_find_isotach
for check in netns_probe ping_probe; do
    if ! reason=$($check); then
        echo "error: cannot run the netns bench here: $reason" >&2
        exit 2
    fi
done
if ((SHAPED)) && ! reason=$(netem_probe); then
    echo "error: cannot shape the links: $reason; run with --unshaped to measure plain veth links" >&2
    exit 2
fi
TMS=$((LEAVES + 1))
if ((SHAPED)); then
    SHAPE="netem ${DELAY_US}us±${JITTER_US}us loss ${LOSS_PCT}%"
else
    SHAPE="unshaped"
fi
NETNS_WHAT="netns bench: hosts=$HOSTS tms=$TMS $SHAPE"
netns_init

switch_addr() { echo "10.77.0.$(($1 + 1))"; }
host_addr() { echo "10.77.1.$(($1 + 1))"; }
leaf_of() { echo $((1 + $1 * LEAVES / HOSTS)); } # host i's switch (1..=LEAVES)

# --- the network ----------------------------------------------------------------------------------
# shape NS DEV: netem on the egress of one veth end (both ends of a link are shaped, so each
# direction waits DELAY once per link).
# (Each step below returns 1 on failure: these functions run under `if !`, where `set -e` is off.)
shape() {
    ((SHAPED)) || return 0
    local loss=()
    [[ $LOSS_PCT == 0 ]] || loss=(loss "${LOSS_PCT}%")
    tc -n "$1" qdisc add dev "$2" root netem delay "${DELAY_US}us" "${JITTER_US}us" "${loss[@]}"
}
# switch_ns J: namespace PREFIX-sJ with the bridge br0 holding the switch's address.
switch_ns() {
    local ns="$PREFIX-s$1"
    netns_add "$ns" &&
        ip -n "$ns" link add br0 type bridge &&
        ip -n "$ns" addr add "$(switch_addr "$1")/16" dev br0 &&
        ip -n "$ns" link set br0 up
}
# link NS_A DEV_A NS_B DEV_B [ADDR]: a shaped veth pair; DEV_A is a port of NS_A's bridge, DEV_B
# a port of NS_B's bridge, or (ADDR given) NS_B's interface with address ADDR.
link() {
    local ns_a=$1 dev_a=$2 ns_b=$3 dev_b=$4 addr=${5:-}
    ip -n "$ns_a" link add "$dev_a" type veth peer name "$dev_b" netns "$ns_b" &&
        ip -n "$ns_a" link set "$dev_a" master br0 || return 1
    if [[ -n $addr ]]; then
        ip -n "$ns_b" addr add "$addr/16" dev "$dev_b" || return 1
    else
        ip -n "$ns_b" link set "$dev_b" master br0 || return 1
    fi
    shape "$ns_a" "$dev_a" &&
        shape "$ns_b" "$dev_b" &&
        ip -n "$ns_a" link set "$dev_a" up &&
        ip -n "$ns_b" link set "$dev_b" up
}
build_network() {
    local j i
    for ((j = 0; j <= LEAVES; j++)); do
        switch_ns "$j" || return 1
    done
    for ((j = 1; j <= LEAVES; j++)); do
        link "$PREFIX-s0" "down$j" "$PREFIX-s$j" up0 || return 1
    done
    for ((i = 0; i < HOSTS; i++)); do
        netns_add "$PREFIX-h$i" || return 1
        link "$PREFIX-s$(leaf_of "$i")" "h$i" "$PREFIX-h$i" eth0 "$(host_addr "$i")" || return 1
    done
}
if ! build_network; then
    echo "error: could not build the namespaces and links" >&2
    exit 2
fi

# Other work on the machine (the 1-minute load average before anything of ours runs): the
# figures compete with it for the CPUs.
LOAD_BEFORE=$(cut -d ' ' -f 1 /proc/loadavg)

# --- the baseline: ping between host namespaces, before any daemon runs ---------------------------
# ping_rtt FROM TO: "P50_US AVG_US SAMPLES" of PINGS pings (after 3 unmeasured ones that
# resolve the neighbours), from per-packet times.
ping_rtt() {
    local from="$PREFIX-h$1" to
    to=$(host_addr "$2")
    ip netns exec "$from" ping -c 3 -i 0.01 -W 1 -q "$to" >/dev/null 2>&1 || true
    ip netns exec "$from" ping -c "$PINGS" -i 0.01 -W 1 -n "$to" 2>/dev/null |
        sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' | sort -n |
        awk '{ t[NR] = $1 * 1000; s += t[NR] }
             END { if (NR == 0) { print "0 0 0"; exit }
                   printf "%.1f %.1f %d\n", t[int((NR + 1) / 2)], s / NR, NR }'
}
LAST=$((HOSTS - 1))
read -r PING_P50 PING_AVG PING_N < <(ping_rtt 0 "$LAST")
# Links between h0 and the last host: across the root when they hang off different leaves.
if [[ $(leaf_of 0) == $(leaf_of "$LAST") ]]; then
    PING_LINKS=2 PING_PATH="same leaf"
else
    PING_LINKS=4 PING_PATH="across the root"
fi
SAME=0
for ((i = 1; i < HOSTS; i++)); do
    if [[ $(leaf_of "$i") == $(leaf_of 0) ]]; then
        SAME=$i
        break
    fi
done
PING_SAME_P50=0
if ((SAME)); then
    read -r PING_SAME_P50 _ _ < <(ping_rtt 0 "$SAME")
fi
# Loss may drop some pings; none arriving means the tree does not route.
((PING_N > 0)) || netns_fail "no ping from h0 reached h$LAST"

# --- the config -----------------------------------------------------------------------------------
CONFIG="$WORK/cluster.toml"
# write_config [TIMER_US]: the cluster config, with `[timing] token-timeout-us` when given.
write_config() {
    {
        echo "# Generated by deploy/netns/bench.sh: a root switch, $LEAVES leaves, $HOSTS hosts."
        echo '[transport]'
        echo 'kind = "udp"'
        [[ -z ${1:-} ]] || printf '\n[timing]\ntoken-timeout-us = %d\n' "$1"
        for ((j = 0; j <= LEAVES; j++)); do
            printf '\n[[switch]]\nname = "s%d"\nlisten = "%s:7400"\n' "$j" "$(switch_addr "$j")"
        done
        for ((j = 1; j <= LEAVES; j++)); do
            printf '\n[[trunk]]\nbetween = ["s0", "s%d"]\n' "$j"
        done
        for ((i = 0; i < HOSTS; i++)); do
            printf '\n[[host]]\nname = "h%d"\nswitch = "s%d"\nsiu = "%s:7410"\napp = "%s:7420"\n' \
                "$i" "$(leaf_of "$i")" "$(host_addr "$i")" "$(host_addr "$i")"
        done
    } >"$CONFIG"
}
# config_timer: the lost-token timer the checked config gives the daemons; fails if invalid.
config_timer() {
    "$ISOTACH" check-config "$CONFIG" --json | grep -o '"token_timeout_us":[0-9]*' | cut -d: -f2
}
config_invalid() {
    echo "error: the generated config is invalid: $CONFIG" >&2
    exit 2
}
write_config "$TOKEN_TIMEOUT_US"
TIMER_US=$(config_timer) || config_invalid
# A token and its answer cross a link and back (two shaped ends, so twice the delay each way):
# a lost-token timer shorter than that fires on every token. Unless --token-timeout-us says
# otherwise, a config timer below 8 x (delay + jitter) is raised to it (room for jitter and
# CPU; at most 10 s, the config's bound).
NEED_US=$((SHAPED ? 8 * (DELAY_US + JITTER_US) : 0))
((NEED_US <= 10000000)) || NEED_US=10000000
if [[ -z $TOKEN_TIMEOUT_US ]] && ((NEED_US > TIMER_US)); then
    write_config "$NEED_US"
    TIMER_US=$(config_timer) || config_invalid
fi

# --- the processes --------------------------------------------------------------------------------
# cpu_ticks: "BUSY TOTAL" jiffies of every CPU of the machine so far (/proc/stat).
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
# cpu_busy_pct "BUSY TOTAL" "BUSY TOTAL": how busy the machine's CPUs were in between, percent.
cpu_busy_pct() {
    local a b
    read -r -a a <<<"$1"
    read -r -a b <<<"$2"
    awk -v b="$((b[0] - a[0]))" -v t="$((b[1] - a[1]))" 'BEGIN { printf "%.0f", (t > 0 ? 100 * b / t : 0) }'
}
for ((j = 0; j <= LEAVES; j++)); do
    netns_start daemon "tm-s$j" "$PREFIX-s$j" tm --config "$CONFIG" --name "s$j"
done
SIU_PLACEMENT=daemon APP_SIU=()
if ((EMBEDDED)); then
    SIU_PLACEMENT=embedded APP_SIU=(--embedded-siu)
else
    for ((i = 0; i < HOSTS; i++)); do
        netns_start daemon "siu-h$i" "$PREFIX-h$i" siu --config "$CONFIG" --host "h$i"
    done
fi
for ((i = 0; i < HOSTS; i++)); do
    netns_start app "app-h$i" "$PREFIX-h$i" transfers --config "$CONFIG" --host "h$i" --json \
        --seconds "$WINDOW_S" --clients "$CLIENTS" --accounts "$ACCOUNTS" --idiom "$IDIOM" \
        --timeout-s "$DEADLINE_S" --latency-file "$WORK/latency-h$i.txt" "${APP_SIU[@]}"
done
CPU0=$(cpu_ticks)
netns_wait_apps "$DEADLINE_S"
CPU_BUSY_PCT=$(cpu_busy_pct "$CPU0" "$(cpu_ticks)")

# Each token manager's waves, from its admin service (the default address on its namespace's
# loopback), before the daemons stop.
TM_WAVES=()
for ((j = 0; j <= LEAVES; j++)); do
    status=$(ip netns exec "$PREFIX-s$j" "$ISOTACH" status --admin 127.0.0.1:7070 --json 2>&1) ||
        netns_fail "status of s$j: $status"
    TM_WAVES+=("$(sed -n 's/.*"waves": *\([0-9]*\).*/\1/p' <<<"$status" | head -n 1)")
done
netns_stop_daemons

# --- the figures ----------------------------------------------------------------------------------
# field NAME FILE: a number or boolean of the JSON line in FILE.
field() { sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p" "$2" | tail -n 1; }
REPORTS=()
for ((i = 0; i < HOSTS; i++)); do
    REPORTS+=("$WORK/app-h$i.log")
done
CONSERVED=$(field total_conserved "${REPORTS[0]}")
[[ $CONSERVED == true ]] || netns_fail "host 0's audit: the total was not conserved ($CONSERVED)"
read -r TRANSFERS PER_S PERIOD_US < <(
    for f in "${REPORTS[@]}"; do
        echo "$(field transfers "$f") $(field transfers_per_s "$f") $(field pulse_period_us "$f")"
    done | awk '{ n += $1; r += $2; p += $3 } END { printf "%d %.1f %.1f\n", n, r, p / NR }'
)
# The hosts' histograms merged: the value (ns) at which the count reaches each quantile.
read -r LAT_P50 LAT_P99 < <(
    cat "$WORK"/latency-h*.txt | sort -n -k1,1 |
        awk '{ v[NR] = $1; c[NR] = $2; total += $2 }
             END { need50 = total * 0.5; need99 = total * 0.99; seen = 0; p50 = 0; p99 = 0
                   for (i = 1; i <= NR; i++) { seen += c[i]
                       if (!p50 && seen >= need50) p50 = v[i]
                       if (!p99 && seen >= need99) p99 = v[i] }
                   printf "%.1f %.1f\n", p50 / 1000, p99 / 1000 }'
)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print 0 }'; }
PERIOD_RATIO=$(ratio "$PERIOD_US" "$PING_P50")
P50_RATIO=$(ratio "$LAT_P50" "$PING_P50")
P99_RATIO=$(ratio "$LAT_P99" "$PING_P50")
# Throughput against the ping: transfers completed per ping round trip.
PER_RTT=$(awk -v r="$PER_S" -v p="$PING_P50" 'BEGIN { printf "%.2f", r * p / 1e6 }')
WAVES_JSON=$(for ((j = 0; j <= LEAVES; j++)); do printf '"s%d":%s,' "$j" "${TM_WAVES[j]:-0}"; done)

if ((JSON)); then
    printf '{"hosts":%d,"leaves":%d,"tms":%d,"seconds":%s,"clients_per_host":%d,"accounts":%d,' \
        "$HOSTS" "$LEAVES" "$TMS" "$WINDOW_S" "$CLIENTS" "$ACCOUNTS"
    printf '"idiom":"%s","siu":"%s","shaped":%s,"delay_us":%d,"jitter_us":%d,"loss_pct":%s,' \
        "$IDIOM" "$SIU_PLACEMENT" "$( ((SHAPED)) && echo true || echo false)" "$((SHAPED ? DELAY_US : 0))" \
        "$((SHAPED ? JITTER_US : 0))" "$LOSS_PCT"
    printf '"token_timeout_us":%d,' "$TIMER_US"
    printf '"ping_samples":%d,"ping_links":%d,"ping_rtt_p50_us":%s,"ping_rtt_avg_us":%s,"ping_same_leaf_rtt_p50_us":%s,' \
        "$PING_N" "$PING_LINKS" "$PING_P50" "$PING_AVG" "$PING_SAME_P50"
    printf '"pulse_period_us":%s,"transfer_latency_p50_us":%s,"transfer_latency_p99_us":%s,' \
        "$PERIOD_US" "$LAT_P50" "$LAT_P99"
    printf '"transfers":%d,"transfers_per_s":%s,"pulse_period_to_ping_ratio":%s,' \
        "$TRANSFERS" "$PER_S" "$PERIOD_RATIO"
    printf '"latency_p50_to_ping_ratio":%s,"latency_p99_to_ping_ratio":%s,"transfers_per_ping_rtt":%s,' \
        "$P50_RATIO" "$P99_RATIO" "$PER_RTT"
    printf '"tm_waves":{%s},"cpu_busy_pct":%s,"cpus":%d,"load_avg_before":%s,"total_conserved":true,"elapsed_s":%s,"ok":true}\n' \
        "${WAVES_JSON%,}" "$CPU_BUSY_PCT" "$(nproc)" "$LOAD_BEFORE" "$ELAPSED"
else
    for f in "${REPORTS[@]}"; do
        grep -h '^{' "$f" || true
    done
    same="no other host on h0's leaf"
    ((SAME)) && same="h0 -> h$SAME (same leaf, 2 links): p50 ${PING_SAME_P50} µs"
    echo "netns bench: ping h0 -> h$LAST ($PING_PATH, $PING_LINKS links): p50 ${PING_P50} µs, avg ${PING_AVG} µs ($PING_N pings); $same"
    echo "netns bench: pulse period ${PERIOD_US} µs = ${PERIOD_RATIO} x ping"
    echo "netns bench: transfer latency p50 ${LAT_P50} µs = ${P50_RATIO} x ping, p99 ${LAT_P99} µs = ${P99_RATIO} x ping"
    echo "netns bench: ${TRANSFERS} transfers, ${PER_S}/s = ${PER_RTT} per ping round trip; token manager waves: ${WAVES_JSON%,}"
    echo "netns bench: the machine's $(nproc) CPUs were ${CPU_BUSY_PCT}% busy while the applications ran (load average before the run: $LOAD_BEFORE)"
    echo "$NETNS_WHAT: ok: $HOSTS hosts x $CLIENTS clients ($IDIOM, SIUs $SIU_PLACEMENT) over $TMS token managers in ${ELAPSED}s; total conserved; daemons stopped cleanly"
fi
exit 0
