#!/usr/bin/env bash
# Past one Redis: three tollgate replicas sharing one limit through one
# Redis and through a Redis Cluster of three primaries, with and without
# leases, on one hot key and on keys spread over 10,000. Per case:
# throughput (requests a second, all three replicas), tollgate CPU per
# request (the three processes' utime + stime from /proc/<pid>/stat over
# the requests), Redis script calls per request (INFO commandstats,
# fcall + evalsha, every node), the p99 latency (the worst of the three
# wrk runs) and Redis CPU per request (every node's redis-server, from
# /proc likewise).
#
# Each case runs REPS times (default 3) for DURATION (default 3s), the
# cases interleaved rep by rep; the summary gives each case's median. One
# wrk per replica, CONNS connections in all (default 48). The limit never
# refuses (a fixed window of 10^9 an hour), so every request is decided
# and admitted: what is measured is the cost of sharing it.
#
# Everything runs on this machine's cores together (three proxies, up to
# three Redis nodes, wrk): the numbers compare the modes with each other
# on the same cores, not what each would do on machines of its own.
#
# CASES picks cases (e.g. CASES="cluster/spread one-redis/spread");
# KEEP_LOGS=1 prints each case's most frequent warnings (LOG_LEVEL=debug
# for more).
#
# Needs wrk and redis-server (installed from Debian's packages when
# missing). Everything listens on 127.0.0.1 only; every run is bounded by
# DURATION.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-3s}
REPS=${REPS:-3}
CONNS=${CONNS:-48}
TOLLGATE=${TOLLGATE:-target/release/tollgate}
BASE_PORT=${BASE_PORT:-18600}

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release --quiet
[ -x "$TOLLGATE" ] || { echo "scale.sh: no tollgate binary at $TOLLGATE" >&2; exit 1; }

work=$(mktemp -d)
pids=()
SINGLE=$((BASE_PORT + 90))
NODES=($((BASE_PORT + 91)) $((BASE_PORT + 92)) $((BASE_PORT + 93)))
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for port in "$SINGLE" "${NODES[@]}"; do
        redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
    sleep 0.3
    rm -rf "$work"
}
trap cleanup EXIT

redis() { # port [cluster]
    mkdir -p "$work/r$1"
    redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
        --dir "$work/r$1" --logfile "$work/r$1/redis.log" ${2:+--cluster-enabled yes --cluster-node-timeout 2000}
    until redis-cli -p "$1" ping >/dev/null 2>&1; do sleep 0.05; done
}
redis "$SINGLE"
for port in "${NODES[@]}"; do redis "$port" cluster; done
redis-cli --cluster create "${NODES[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
for port in "${NODES[@]}"; do
    until redis-cli -p "$port" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
done

# wrk: the hot key (one header), or 10,000 keys at random.
cat > "$work/spread.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-who"] = "k" .. ((n * 7919) % 10000) })
end
LUA

config() { # file port admin store lease
    local lease=""
    [ "$5" = yes ] && lease=", lease: { slice: 100, hold: 1s }"
    cat > "$1" <<YAML
listeners: [{ name: plain, bind: '127.0.0.1:$2' }]
admin: { bind: '127.0.0.1:$3' }
log: { access_log: false, level: ${LOG_LEVEL:-info} }
$4
routes:
  - match: { path_prefix: / }
    respond: { body: "ok\n" }
    limits: [{ name: shared, algorithm: fixed_window, key: 'header:x-who', limit: 1000000000, window: 1h$lease }]
YAML
}
single_store="store: { kind: redis, url: 'redis://127.0.0.1:$SINGLE', timeout: 200ms, on_error: fail_closed }"
cluster_store="store: { kind: redis_cluster, nodes: [$(printf "'redis://127.0.0.1:%s', " "${NODES[@]}" | sed 's/, $//')], timeout: 200ms, on_error: fail_closed }"

calls() { # ports... -> script calls so far
    local n=0 port c
    for port in "$@"; do
        c=$(redis-cli -p "$port" info commandstats | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha):/ {n += $3} END {print n + 0}')
        n=$((n + c))
    done
    echo "$n"
}
ticks() { # pids... -> utime + stime
    local n=0 p
    for p in "$@"; do n=$((n + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$n"
}
to_ms() { # wrk latency ("1.23ms", "850.00us", "1.02s") -> ms
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); print v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); print v + 0 }
        else { sub(/s$/, "", v); print v * 1000 } }'
}

CASES=${CASES:-"one-redis/hot cluster/hot one-redis/hot+lease cluster/hot+lease one-redis/spread cluster/spread"}
HZ=$(getconf CLK_TCK)
per=$((CONNS / 3))
for rep in $(seq "$REPS"); do
    for case in $CASES; do
        store=${case%%/*}; keys=${case#*/}
        lease=no; [ "${keys#*+}" = lease ] && lease=yes
        if [ "$store" = one-redis ]; then s=$single_store; ports=("$SINGLE"); else s=$cluster_store; ports=("${NODES[@]}"); fi
        tg=()
        for i in 0 1 2; do
            config "$work/tg$i.yaml" $((BASE_PORT + i)) $((BASE_PORT + 10 + i)) "$s" "$lease"
            "$TOLLGATE" run --config "$work/tg$i.yaml" >"$work/tg$i.log" 2>&1 &
            tg+=($!); pids+=($!)
        done
        for i in 0 1 2; do
            until curl -s -o /dev/null "http://127.0.0.1:$((BASE_PORT + 10 + i))/readyz"; do sleep 0.05; done
        done
        args=(-H "x-who: hot")
        [ "${keys%+*}" = spread ] && args=(-s "$work/spread.lua")
        rp=(); for port in "${ports[@]}"; do rp+=($(redis-cli -p "$port" info server | awk -F: '/^process_id/ {print $2 + 0}')); done
        c0=$(calls "${ports[@]}"); t0=$(ticks "${tg[@]}"); r0=$(ticks "${rp[@]}")
        w=()
        for i in 0 1 2; do
            wrk -t1 -c"$per" -d"$DURATION" --latency "${args[@]}" "http://127.0.0.1:$((BASE_PORT + i))/" >"$work/wrk$i.out" &
            w+=($!)
        done
        wait "${w[@]}"
        c1=$(calls "${ports[@]}"); t1=$(ticks "${tg[@]}"); r1=$(ticks "${rp[@]}")
        reqs=0; rps=0; p99=0; bad=0
        for i in 0 1 2; do
            r=$(awk '/requests in/ {print $1}' "$work/wrk$i.out")
            reqs=$((reqs + r))
            rps=$(awk -v a="$rps" -v b="$(awk '/^Requests\/sec/ {print $2}' "$work/wrk$i.out")" 'BEGIN {print a + b}')
            p=$(to_ms "$(awk '$1 == "99%" {print $2}' "$work/wrk$i.out")")
            p99=$(awk -v a="$p99" -v b="$p" 'BEGIN {print (b > a) ? b : a}')
            n=$(awk '/Non-2xx/ {print $NF}' "$work/wrk$i.out"); bad=$((bad + ${n:-0}))
        done
        cpu=$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
        rt=$(awk -v c=$((c1 - c0)) -v n="$reqs" 'BEGIN {printf "%.4f", c / n}')
        rcpu=$(awk -v t=$((r1 - r0)) -v hz="$HZ" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
        printf '%s %s %.0f %s %s %s %s %s\n' "$rep" "$case" "$rps" "$cpu" "$rt" "$p99" "$bad" "$rcpu" | tee -a "$work/results"
        [ -n "${KEEP_LOGS:-}" ] && { grep -h -E "WARN|tollgate.*DEBUG" "$work"/tg*.log | sort | uniq -c | sort -rn | head -5 | cut -c1-400 || true; }
        kill "${tg[@]}" 2>/dev/null || true
        wait "${tg[@]}" 2>/dev/null || true
        redis-cli -p "$SINGLE" flushall >/dev/null
        for port in "${NODES[@]}"; do redis-cli -p "$port" flushall >/dev/null; done
    done
done

echo
echo "median of $REPS runs of $DURATION, $CONNS connections over three replicas ($(nproc) cores shared by everything):"
printf '%-22s %10s %12s %14s %8s %8s %14s\n' case "req/s" "CPU us/req" "calls/req" "p99 ms" "non-2xx" "Redis us/req"
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for case in $CASES; do
    col() { awk -v c="$case" -v k="$1" '$2 == c {print $k}' "$work/results" | median; }
    printf '%-22s %10s %12s %14s %8s %8s %14s\n' "$case" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)" "$(col 7)" "$(col 8)"
done
single=$(awk '$2 == "one-redis/hot" {print $3}' "$work/results" | median)
cluster=$(awk '$2 == "cluster/hot" {print $3}' "$work/results" | median)
echo "cluster vs one Redis, hot key, throughput: $(awk -v a="$cluster" -v b="$single" 'BEGIN {printf "%.2f", a / b}')"
