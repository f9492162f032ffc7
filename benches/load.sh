#!/usr/bin/env bash
# Whole-proxy cost: tollgate against nginx `limit_req` on the same core, in
# one interleaved run, in front of the same upstream (an nginx `return 200`).
#
#   bash benches/load.sh                  # 5 repetitions, 3 s per run
#   REPS=9 DURATION=5s bash benches/load.sh
#   BASELINE=/tmp/tollgate-before bash benches/load.sh
#       also runs that binary (an earlier build) on the same configs,
#       interleaved, and prints this build / baseline
#   scripts/pgo-build && TOLLGATE=target/pgo/tollgate \
#       BASELINE=target/release/tollgate bash benches/load.sh
#       measures the profile-guided build (the one to deploy), with the
#       plain `cargo build --release` one as the baseline
#   MAX_STEAL=5 RETRIES=2 bash benches/load.sh
#       measures a run again, up to RETRIES times, while the hypervisor
#       steals more than MAX_STEAL % of the two cores (the defaults)
#   SIDE_BY_SIDE=1 bash benches/load.sh
#       also runs nginx and tollgate at once (and, with BASELINE, this
#       build and the baseline at once), both on core 0, each under its
#       own wrk: a slow spell of the host falls on both alike, so the
#       ratio moves far less from one repetition to the next. But each
#       proxy shares the core, and its caches, with the other, and the
#       scheduler need not share the core evenly: a different measure
#       from the runs alone, best for comparing two builds of tollgate
#   DASHBOARD=1 bash benches/load.sh
#       also runs tollgate with a dashboard open (a poller fetching
#       /api/overview every 2 s, as the page does), interleaved
#   HEADS=1 bash benches/load.sh
#       also runs the allow path of both proxies with a request head as a
#       browser or an API client sends it (ten more fields: user agent,
#       accept, cookie, bearer token...; wrk's own head has one), the two
#       interleaved
#   TLS=1 bash benches/load.sh
#       also runs the allow path of both proxies over TLS (1.3, a P-256
#       certificate made for the run; each proxy terminates TLS and speaks
#       plain HTTP to the upstream), the two interleaved; each run's
#       connections are new, so its 64 or 256 handshakes are counted in
#       it, as both proxies' are
#   H2=1 bash benches/load.sh
#       also runs the allow path of both proxies over HTTP/2 (h2c with
#       prior knowledge, h2load on core 1 in wrk's place: one connection
#       per client, one stream at a time, like wrk's keep-alive runs; each
#       proxy speaks HTTP/1.1 to the upstream), the two interleaved;
#       latency percentiles are taken from h2load's log of every request;
#       and the same with HTTP/2 to the upstream too (`-h2up`: the upstream
#       an nginx `http2` listener, nginx reaching it through `grpc_pass`,
#       its only HTTP/2 client, tollgate with `protocol: h2`), each proxy
#       keeping its upstream connections
#   QUOTAS=1 bash benches/load.sh
#       also runs the two tiers with a monthly quota in a time zone and
#       penalty boxes on the zone and the short limit (no ban: what the
#       quota and the box's check add), next to the two tiers; and a zone
#       whose penalty box has banned wrk's address (every request refused
#       by the ban), next to the zone's own refusal
#   BALANCE=1 bash benches/load.sh
#       also runs the allow path with two targets (the same upstream on
#       two ports) balanced by round robin, by least_conn and by
#       `hash $request_uri consistent`, interleaved: the cost per request
#       of each balancing method against the round robin over the same two
#   TRACES=1 bash benches/load.sh
#       also runs the allow path with OpenTelemetry traces on, every
#       request kept (ratio 1.0: a server span, its attempt span, exported
#       to the upstream nginx standing in for a collector, which answers
#       200) and at ratio 0.01, next to the allow path without traces
#   PROTECT=1 bash benches/load.sh
#       also runs the allow path with backend protection on (an adaptive
#       concurrency limit held at 1000, which no run reaches, and a
#       queue): the cost per request of the gate, the controller's
#       sampling and its task, next to the allow path
#   PLANS=1 bash benches/load.sh
#       also runs the two tiers with a plan (the plan read from a header
#       of a trusted peer, every limit with numbers of its own for it) and
#       with a settled cost (a limit reserving 10 and settling what the
#       upstream's x-tokens-used header says, 7), each next to the two
#       tiers: the cost of a plan lookup and of a settlement
#
# The proxy under test runs alone on core 0 (`taskset`); the upstream,
# Redis and wrk share core 1. Each proxy is measured on
#   allow:  a limit that never rejects (nginx: one limit_req zone;
#           tollgate: one zone), and
#   reject: a limit that rejects every request (429),
# at 64 and 256 keep-alive connections; tollgate also with two tiers (a
# zone and two route limits) and with the zone on Redis. At the end: the
# peak RSS of each proxy, the memory an open connection costs each proxy
# while it waits for its next request, and a key churn (a million distinct
# keys through a 10MB zone keyed by a header) to show memory stays bounded. Every run prints
# requests/s, p50/p99 latency and the proxy's CPU time per request (user +
# system, from /proc/<pid>/stat of every process of the proxy, and each of
# the two apart: user space is the proxy's own code, kernel the TCP path it
# shares with nginx); the summary gives medians over the repetitions, and
# the tollgate / nginx ratios: each taken within a repetition, between runs
# seconds apart, then their median and range over the repetitions. Each
# run also prints the hypervisor's steal over both cores (time the host gave
# other guests; on a shared host, a run it slowed measures the neighbours),
# and the summary its mean and maximum; and the load core's CPU per request
# (core 1's busy time: wrk and the upstream). At 64 connections core 1, not
# the proxy, bounds throughput, so what each proxy makes the load core
# spend per request sets its throughput and latency there.
#
# Needs nginx, wrk and redis-server (installed from Debian's packages when
# missing) and two cores. Everything listens on 127.0.0.1 only and every
# run is bounded by DURATION.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-3s}
REPS=${REPS:-5}
BASELINE=${BASELINE:-}
# The build measured: by default the plain release build made below.
TOLLGATE=${TOLLGATE:-target/release/tollgate}
DASHBOARD=${DASHBOARD:-}
SIDE_BY_SIDE=${SIDE_BY_SIDE:-}
HEADS=${HEADS:-}
TLS=${TLS:-}
H2=${H2:-}
PLANS=${PLANS:-}
BALANCE=${BALANCE:-}
PROTECT=${PROTECT:-}
TRACES=${TRACES:-}
QUOTAS=${QUOTAS:-}
# The fields HEADS=1 adds to every request of the runs named *-heads (500
# bytes of head).
HEAD_FIELDS=(
    -H "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36"
    -H "Accept: application/json, text/plain, */*"
    -H "Accept-Language: en-US,en;q=0.9"
    -H "Accept-Encoding: gzip, deflate, br"
    -H "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyLTQyIn0.c2lnbmF0dXJl"
    -H "X-Request-Id: 3f1c2a9e-8b7d-4e21-9c55-0a1b2c3d4e5f"
    -H "Cookie: session=abc123def456; theme=dark"
    -H "Referer: https://app.example.com/dashboard"
    -H "Origin: https://app.example.com"
    -H "Cache-Control: no-cache"
)
# A run during which the hypervisor gave other guests more than MAX_STEAL %
# of the two cores is measured again, up to RETRIES times; the last try
# counts either way, and the summary says how many stayed above.
MAX_STEAL=${MAX_STEAL:-5}
RETRIES=${RETRIES:-2}
BASE_PORT=${BASE_PORT:-18100}

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
command -v taskset >/dev/null || need+=(util-linux)
[ -n "$TLS" ] && { command -v openssl >/dev/null || need+=(openssl); }
[ -n "$H2" ] && { command -v h2load >/dev/null || need+=(nghttp2-client); }
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [ "$(nproc)" -lt 2 ]; then
    echo "load.sh: needs two cores (the proxy on one, the load on the other)" >&2
    exit 1
fi

cargo build --release --quiet
for b in "$TOLLGATE" ${BASELINE:+"$BASELINE"}; do
    [ -x "$b" ] || { echo "load.sh: no tollgate binary at $b (scripts/pgo-build makes target/pgo/tollgate)" >&2; exit 1; }
done
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for f in "$work"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    redis-cli -p "$((BASE_PORT + 99))" shutdown nosave >/dev/null 2>&1 || true
    sleep 0.3
    rm -rf "$work"
}
trap cleanup EXIT

UP=$BASE_PORT
REDIS=$((BASE_PORT + 99))
on_core1() { taskset -c 1 "$@"; }
on_core0() { taskset -c 0 "$@"; }

cat > "$work/up.conf" <<CONF
worker_processes 1;
pid $work/up.pid;
error_log $work/up.err;
events { worker_connections 4096; }
http {
    access_log off;
    server { listen 127.0.0.1:$UP; keepalive_requests 1000000;
             location / { return 200 "ok\n"; } }
    server { listen 127.0.0.1:$((UP + 8)) http2; keepalive_requests 1000000;
             location / { return 200 "ok\n"; } }
    server { listen 127.0.0.1:$((UP + 9)); keepalive_requests 1000000;
             location / { add_header x-tokens-used 7; return 200 "ok\n"; } }
    server { listen 127.0.0.1:$((UP + 10)); keepalive_requests 1000000;
             location / { return 200 "ok\n"; } }
}
CONF
# nginx, one worker: allow (a rate no run reaches) and reject (1 r/m, no
# burst: every request past the first of a minute gets 429).
nginx_conf() { # name body: writes $work/<name>.conf (pid $work/<name>.pid)
    # with the upstream, the allow zone and the given http-level lines
    cat > "$work/$1.conf" <<CONF
worker_processes 1;
pid $work/$1.pid;
error_log $work/$1.err;
events { worker_connections 4096; }
http {
    access_log off;
    upstream api { server 127.0.0.1:$UP; keepalive 256; }
    limit_req_zone \$binary_remote_addr zone=allow:10m rate=100000000r/s;
    limit_req_status 429;
$2
}
CONF
}
# The allow path, over plain HTTP and (TLS=1) over TLS.
# nginx sends the upstream the request tollgate sends: the client's Host,
# and the four forwarding fields tollgate always sets (DESIGN.md), so that
# the upstream, which shares core 1 with wrk, parses the same head from
# both proxies.
allow_location='location / { limit_req zone=allow burst=1000 nodelay;
                          proxy_pass http://api; proxy_http_version 1.1;
                          proxy_set_header Connection "";
                          proxy_set_header Host $http_host;
                          proxy_set_header X-Forwarded-For $remote_addr;
                          proxy_set_header X-Real-IP $remote_addr;
                          proxy_set_header X-Forwarded-Proto $scheme;
                          proxy_set_header X-Forwarded-Host $http_host; }'
nginx_conf nginx "    limit_req_zone \$binary_remote_addr zone=reject:10m rate=1r/m;
    server { listen 127.0.0.1:$((BASE_PORT + 1)); keepalive_requests 1000000;
             $allow_location }
    server { listen 127.0.0.1:$((BASE_PORT + 2)); keepalive_requests 1000000;
             location / { limit_req zone=reject nodelay;
                          proxy_pass http://api; } }"
# TLS=1: the certificate both proxies serve, and nginx's allow server over
# TLS, a worker of its own (so that the peak RSS above stays that of the
# plain runs on both sides).
if [ -n "$TLS" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
        -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
    nginx_conf nginx-tls "    server { listen 127.0.0.1:$((BASE_PORT + 3)) ssl; keepalive_requests 1000000;
             ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;
             $allow_location }"
fi
# H2=1: nginx's allow server over HTTP/2 (h2c: `http2` on a plain listener
# takes the prior-knowledge preface), a worker of its own like TLS's.
[ -n "$H2" ] && nginx_conf nginx-h2 "    server { listen 127.0.0.1:$((BASE_PORT + 4)) http2; keepalive_requests 1000000;
             $allow_location }"
# ... and with HTTP/2 to the upstream as well: nginx's HTTP/2 client is
# its gRPC proxy, which passes any HTTP/2 exchange.
[ -n "$H2" ] && nginx_conf nginx-h2up "    upstream api_h2 { server 127.0.0.1:$((UP + 8)); keepalive 256; }
    server { listen 127.0.0.1:$((BASE_PORT + 7)) http2; keepalive_requests 1000000;
             location / { limit_req zone=allow burst=1000 nodelay;
                          grpc_pass grpc://api_h2;
                          grpc_set_header X-Forwarded-For \$remote_addr;
                          grpc_set_header X-Real-IP \$remote_addr;
                          grpc_set_header X-Forwarded-Proto \$scheme;
                          grpc_set_header X-Forwarded-Host \$http_host; } }"
# tollgate on one core (its runtime's workers share it).
tollgate_config() { # file port admin-port zone-rate limits(yes/no) store
    {
        echo "listeners: [{ bind: \"127.0.0.1:$2\" }]"
        echo "admin: { bind: \"127.0.0.1:$3\" }"
        echo "log: { level: warn, access_log: false }"
        echo "zones: [{ name: per_ip, rate: $4, burst: 1000, nodelay: true, status: 429 }]"
        # The upstream pool as configured by default (max_idle_per_target).
        echo "upstreams: { api: { targets: [\"127.0.0.1:$UP\"] } }"
        echo "routes:"
        echo "  - match: { path_prefix: / }"
        echo "    upstream: api"
        if [ "$5" = yes ]; then
            echo "    limits:"
            echo "      - { name: short, algorithm: token_bucket, rate: 1000000/s, burst: 1000000, key: ip }"
            echo "      - { name: long, algorithm: sliding_window, limit: 1000000000, window: 1h, key: ip }"
        fi
        [ -n "$6" ] && echo "store: { kind: redis, url: 'redis://127.0.0.1:$REDIS', timeout: 50ms, on_error: fail_closed }"
        true
    } > "$1"
}
tollgate_config "$work/allow.yaml"  $((BASE_PORT + 11)) $((BASE_PORT + 51)) 100000000r/s no ""
tollgate_config "$work/reject.yaml" $((BASE_PORT + 12)) $((BASE_PORT + 52)) 1r/m no ""
tollgate_config "$work/tiers.yaml"  $((BASE_PORT + 13)) $((BASE_PORT + 53)) 100000000r/s yes ""
tollgate_config "$work/redis.yaml"  $((BASE_PORT + 14)) $((BASE_PORT + 54)) 100000000r/s no redis
# Key churn: a zone keyed by a header every request sets to a new value,
# in a 10MB zone (nginx's default size), to show memory stays bounded.
tollgate_config "$work/churn.yaml"  $((BASE_PORT + 15)) $((BASE_PORT + 55)) 100000000r/s no ""
sed -i 's/status: 429 }/status: 429, key: "header:x-client", size: 10MB }/' "$work/churn.yaml"
if [ -n "$TLS" ]; then
    tollgate_config "$work/tls.yaml" $((BASE_PORT + 16)) $((BASE_PORT + 56)) 100000000r/s no ""
    sed -i "s|\" }]|\", tls: { certs: [{ cert: $work/cert.pem, key: $work/key.pem }] } }]|" "$work/tls.yaml"
fi
# H2=1: the allow config on a process of its own (every plain listener
# takes h2c), so that the peak RSS above stays that of HTTP/1.1 runs.
[ -n "$H2" ] && tollgate_config "$work/h2.yaml" $((BASE_PORT + 17)) $((BASE_PORT + 57)) 100000000r/s no ""
if [ -n "$H2" ]; then
    tollgate_config "$work/h2up.yaml" $((BASE_PORT + 19)) $((BASE_PORT + 59)) 100000000r/s no ""
    sed -i "s|127.0.0.1:$UP\"\]|127.0.0.1:$((UP + 8))\"], protocol: h2|" "$work/h2up.yaml"
fi
if [ -n "$PLANS" ]; then
    # The two tiers, every limit with a plan of its own, the plan named by
    # a header from a trusted peer (wrk sends x-plan: pro).
    tollgate_config "$work/plans.yaml" $((BASE_PORT + 23)) $((BASE_PORT + 63)) 100000000r/s yes ""
    sed -i 's/burst: 1000000, key: ip }/burst: 1000000, key: ip, plans: { pro: { rate: 900000\/s, burst: 900000 } } }/;
            s/window: 1h, key: ip }/window: 1h, key: ip, plans: { pro: { limit: 900000000 } } }/' "$work/plans.yaml"
    {
        echo "client_ip: { trusted_proxies: [127.0.0.1/32] }"
        echo "identity: { plans: { names: [free, pro], header: x-plan, default: free } }"
    } >> "$work/plans.yaml"
    # The two tiers, the short limit reserving 10 and settling the 7 the
    # upstream reports.
    tollgate_config "$work/settle.yaml" $((BASE_PORT + 24)) $((BASE_PORT + 64)) 100000000r/s yes ""
    sed -i "s/burst: 1000000, key: ip }/burst: 1000000, key: ip, cost: 10, settle: { header: x-tokens-used } }/; s/127.0.0.1:$UP\"\]/127.0.0.1:$((UP + 9))\"]/" "$work/settle.yaml"
fi
if [ -n "$BALANCE" ]; then
    # The allow config with two targets (the upstream on two ports), by
    # each balancing method.
    for m in rr:26:round_robin least:27:least_conn hash:28:'hash $request_uri consistent'; do
        IFS=: read -r name off method <<<"$m"
        tollgate_config "$work/bal-$name.yaml" $((BASE_PORT + off + 4)) $((BASE_PORT + off + 44)) 100000000r/s no ""
        sed -i "s|\[\"127.0.0.1:$UP\"\] }|[\"127.0.0.1:$UP\", \"127.0.0.1:$((UP + 10))\"], balance: \"$method\" }|" "$work/bal-$name.yaml"
    done
fi
if [ -n "$PROTECT" ]; then
    # The allow config, its upstream behind a gate whose limit no run
    # reaches (every request takes and gives back a place, the
    # controller samples every answer) and a queue.
    tollgate_config "$work/protect.yaml" $((BASE_PORT + 35)) $((BASE_PORT + 75)) 100000000r/s no ""
    sed -i "s|\[\"127.0.0.1:$UP\"\] }|[\"127.0.0.1:$UP\"], concurrency: { min: 1000, max: 1000 }, queue: { size: 100, timeout: 1s } }|" "$work/protect.yaml"
    grep -q "concurrency" "$work/protect.yaml" || { echo "load.sh: the protect config has no gate" >&2; exit 1; }
fi
if [ -n "$TRACES" ]; then
    # The allow config with traces on, exported to the upstream nginx (its
    # `return 200` takes the POSTs as a collector would).
    for t in all:36:1.0 hundredth:37:0.01; do
        IFS=: read -r name off ratio <<<"$t"
        tollgate_config "$work/traces-$name.yaml" $((BASE_PORT + off)) $((BASE_PORT + off + 40)) 100000000r/s no ""
        echo "traces: { endpoint: \"http://127.0.0.1:$UP/v1/traces\", ratio: $ratio }" >> "$work/traces-$name.yaml"
    done
fi
if [ -n "$QUOTAS" ]; then
    # The two tiers, a monthly quota beside them, a penalty box on the zone
    # and on the short limit (never filled: the check alone).
    tollgate_config "$work/quota.yaml" $((BASE_PORT + 25)) $((BASE_PORT + 65)) 100000000r/s yes ""
    sed -i 's/status: 429 }\]/status: 429, penalty: { after: 5 } }]/;
            s/burst: 1000000, key: ip }/burst: 1000000, key: ip, penalty: { after: 5 } }/' "$work/quota.yaml"
    sed -i '/window: 1h, key: ip }/a\      - { name: monthly, algorithm: quota, limit: 1000000000000, period: month, time_zone: Europe/Berlin, key: ip }' "$work/quota.yaml"
    # The reject config with a box that bans at the first refusal, for an
    # hour: after two requests every one is refused by the ban.
    tollgate_config "$work/boxed.yaml" $((BASE_PORT + 26)) $((BASE_PORT + 66)) 1r/m no ""
    sed -i 's/status: 429 }\]/status: 429, penalty: { after: 1, ban: [1h] } }]/' "$work/boxed.yaml"
fi
cat > "$work/churn.lua" <<'LUA'
counter = 0
request = function()
    counter = counter + 1
    return wrk.format(nil, nil, { ["x-client"] = "client-" .. counter })
end
LUA
sed "s/$((BASE_PORT + 11))/$((BASE_PORT + 21))/; s/$((BASE_PORT + 51))/$((BASE_PORT + 61))/" "$work/allow.yaml" > "$work/base-allow.yaml"
sed "s/$((BASE_PORT + 12))/$((BASE_PORT + 22))/; s/$((BASE_PORT + 52))/$((BASE_PORT + 62))/" "$work/reject.yaml" > "$work/base-reject.yaml"

on_core1 "$NGINX" -c "$work/up.conf"
on_core0 "$NGINX" -c "$work/nginx.conf"
[ -n "$TLS" ] && on_core0 "$NGINX" -c "$work/nginx-tls.conf"
[ -n "$H2" ] && on_core0 "$NGINX" -c "$work/nginx-h2.conf"
[ -n "$H2" ] && on_core0 "$NGINX" -c "$work/nginx-h2up.conf"
on_core1 redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$work" --logfile "$work/redis.log" --pidfile "$work/redis.pid"
start_tollgate() { # binary config -> pid (taskset execs the binary)
    taskset -c 0 "$1" run --config "$2" >"$2.log" 2>&1 &
    echo $!
}
TG_ALLOW=$(start_tollgate "$TOLLGATE" "$work/allow.yaml"); pids+=("$TG_ALLOW")
TG_REJECT=$(start_tollgate "$TOLLGATE" "$work/reject.yaml"); pids+=("$TG_REJECT")
TG_TIERS=$(start_tollgate "$TOLLGATE" "$work/tiers.yaml"); pids+=("$TG_TIERS")
sleep 0.3
TG_REDIS=$(start_tollgate "$TOLLGATE" "$work/redis.yaml"); pids+=("$TG_REDIS")
TG_CHURN=$(start_tollgate "$TOLLGATE" "$work/churn.yaml"); pids+=("$TG_CHURN")
if [ -n "$TLS" ]; then
    TG_TLS=$(start_tollgate "$TOLLGATE" "$work/tls.yaml"); pids+=("$TG_TLS")
fi
if [ -n "$H2" ]; then
    TG_H2=$(start_tollgate "$TOLLGATE" "$work/h2.yaml"); pids+=("$TG_H2")
    TG_H2UP=$(start_tollgate "$TOLLGATE" "$work/h2up.yaml"); pids+=("$TG_H2UP")
fi
if [ -n "$PLANS" ]; then
    TG_PLANS=$(start_tollgate "$TOLLGATE" "$work/plans.yaml"); pids+=("$TG_PLANS")
    TG_SETTLE=$(start_tollgate "$TOLLGATE" "$work/settle.yaml"); pids+=("$TG_SETTLE")
fi
if [ -n "$BALANCE" ]; then
    TG_BAL_RR=$(start_tollgate "$TOLLGATE" "$work/bal-rr.yaml"); pids+=("$TG_BAL_RR")
    TG_BAL_LEAST=$(start_tollgate "$TOLLGATE" "$work/bal-least.yaml"); pids+=("$TG_BAL_LEAST")
    TG_BAL_HASH=$(start_tollgate "$TOLLGATE" "$work/bal-hash.yaml"); pids+=("$TG_BAL_HASH")
fi
if [ -n "$PROTECT" ]; then
    TG_PROTECT=$(start_tollgate "$TOLLGATE" "$work/protect.yaml"); pids+=("$TG_PROTECT")
fi
if [ -n "$TRACES" ]; then
    TG_TRACES_ALL=$(start_tollgate "$TOLLGATE" "$work/traces-all.yaml"); pids+=("$TG_TRACES_ALL")
    TG_TRACES_HUNDREDTH=$(start_tollgate "$TOLLGATE" "$work/traces-hundredth.yaml"); pids+=("$TG_TRACES_HUNDREDTH")
fi
if [ -n "$QUOTAS" ]; then
    TG_QUOTA=$(start_tollgate "$TOLLGATE" "$work/quota.yaml"); pids+=("$TG_QUOTA")
    TG_BOXED=$(start_tollgate "$TOLLGATE" "$work/boxed.yaml"); pids+=("$TG_BOXED")
fi
if [ -n "$BASELINE" ]; then
    B_ALLOW=$(start_tollgate "$BASELINE" "$work/base-allow.yaml"); pids+=("$B_ALLOW")
    B_REJECT=$(start_tollgate "$BASELINE" "$work/base-reject.yaml"); pids+=("$B_REJECT")
fi
sleep 1
for port in $((BASE_PORT + 1)) $((BASE_PORT + 11)) $((BASE_PORT + 13)) $((BASE_PORT + 14)); do
    curl -fsS "http://127.0.0.1:$port/" >/dev/null || { echo "load.sh: nothing answers on $port" >&2; cat "$work"/*.log >&2; exit 1; }
done
if [ -n "$TLS" ]; then
    for port in $((BASE_PORT + 3)) $((BASE_PORT + 16)); do
        curl -fsS --cacert "$work/cert.pem" "https://localhost:$port/" >/dev/null ||
            { echo "load.sh: nothing answers over TLS on $port" >&2; cat "$work"/*.log "$work/nginx-tls.err" >&2; exit 1; }
    done
fi
if [ -n "$QUOTAS" ]; then
    for port in $((BASE_PORT + 25)) $((BASE_PORT + 26)); do
        curl -fsS "http://127.0.0.1:$port/" >/dev/null ||
            { echo "load.sh: nothing answers on $port" >&2; cat "$work"/*.log >&2; exit 1; }
    done
    curl -fsS -D - -o /dev/null "http://127.0.0.1:$((BASE_PORT + 25))/" | grep -qi '^ratelimit-policy: .*"monthly";q=1000000000000' ||
        { echo "load.sh: the quota run does not carry its quota" >&2; exit 1; }
fi
if [ -n "$BALANCE" ]; then
    for port in $((BASE_PORT + 30)) $((BASE_PORT + 31)) $((BASE_PORT + 32)); do
        curl -fsS "http://127.0.0.1:$port/" >/dev/null ||
            { echo "load.sh: nothing answers on $port" >&2; cat "$work"/*.log >&2; exit 1; }
    done
fi
if [ -n "$PLANS" ]; then
    for port in $((BASE_PORT + 23)) $((BASE_PORT + 24)); do
        curl -fsS -H "x-plan: pro" "http://127.0.0.1:$port/" >/dev/null ||
            { echo "load.sh: nothing answers on $port" >&2; cat "$work"/*.log >&2; exit 1; }
    done
    # The plan is taken (the headers advertise pro's numbers), the cost
    # settled (the token bucket's remaining moves by 7, not 10).
    curl -fsS -D - -o /dev/null -H "x-plan: pro" "http://127.0.0.1:$((BASE_PORT + 23))/" | grep -qi '^ratelimit-policy: "short";q=900000' ||
        { echo "load.sh: the plan run does not decide on its plan" >&2; exit 1; }
fi
if [ -n "$H2" ]; then
    for port in $((BASE_PORT + 4)) $((BASE_PORT + 17)) $((BASE_PORT + 7)) $((BASE_PORT + 19)); do
        curl -fsS --http2-prior-knowledge "http://127.0.0.1:$port/" >/dev/null ||
            { echo "load.sh: nothing answers over HTTP/2 on $port" >&2; cat "$work"/*.log "$work/nginx-h2.err" >&2; exit 1; }
    done
fi
NGINX_PIDS="$(cat "$work/nginx.pid") $(pgrep -P "$(cat "$work/nginx.pid")" | tr '\n' ' ')"
[ -n "$TLS" ] && NGINX_TLS_PIDS="$(cat "$work/nginx-tls.pid") $(pgrep -P "$(cat "$work/nginx-tls.pid")" | tr '\n' ' ')"
[ -n "$H2" ] && NGINX_H2_PIDS="$(cat "$work/nginx-h2.pid") $(pgrep -P "$(cat "$work/nginx-h2.pid")" | tr '\n' ' ')"
[ -n "$H2" ] && NGINX_H2UP_PIDS="$(cat "$work/nginx-h2up.pid") $(pgrep -P "$(cat "$work/nginx-h2up.pid")" | tr '\n' ' ')"

ticks() { # pids... -> "user system" ticks of them all
    local u=0 s=0 p a b
    for p in "$@"; do
        read -r a b < <(awk '{print $14, $15}' "/proc/$p/stat")
        u=$((u + a)); s=$((s + b))
    done
    echo "$u $s"
}
hz=$(getconf CLK_TCK)
steal() { # -> "seconds-now steal-ticks-of-cores-0-and-1"
    awk -v now="$(date +%s.%N)" '$1 == "cpu0" || $1 == "cpu1" { t += $9 } END { print now, t }' /proc/stat
}
load_core() { # -> busy ticks of core 1 (wrk, the upstream, Redis; what
    # the kernel does there on their behalf included)
    awk '$1 == "cpu1" { print $2 + $3 + $4 + $7 + $8 }' /proc/stat
}
per_req() { # ticks requests -> us per request
    awk -v t="$1" -v hz="$hz" -v n="$2" 'BEGIN { printf "%.2f", t * 1e6 / hz / n }'
}
results="$work/results"
: > "$results"
run() { # name conns port pids...: measures, and measures again (up to
    # RETRIES times) while the hypervisor steals more than MAX_STEAL %
    local try
    for try in $(seq 0 "$RETRIES"); do
        measure "$@"
        awk -v s="$stolen" -v m="$MAX_STEAL" 'BEGIN { exit !(s > m) }' || break
        if [ "$try" -lt "$RETRIES" ]; then
            echo "  (steal $stolen% > $MAX_STEAL%: measured again)" >&2
            retried=$((retried + 1))
        fi
    done
    echo "$1 c$2 $rep $line" >> "$results"
}
retried=0
measure() { # name conns port pids... -> sets $line and $stolen
    local name=$1 conns=$2 port=$3
    shift 3
    local -a fields=()
    [[ $name == *-heads ]] && fields=("${HEAD_FIELDS[@]}")
    [[ $name == *-plans ]] && fields=(-H "x-plan: pro")
    local scheme=http
    [[ $name == *-tls ]] && scheme=https
    local -a load=(on_core1 wrk -t1 -c"$conns")
    [[ $name == *-h2 || $name == *-h2up ]] && load=(h2_load "$conns")
    "${load[@]}" -d1s "${fields[@]}" "$scheme://127.0.0.1:$port/" >/dev/null # warm-up
    local u0 s0 u1 s1 out t0 t1 st0 st1 l0 l1
    read -r u0 s0 < <(ticks "$@")
    read -r t0 st0 < <(steal)
    l0=$(load_core)
    out=$("${load[@]}" -d"$DURATION" --latency "${fields[@]}" "$scheme://127.0.0.1:$port/")
    l1=$(load_core)
    read -r t1 st1 < <(steal)
    read -r u1 s1 < <(ticks "$@")
    stolen=$(stolen_share "$t0" "$st0" "$t1" "$st1")
    report "$name" "$conns" "$out" $((u1 - u0)) $((s1 - s0)) "$stolen" $((l1 - l0))
}
h2_load() { # conns -dDURATION [--latency] url: h2load over h2c, one stream
    # per connection at a time, its summary put the way wrk prints it (the
    # lines report reads; the percentiles from its log of every request)
    local conns=$1 duration=${2#-d} url=${*: -1} out
    out=$(on_core1 h2load -c"$conns" -m1 -D "$duration" --log-file="$work/h2load.log" "$url")
    awk '/^requests:/ { print $8, "requests in" } /^finished in/ { print "Requests/sec:", $4 + 0 }' <<<"$out"
    awk '$2 >= 200 && $2 < 300 { print $3 }' "$work/h2load.log" | sort -n |
        awk '{ v[NR] = $1 } END { if (NR) { printf "50%% %dus\n99%% %dus\n", v[int(NR * 0.5) + 1], v[int(NR * 0.99) + 1] } }'
}
stolen_share() { # t0 steal0 t1 steal1 -> the share of the two cores the
    # hypervisor gave to other guests meanwhile (/proc/stat's steal), in %:
    # a run it slowed is no measure
    awk -v t0="$1" -v a="$2" -v t1="$3" -v b="$4" -v hz="$hz" \
        'BEGIN { printf "%.1f", (b - a) / hz / (t1 - t0) / 2 * 100 }'
}
report() { # name conns wrk-output user-ticks system-ticks steal load-ticks [note]:
    # prints the run, sets $line (the fields the summary reads); load-ticks
    # are core 1's busy ticks meanwhile, empty when unknown
    local rps p50 p99 n cpu user sys load=nan
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$3")
    p50=$(awk '$1=="50%" {print $2}' <<<"$3")
    p99=$(awk '$1=="99%" {print $2}' <<<"$3")
    n=$(awk '/requests in/ {print $1}' <<<"$3")
    cpu=$(per_req $(($4 + $5)) "$n")
    user=$(per_req "$4" "$n")
    sys=$(per_req "$5" "$n")
    [ -n "$7" ] && load=$(per_req "$7" "$n")
    printf '%-22s c%-4s %10s req/s  p50 %8s  p99 %8s  cpu %6s us/req (user %s, kernel %s)  load core %s  steal %s%%%s\n' \
        "$1" "$2" "$rps" "$p50" "$p99" "$cpu" "$user" "$sys" "$load" "$6" "${8:-}" >&2
    line="$rps $(to_ms "$p50") $(to_ms "$p99") $cpu $user $sys $6 $load"
}
to_ms() { # wrk latency (123.45us, 1.23ms, 1.20s) -> ms
    awk -v v="$1" 'BEGIN { u = v; sub(/[0-9.]+/, "", u); x = v + 0;
        if (u == "us") x /= 1000; else if (u == "s") x *= 1000; printf "%.3f", x }'
}
together() { # conns "name port pids..." ...: those proxies under load at
    # once, each by its own wrk (all on core 1), for DURATION
    local conns=$1 spec i
    shift
    local -a names=() ports=() pids=() before=() wrks=()
    for spec in "$@"; do
        # shellcheck disable=SC2086 # name, port and pids, split
        set -- $spec
        names+=("$1") ports+=("$2") pids+=("${*:3}")
    done
    for i in "${!names[@]}"; do
        on_core1 wrk -t1 -c"$conns" -d1s "http://127.0.0.1:${ports[i]}/" >/dev/null # warm-up
    done
    for i in "${!names[@]}"; do
        # shellcheck disable=SC2086 # the proxy's pids, split
        before[i]=$(ticks ${pids[i]})
    done
    local t0 st0 t1 st1 stolen u0 s0 u1 s1
    read -r t0 st0 < <(steal)
    for i in "${!names[@]}"; do
        on_core1 wrk -t1 -c"$conns" -d"$DURATION" --latency "http://127.0.0.1:${ports[i]}/" >"$work/together.$i" &
        wrks+=($!)
    done
    wait "${wrks[@]}"
    read -r t1 st1 < <(steal)
    stolen=$(stolen_share "$t0" "$st0" "$t1" "$st1")
    for i in "${!names[@]}"; do
        read -r u0 s0 <<<"${before[i]}"
        # shellcheck disable=SC2086
        read -r u1 s1 < <(ticks ${pids[i]})
        # core 1 served both: no load core per proxy
        report "together-${names[i]}" "$conns" "$(cat "$work/together.$i")" $((u1 - u0)) $((s1 - s0)) "$stolen" "" ", side by side"
        echo "together-${names[i]} c$conns $rep $line" >>"$results"
    done
}
poll_dashboard() { while :; do curl -s -o /dev/null "http://127.0.0.1:$((BASE_PORT + 51))/api/overview"; sleep 2; done; }

echo "tollgate: $TOLLGATE${BASELINE:+, baseline: $BASELINE}; proxy on core 0, load on core 1; wrk -t1 -d$DURATION, $REPS repetitions" >&2
# Each ratio's two runs come one after the other (two tiers and tollgate
# next to nginx's allow run, Redis next to the memory store's, the two with
# a browser-like head next to each other), and every other repetition
# runs them in the reverse order, so that neither side of a ratio always
# goes first.
plan=(
    "tollgate-two-tiers $((BASE_PORT + 13)) $TG_TIERS"
    "nginx-allow $((BASE_PORT + 1)) $NGINX_PIDS"
    "tollgate-allow $((BASE_PORT + 11)) $TG_ALLOW"
    "tollgate-redis $((BASE_PORT + 14)) $TG_REDIS"
    "nginx-reject $((BASE_PORT + 2)) $NGINX_PIDS"
    "tollgate-reject $((BASE_PORT + 12)) $TG_REJECT"
)
[ -n "$HEADS" ] && plan+=(
    "nginx-allow-heads $((BASE_PORT + 1)) $NGINX_PIDS"
    "tollgate-allow-heads $((BASE_PORT + 11)) $TG_ALLOW"
)
[ -n "$TLS" ] && plan+=(
    "nginx-allow-tls $((BASE_PORT + 3)) $NGINX_TLS_PIDS"
    "tollgate-allow-tls $((BASE_PORT + 16)) $TG_TLS"
)
# QUOTAS=1: the quota run just before the two tiers, the boxed one after.
[ -n "$QUOTAS" ] && plan=(
    "tollgate-quota $((BASE_PORT + 25)) $TG_QUOTA"
    "${plan[@]}"
    "tollgate-boxed $((BASE_PORT + 26)) $TG_BOXED"
)
# PLANS=1: the plan and the settlement runs just before the two tiers.
[ -n "$PLANS" ] && plan=(
    "tollgate-settle $((BASE_PORT + 24)) $TG_SETTLE"
    "tollgate-plans $((BASE_PORT + 23)) $TG_PLANS"
    "${plan[@]}"
)
[ -n "$PROTECT" ] && plan+=(
    "tollgate-protect $((BASE_PORT + 35)) $TG_PROTECT"
)
[ -n "$TRACES" ] && plan+=(
    "tollgate-traces-all $((BASE_PORT + 36)) $TG_TRACES_ALL"
    "tollgate-traces-0.01 $((BASE_PORT + 37)) $TG_TRACES_HUNDREDTH"
)
[ -n "$BALANCE" ] && plan+=(
    "tollgate-rr2 $((BASE_PORT + 30)) $TG_BAL_RR"
    "tollgate-least-conn $((BASE_PORT + 31)) $TG_BAL_LEAST"
    "tollgate-hash $((BASE_PORT + 32)) $TG_BAL_HASH"
)
[ -n "$H2" ] && plan+=(
    "nginx-allow-h2 $((BASE_PORT + 4)) $NGINX_H2_PIDS"
    "tollgate-allow-h2 $((BASE_PORT + 17)) $TG_H2"
    "nginx-allow-h2up $((BASE_PORT + 7)) $NGINX_H2UP_PIDS"
    "tollgate-allow-h2up $((BASE_PORT + 19)) $TG_H2UP"
)
for rep in $(seq "$REPS"); do
    order=$(seq 0 $((${#plan[@]} - 1)))
    [ $((rep % 2)) -eq 0 ] && order=$(seq $((${#plan[@]} - 1)) -1 0)
    for c in 64 256; do
        for i in $order; do
            # shellcheck disable=SC2086 # name, port and pids, split
            set -- ${plan[$i]}
            run "$1" "$c" "${@:2}"
        done
        if [ -n "$BASELINE" ]; then
            run baseline-allow "$c" $((BASE_PORT + 21)) "$B_ALLOW"
            run baseline-reject "$c" $((BASE_PORT + 22)) "$B_REJECT"
        fi
        if [ -n "$DASHBOARD" ]; then
            poll_dashboard & POLL=$!
            run tollgate-allow-dash "$c" $((BASE_PORT + 11)) "$TG_ALLOW"
            kill "$POLL"
        fi
    done
done

if [ -n "$SIDE_BY_SIDE" ]; then
    for rep in $(seq "$REPS"); do
        for c in 64 256; do
            together "$c" "nginx-allow $((BASE_PORT + 1)) $NGINX_PIDS" "tollgate-allow $((BASE_PORT + 11)) $TG_ALLOW"
            if [ -n "$BASELINE" ]; then
                together "$c" "baseline-allow $((BASE_PORT + 21)) $B_ALLOW" "build-allow $((BASE_PORT + 11)) $TG_ALLOW"
            fi
        done
    done
fi

# Medians over the repetitions, then the ratios. A ratio is taken within
# each repetition, between runs a few seconds apart (so a slow spell of the
# host weighs on both sides of it), and the median of those is printed,
# with the lowest and highest.
median() { # name conns field(4 rps, 5 p50, 6 p99, 7 cpu, 8 user, 9 kernel, 10 steal %,
    # 11 core 1's CPU per request)
    awk -v n="$1" -v c="c$2" -v f="$3" '$1 == n && $2 == c { print $f }' "$results" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratios() { # a b conns field -> "median (lowest-highest)" of a / b per repetition
    awk -v a="$1" -v b="$2" -v c="c$3" -v f="$4" '
        $2 == c && $1 == a { x[$3] = $f }
        $2 == c && $1 == b { y[$3] = $f }
        END { for (r in x) if ((r in y) && y[r] > 0) print x[r] / y[r] }' "$results" | sort -g |
        awk '{ v[NR] = $1 } END {
            if (NR == 0) { print "-"; exit }
            m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'
}
echo
printf '%-20s %5s %10s %9s %9s %12s %6s %7s\n' "median of $REPS" conns "req/s" "p50 ms" "p99 ms" "cpu us/req" user kernel
names="nginx-allow tollgate-allow nginx-reject tollgate-reject tollgate-two-tiers tollgate-redis"
[ -n "$BASELINE" ] && names="$names baseline-allow baseline-reject"
[ -n "$HEADS" ] && names="$names nginx-allow-heads tollgate-allow-heads"
[ -n "$TLS" ] && names="$names nginx-allow-tls tollgate-allow-tls"
[ -n "$H2" ] && names="$names nginx-allow-h2 tollgate-allow-h2 nginx-allow-h2up tollgate-allow-h2up"
[ -n "$PLANS" ] && names="$names tollgate-plans tollgate-settle"
[ -n "$BALANCE" ] && names="$names tollgate-rr2 tollgate-least-conn tollgate-hash"
[ -n "$PROTECT" ] && names="$names tollgate-protect"
[ -n "$TRACES" ] && names="$names tollgate-traces-all tollgate-traces-0.01"
[ -n "$QUOTAS" ] && names="$names tollgate-quota tollgate-boxed"
[ -n "$DASHBOARD" ] && names="$names tollgate-allow-dash"
[ -n "$SIDE_BY_SIDE" ] && names="$names together-nginx-allow together-tollgate-allow"
[ -n "$SIDE_BY_SIDE" ] && [ -n "$BASELINE" ] && names="$names together-build-allow together-baseline-allow"
for n in $names; do
    for c in 64 256; do
        printf '%-20s %5s %10s %9s %9s %12s %6s %7s\n' "$n" "$c" "$(median "$n" "$c" 4)" "$(median "$n" "$c" 5)" "$(median "$n" "$c" 6)" \
            "$(median "$n" "$c" 7)" "$(median "$n" "$c" 8)" "$(median "$n" "$c" 9)"
    done
done
echo
printf '%-48s %-17s %-17s %s\n' "ratio (tollgate / reference): median (range)" c64 c256 "target: medians"
# The target, when a row has one, is the cost goal's (see docs/benchmarks.md's
# "Benchmarks"): "<=" or ">=" a bound, judged on each median.
verdict() { # "op bound" c64 c256 -> "<= 1.0: met" / "<= 1.0: missed at c64"
    [ -n "$1" ] || return 0
    awk -v t="$1" -v a="${2%% *}" -v b="${3%% *}" 'BEGIN {
        split(t, o, " "); miss = ""
        if (a == "-" || b == "-") { printf "%s: not measured", t; exit }
        if (o[1] == "<=" ? a + 0 > o[2] + 0 : a + 0 < o[2] + 0) miss = "c64"
        if (o[1] == "<=" ? b + 0 > o[2] + 0 : b + 0 < o[2] + 0) miss = miss (miss ? " and " : "") "c256"
        printf "%s: %s", t, miss ? "missed at " miss : "met" }'
}
compare() { # label a b field [target]
    local lo hi line
    lo=$(ratios "$2" "$3" 64 "$4")
    hi=$(ratios "$2" "$3" 256 "$4")
    line=$(printf '%-48s %-17s %-17s %s' "$1" "$lo" "$hi" "$(verdict "${5:-}" "$lo" "$hi")")
    echo "${line%"${line##*[! ]}"}"
}
compare "allow: CPU per request vs nginx limit_req" tollgate-allow nginx-allow 7 "<= 1.0"
compare "allow: user CPU per request vs nginx" tollgate-allow nginx-allow 8
compare "allow: kernel CPU per request vs nginx" tollgate-allow nginx-allow 9
compare "allow: p99 vs nginx" tollgate-allow nginx-allow 6 "<= 1.0"
compare "allow: throughput vs nginx" tollgate-allow nginx-allow 4
compare "allow: load core's CPU per request vs nginx's" tollgate-allow nginx-allow 11
compare "reject: CPU per request vs nginx" tollgate-reject nginx-reject 7 "<= 1.0"
compare "two tiers: CPU per request vs nginx (one zone)" tollgate-two-tiers nginx-allow 7 "<= 1.1"
compare "redis: throughput vs the memory store" tollgate-redis tollgate-allow 4 ">= 0.8"
compare "redis: CPU per request vs the memory store" tollgate-redis tollgate-allow 7
if [ -n "$BASELINE" ]; then
    compare "allow: CPU per request vs baseline" tollgate-allow baseline-allow 7
    compare "reject: CPU per request vs baseline" tollgate-reject baseline-reject 7
    compare "allow: throughput vs baseline" tollgate-allow baseline-allow 4
fi
if [ -n "$HEADS" ]; then
    compare "browser-like head: CPU per request vs nginx" tollgate-allow-heads nginx-allow-heads 7
    compare "browser-like head: user CPU per request vs nginx" tollgate-allow-heads nginx-allow-heads 8
    compare "browser-like head: p99 vs nginx" tollgate-allow-heads nginx-allow-heads 6
fi
if [ -n "$TLS" ]; then
    compare "TLS: CPU per request vs nginx" tollgate-allow-tls nginx-allow-tls 7
    compare "TLS: user CPU per request vs nginx" tollgate-allow-tls nginx-allow-tls 8
    compare "TLS: p99 vs nginx" tollgate-allow-tls nginx-allow-tls 6
fi
if [ -n "$H2" ]; then
    compare "HTTP/2: CPU per request vs nginx" tollgate-allow-h2 nginx-allow-h2 7
    compare "HTTP/2: user CPU per request vs nginx" tollgate-allow-h2 nginx-allow-h2 8
    compare "HTTP/2: p99 vs nginx" tollgate-allow-h2 nginx-allow-h2 6
    compare "HTTP/2: throughput vs nginx" tollgate-allow-h2 nginx-allow-h2 4
    compare "HTTP/2 both legs: CPU per request vs nginx" tollgate-allow-h2up nginx-allow-h2up 7
    compare "HTTP/2 both legs: user CPU per request vs nginx" tollgate-allow-h2up nginx-allow-h2up 8
    compare "HTTP/2 both legs: p99 vs nginx" tollgate-allow-h2up nginx-allow-h2up 6
    compare "HTTP/2 both legs: throughput vs nginx" tollgate-allow-h2up nginx-allow-h2up 4
fi
if [ -n "$QUOTAS" ]; then
    compare "quota + box checks: CPU per request vs two tiers" tollgate-quota tollgate-two-tiers 7
    compare "quota + box checks: throughput vs two tiers" tollgate-quota tollgate-two-tiers 4
    compare "refused by a ban: CPU per request vs zone's 429" tollgate-boxed tollgate-reject 7
fi
if [ -n "$TRACES" ]; then
    compare "traces, every request: CPU per request vs allow" tollgate-traces-all tollgate-allow 7
    compare "traces, every request: throughput vs allow" tollgate-traces-all tollgate-allow 4
    compare "traces at 0.01: CPU per request vs allow" tollgate-traces-0.01 tollgate-allow 7
    compare "traces at 0.01: throughput vs allow" tollgate-traces-0.01 tollgate-allow 4
fi
if [ -n "$PROTECT" ]; then
    compare "protection on: CPU per request vs allow" tollgate-protect tollgate-allow 7
    compare "protection on: throughput vs allow" tollgate-protect tollgate-allow 4
fi
if [ -n "$BALANCE" ]; then
    compare "two targets, round robin: CPU per request vs one" tollgate-rr2 tollgate-allow 7
    compare "least_conn: CPU per request vs round robin" tollgate-least-conn tollgate-rr2 7
    compare "least_conn: throughput vs round robin" tollgate-least-conn tollgate-rr2 4
    compare "hash consistent: CPU per request vs round robin" tollgate-hash tollgate-rr2 7
    compare "hash consistent: throughput vs round robin" tollgate-hash tollgate-rr2 4
fi
if [ -n "$PLANS" ]; then
    compare "plan lookup: CPU per request vs two tiers" tollgate-plans tollgate-two-tiers 7
    compare "plan lookup: throughput vs two tiers" tollgate-plans tollgate-two-tiers 4
    compare "settlement: CPU per request vs two tiers" tollgate-settle tollgate-two-tiers 7
    compare "settlement: throughput vs two tiers" tollgate-settle tollgate-two-tiers 4
fi
if [ -n "$SIDE_BY_SIDE" ]; then
    compare "side by side: CPU per request vs nginx" together-tollgate-allow together-nginx-allow 7
    compare "side by side: user CPU per request vs nginx" together-tollgate-allow together-nginx-allow 8
    [ -n "$BASELINE" ] && compare "side by side: CPU per request vs baseline" together-build-allow together-baseline-allow 7
fi
if [ -n "$DASHBOARD" ]; then
    compare "dashboard open: CPU per request vs closed" tollgate-allow-dash tollgate-allow 7
    compare "dashboard open: throughput vs closed" tollgate-allow-dash tollgate-allow 4
fi

# Peak resident memory (VmHWM, summed over the proxy's processes) after
# all the runs above, c256 included.
status_kib() { # field pids... -> that field of /proc/<pid>/status (kB),
    # summed over the proxy's processes
    local kb=0 p
    for p in "${@:2}"; do kb=$((kb + $(awk -v f="$1:" '$1 == f {print $2}' "/proc/$p/status"))); done
    echo "$kb"
}
hwm() { # pids... -> MiB
    awk -v k="$(status_kib VmHWM "$@")" 'BEGIN { printf "%.1f", k / 1024 }'
}
# What is resident now, split into private memory (heap, stacks) and file
# pages (the binary's and the libraries' code, shared with the page cache):
# the first is what each connection and key costs.
split() { # pids... -> "anon X + file Y"
    awk -v a="$(status_kib RssAnon "$@")" -v f="$(status_kib RssFile "$@")" \
        'BEGIN { printf "anon %.1f + file %.1f", a / 1024, f / 1024 }'
}
awk -v r="$retried" -v lim="$MAX_STEAL" '$1 !~ /^together-/ { n++; s += $10; if ($10 > m) m = $10; if ($10 > lim) h++ }
    END { printf "hypervisor steal (both cores, per run counted): mean %.1f%%, max %.1f%%; %d of %d runs above %s%% (%d tries measured again)\n", s / n, m, h, n, lim, r }' "$results"
echo
rss_ng=$(hwm $NGINX_PIDS)
rss_tg=$(hwm "$TG_ALLOW")
echo "peak RSS (MiB): nginx limit_req $rss_ng, tollgate allow $rss_tg, reject $(hwm "$TG_REJECT"), two tiers $(hwm "$TG_TIERS"), redis $(hwm "$TG_REDIS")"
awk -v n="$rss_ng" -v t="$rss_tg" 'BEGIN { printf "target: tollgate allow at most nginx + 5 MiB: %s\n", t + 0 <= n + 5 ? "met" : "missed" }'
[ -n "$TLS" ] && echo "peak RSS over TLS (MiB): nginx $(hwm $NGINX_TLS_PIDS), tollgate $(hwm "$TG_TLS")"
[ -n "$H2" ] && echo "peak RSS over HTTP/2 (MiB): nginx $(hwm $NGINX_H2_PIDS), tollgate $(hwm "$TG_H2"); both legs: nginx $(hwm $NGINX_H2UP_PIDS), tollgate $(hwm "$TG_H2UP")"
echo "resident now (MiB): nginx limit_req $(split $NGINX_PIDS); tollgate allow $(split "$TG_ALLOW"), reject $(split "$TG_REJECT")"
# What an open connection costs while it waits for its next request (a
# browser's or an API client's keep-alive connection): IDLE_CONNS of them
# (1000, fewer under a low open-files limit) to a fresh process of each
# proxy, one request on each, all left open; the growth of the process's
# resident memory, per connection. With H2=1 as many again over HTTP/2
# (h2c), the first ones still open. nginx allocates its connection
# structures for worker_connections when it starts, so they are not in
# its figure.
idle_n=$((($(ulimit -n) - 100) / 2))
[ "${IDLE_CONNS:-1000}" -lt "$idle_n" ] && idle_n=${IDLE_CONNS:-1000}
nginx_conf nginx-idle "    server { listen 127.0.0.1:$((BASE_PORT + 5)); keepalive_requests 1000000;
             $allow_location }
    server { listen 127.0.0.1:$((BASE_PORT + 6)) http2; keepalive_requests 1000000;
             $allow_location }"
tollgate_config "$work/idle.yaml" $((BASE_PORT + 18)) $((BASE_PORT + 58)) 100000000r/s no ""
on_core0 "$NGINX" -c "$work/nginx-idle.conf"
TG_IDLE=$(start_tollgate "$TOLLGATE" "$work/idle.yaml"); pids+=("$TG_IDLE")
sleep 1
NGINX_IDLE_PIDS="$(cat "$work/nginx-idle.pid") $(pgrep -P "$(cat "$work/nginx-idle.pid")" | tr '\n' ' ')"
# h2c: the preface, empty SETTINGS, and one HEADERS frame (GET / for
# 127.0.0.1: HPACK's static table, and the authority as a literal).
h2_get='PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x0e\x01\x05\x00\x00\x00\x01\x82\x86\x84\x41\x09127.0.0.1'
idle_fds=()
idle_cost() { # port h1|h2 pids... -> sets $per_conn (KiB): opens $idle_n
    # connections, one request on each, and leaves them open (in this
    # shell, not a subshell, so that they stay open)
    local before fd i line
    before=$(status_kib VmRSS "${@:3}")
    for ((i = 0; i < idle_n; i++)); do
        exec {fd}<>"/dev/tcp/127.0.0.1/$1"
        if [ "$2" = h2 ]; then
            # shellcheck disable=SC2059 # the frames are the format
            printf "$h2_get" >&"$fd"
        else
            printf 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd"
        fi
        idle_fds+=("$fd")
    done
    sleep 1
    if [ "$2" = h1 ]; then
        read -r -t 2 -u "$fd" line || true
        [[ $line == "HTTP/1.1 200"* ]] || echo "load.sh: an idle connection on $1 was not answered: ${line:-nothing}" >&2
    fi
    per_conn=$(awk -v a="$before" -v b="$(status_kib VmRSS "${@:3}")" -v n="$idle_n" 'BEGIN { printf "%.1f", (b - a) / n }')
}
close_idle() {
    local fd
    for fd in "${idle_fds[@]}"; do exec {fd}>&-; done
    idle_fds=()
}
# shellcheck disable=SC2086 # nginx's pids, split
idle_cost $((BASE_PORT + 5)) h1 $NGINX_IDLE_PIDS
idle="HTTP/1.1 nginx $per_conn"
# shellcheck disable=SC2086
[ -n "$H2" ] && idle_cost $((BASE_PORT + 6)) h2 $NGINX_IDLE_PIDS && idle_h2="HTTP/2 nginx $per_conn"
close_idle
idle_cost $((BASE_PORT + 18)) h1 "$TG_IDLE"
idle="$idle, tollgate $per_conn"
[ -n "$H2" ] && idle_cost $((BASE_PORT + 18)) h2 "$TG_IDLE" && idle_h2="$idle_h2, tollgate $per_conn"
close_idle
echo "memory per open connection waiting for its next request (KiB, $idle_n after one request each): $idle${H2:+; $idle_h2}"
# 1M distinct keys through a 10MB zone: memory stays bounded by the zone.
churned=0
before=$(hwm "$TG_CHURN")
while [ "$churned" -lt 1000000 ]; do
    n=$(on_core1 wrk -t1 -c64 -d10s -s "$work/churn.lua" "http://127.0.0.1:$((BASE_PORT + 15))/" | awk '/requests in/ {print $1}')
    churned=$((churned + n))
    [ "$n" -gt 0 ] || break
done
keys=$(curl -s "http://127.0.0.1:$((BASE_PORT + 55))/metrics" | awk '/^tollgate_zone_keys\{/ {print $2}')
evicted=$(curl -s "http://127.0.0.1:$((BASE_PORT + 55))/metrics" | awk '/^tollgate_zone_evictions_total\{/ {print $2}')
echo "key churn: $churned requests with distinct keys, 10MB zone: peak RSS $before -> $(hwm "$TG_CHURN") MiB, keys tracked ${keys:-?}, evicted ${evicted:-?}"
redis-cli -p "$REDIS" config resetstat >/dev/null
requests=$(on_core1 wrk -t1 -c64 -d2s "http://127.0.0.1:$((BASE_PORT + 14))/" | awk '/requests in/ {print $1}')
# Decisions go by FCALL on Redis 7 and later, by EVALSHA before.
calls=$(redis-cli -p "$REDIS" info commandstats | awk -F'[=,:]' '/^cmdstat_(fcall|evalsha):/ {n += $3} END {print n + 0}')
awk -v c="$calls" -v q="$requests" 'BEGIN { printf "Redis round trips per request: %.3f (%d FCALL or EVALSHA for %d requests)\n", c / q, c, q }'
