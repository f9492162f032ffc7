#!/usr/bin/env bash
# Whole-proxy load test: tollgate against nginx on the same machine, in the
# same run, in front of the same upstream (an nginx `return 200`).
#
#   bash benches/load.sh            # 10 s per run, 64 connections
#   DURATION=30s CONNS=128 bash benches/load.sh
#   BASELINE=/tmp/tollgate-before bash benches/load.sh
#       also runs that binary (an earlier build) on the same limits config,
#       interleaved with this build, and prints this build / baseline
#   DASHBOARD=1 bash benches/load.sh
#       also runs the limits config with and without a dashboard open (a
#       poller fetching /api/overview every 2 s, as the page does),
#       interleaved, and prints the CPU per request and throughput ratios
#
# Each tollgate run also reports the CPU time the proxy process spent per
# request (user + system, from /proc/<pid>/stat).
#
# Needs nginx and wrk (installed from Debian's packages when missing).
# Everything listens on 127.0.0.1 only and every run is bounded by DURATION.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-1}
UP_PORT=${UP_PORT:-18081}
NGINX_PORT=${NGINX_PORT:-18082}
TG_PORT=${TG_PORT:-18083}
ADMIN_PORT=${ADMIN_PORT:-18084}
NGINX_LIM_PORT=${NGINX_LIM_PORT:-18085}
TG_LIM_PORT=${TG_LIM_PORT:-18086}
ADMIN_LIM_PORT=${ADMIN_LIM_PORT:-18087}
REDIS_PORT=${REDIS_PORT:-18088}
TG_REDIS_PORT=${TG_REDIS_PORT:-18089}
ADMIN_REDIS_PORT=${ADMIN_REDIS_PORT:-18090}
BASE_PORT=${BASE_PORT:-18091}
ADMIN_BASE_PORT=${ADMIN_BASE_PORT:-18092}
BASELINE=${BASELINE:-}
DASHBOARD=${DASHBOARD:-}

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release --quiet
work=$(mktemp -d)
cleanup() {
    [ -f "$work/up.pid" ] && kill "$(cat "$work/up.pid")" 2>/dev/null || true
    [ -f "$work/proxy.pid" ] && kill "$(cat "$work/proxy.pid")" 2>/dev/null || true
    [ -n "${TG_PID:-}" ] && kill "$TG_PID" 2>/dev/null || true
    [ -n "${TG_LIM_PID:-}" ] && kill "$TG_LIM_PID" 2>/dev/null || true
    [ -n "${TG_REDIS_PID:-}" ] && kill "$TG_REDIS_PID" 2>/dev/null || true
    [ -n "${TG_BASE_PID:-}" ] && kill "$TG_BASE_PID" 2>/dev/null || true
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    sleep 0.3
    rm -rf "$work"
}
trap cleanup EXIT

cores=$(nproc)
cat > "$work/up.conf" <<CONF
worker_processes 1;
pid $work/up.pid;
error_log $work/up.err;
events { worker_connections 4096; }
http {
    access_log off;
    server { listen 127.0.0.1:$UP_PORT; keepalive_requests 100000;
             location / { return 200 "ok\n"; } }
}
CONF
cat > "$work/proxy.conf" <<CONF
worker_processes $cores;
pid $work/proxy.pid;
error_log $work/proxy.err;
events { worker_connections 4096; }
http {
    access_log off;
    upstream api { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server { listen 127.0.0.1:$NGINX_PORT; keepalive_requests 100000;
             location / { proxy_pass http://api; proxy_http_version 1.1;
                          proxy_set_header Connection "";
                          proxy_set_header X-Forwarded-For \$remote_addr; } }
    # The same with a per-IP limit_req tier whose rate no run reaches, so
    # both proxies do the limiting work on every request and reject none.
    limit_req_zone \$binary_remote_addr zone=per_ip:10m rate=100000000r/s;
    server { listen 127.0.0.1:$NGINX_LIM_PORT; keepalive_requests 100000;
             location / { limit_req zone=per_ip burst=1000 nodelay;
                          proxy_pass http://api; proxy_http_version 1.1;
                          proxy_set_header Connection "";
                          proxy_set_header X-Forwarded-For \$remote_addr; } }
}
CONF
cat > "$work/tollgate.yaml" <<CONF
listeners: [{ bind: "127.0.0.1:$TG_PORT" }]
admin: { bind: "127.0.0.1:$ADMIN_PORT" }
log: { level: warn, access_log: false }
upstreams: { api: { targets: ["127.0.0.1:$UP_PORT"] } }
routes: [{ match: { path_prefix: / }, upstream: api }]
CONF

cat > "$work/tollgate-limits.yaml" <<CONF
listeners: [{ bind: "127.0.0.1:$TG_LIM_PORT" }]
admin: { bind: "127.0.0.1:$ADMIN_LIM_PORT" }
log: { level: warn, access_log: false }
zones: [{ name: per_ip, rate: 100000000r/s, burst: 1000, nodelay: true }]
upstreams: { api: { targets: ["127.0.0.1:$UP_PORT"] } }
routes:
  - match: { path_prefix: / }
    upstream: api
    limits:
      - { name: short, algorithm: token_bucket, rate: 1000000/s, burst: 1000000, key: ip }
      - { name: long, algorithm: sliding_window, limit: 1000000000, window: 1h, key: ip }
CONF
# The same limits shared through Redis: one EVALSHA per request decides
# the zone and both route limits.
sed -e "s/$TG_LIM_PORT/$TG_REDIS_PORT/; s/$ADMIN_LIM_PORT/$ADMIN_REDIS_PORT/" \
    "$work/tollgate-limits.yaml" > "$work/tollgate-redis.yaml"
echo "store: { kind: redis, url: 'redis://127.0.0.1:$REDIS_PORT', timeout: 50ms, on_error: fail_closed }" >> "$work/tollgate-redis.yaml"

"$NGINX" -c "$work/up.conf"
"$NGINX" -c "$work/proxy.conf"
target/release/tollgate run --config "$work/tollgate.yaml" >"$work/tollgate.log" 2>&1 &
TG_PID=$!
target/release/tollgate run --config "$work/tollgate-limits.yaml" >"$work/tollgate-limits.log" 2>&1 &
TG_LIM_PID=$!
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$work" --logfile "$work/redis.log" --pidfile "$work/redis.pid"
sleep 0.3
target/release/tollgate run --config "$work/tollgate-redis.yaml" >"$work/tollgate-redis.log" 2>&1 &
TG_REDIS_PID=$!
if [ -n "$BASELINE" ]; then
    sed -e "s/$TG_LIM_PORT/$BASE_PORT/; s/$ADMIN_LIM_PORT/$ADMIN_BASE_PORT/" \
        "$work/tollgate-limits.yaml" > "$work/tollgate-base.yaml"
    "$BASELINE" run --config "$work/tollgate-base.yaml" >"$work/tollgate-base.log" 2>&1 &
    TG_BASE_PID=$!
fi
sleep 1
[ -z "$BASELINE" ] || curl -fsS "http://127.0.0.1:$BASE_PORT/" >/dev/null || { cat "$work/tollgate-base.log" >&2; exit 1; }
curl -fsS "http://127.0.0.1:$NGINX_PORT/" >/dev/null
curl -fsS "http://127.0.0.1:$TG_PORT/" >/dev/null
curl -fsS "http://127.0.0.1:$NGINX_LIM_PORT/" >/dev/null
curl -fsS "http://127.0.0.1:$TG_LIM_PORT/" >/dev/null || { cat "$work/tollgate-limits.log" >&2; exit 1; }
curl -fsS "http://127.0.0.1:$TG_REDIS_PORT/" >/dev/null || { cat "$work/tollgate-redis.log" >&2; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name port [pid: report its CPU time per request]
    wrk -t"$THREADS" -c"$CONNS" -d2s "http://127.0.0.1:$2/" >/dev/null # warm-up
    local out rps p99 before=0 cpu=""
    [ -n "${3:-}" ] && before=$(cpu_ticks "$3")
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$2/")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out")
    if [ -n "${3:-}" ]; then
        local ticks requests
        ticks=$(( $(cpu_ticks "$3") - before ))
        requests=$(awk '/requests in/ {print $1}' <<<"$out")
        cpu=$(awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v n="$requests" \
            'BEGIN { printf "cpu %5.1f us/req", t * 1e6 / hz / n }')
        awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v n="$requests" \
            'BEGIN { printf "%.3f\n", t * 1e6 / hz / n }' > "$work/cpu.last"
    fi
    local errors
    errors=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out")
    printf '%-16s %12s req/s   p99 %8s   %s %s\n' "$1" "$rps" "$p99" "$cpu" "$errors" >&2
    echo "$rps"
}

echo "wrk -t$THREADS -c$CONNS -d$DURATION on $cores cores (upstream: nginx return 200)" >&2
nginx_rps=$(run nginx "$NGINX_PORT")
tg_rps=$(run tollgate "$TG_PORT" "$TG_PID")
nginx_lim_rps=$(run nginx+lim "$NGINX_LIM_PORT")
tg_lim_rps=$(run tollgate+lim "$TG_LIM_PORT" "$TG_LIM_PID")
redis_calls() { redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[=,:]' '/^cmdstat_evalsha:/ {print $3}'; }
tg_redis_rps=$(run tollgate+redis "$TG_REDIS_PORT" "$TG_REDIS_PID")
# Commands per request: a short run with Redis's counters reset first.
redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
requests=$(wrk -t"$THREADS" -c"$CONNS" -d3s "http://127.0.0.1:$TG_REDIS_PORT/" | awk '/requests in/ {print $1}')
calls=$(redis_calls)
awk -v t="$tg_rps" -v n="$nginx_rps" 'BEGIN { printf "proxy only:        tollgate / nginx throughput ratio: %.2f\n", t / n }'
awk -v t="$tg_lim_rps" -v n="$nginx_lim_rps" 'BEGIN { printf "with rate limits:  tollgate / nginx throughput ratio: %.2f (nginx: one limit_req zone; tollgate: a zone + two route limits)\n", t / n }'
awk -v r="$tg_redis_rps" -v m="$tg_lim_rps" 'BEGIN { printf "shared through Redis: redis / memory store throughput ratio: %.2f (same limits; Redis on the same cores)\n", r / m }'
awk -v c="$calls" -v q="$requests" 'BEGIN { printf "Redis round trips per request: %.3f (%d EVALSHA for %d requests)\n", c / q, c, q }'
if [ -n "$BASELINE" ]; then
    # Interleaved: baseline, this build, baseline, this build.
    b1=$(run baseline+lim "$BASE_PORT" "$TG_BASE_PID")
    t1=$(run tollgate+lim "$TG_LIM_PORT" "$TG_LIM_PID")
    b2=$(run baseline+lim "$BASE_PORT" "$TG_BASE_PID")
    t2=$(run tollgate+lim "$TG_LIM_PORT" "$TG_LIM_PID")
    awk -v a="$t1" -v b="$t2" -v c="$b1" -v d="$b2" 'BEGIN { printf "this build / baseline throughput ratio (same limits config): %.2f\n", (a + b) / (c + d) }'
fi
if [ -n "$DASHBOARD" ]; then
    # The dashboard polls /api/overview every 2 s; 10 s of a poller beside
    # each run, interleaved: closed, open, closed, open.
    poll() { while :; do curl -s -o /dev/null "http://127.0.0.1:$ADMIN_LIM_PORT/api/overview"; sleep 2; done; }
    c1=$(run tollgate+lim "$TG_LIM_PORT" "$TG_LIM_PID"); cc1=$(cat "$work/cpu.last")
    poll & POLL=$!
    o1=$(run tollgate+lim+dash "$TG_LIM_PORT" "$TG_LIM_PID"); oc1=$(cat "$work/cpu.last")
    kill "$POLL"
    c2=$(run tollgate+lim "$TG_LIM_PORT" "$TG_LIM_PID"); cc2=$(cat "$work/cpu.last")
    poll & POLL=$!
    o2=$(run tollgate+lim+dash "$TG_LIM_PORT" "$TG_LIM_PID"); oc2=$(cat "$work/cpu.last")
    kill "$POLL"
    awk -v a="$o1" -v b="$o2" -v c="$c1" -v d="$c2" -v ca="$oc1" -v cb="$oc2" -v cc="$cc1" -v cd="$cc2" \
        'BEGIN { printf "dashboard open / closed: throughput ratio %.3f, CPU per request ratio %.3f\n", (a + b) / (c + d), (ca + cb) / (cc + cd) }'
fi
