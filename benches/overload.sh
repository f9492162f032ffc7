#!/usr/bin/env bash
# The overload experiment: does a proxy hold an overloaded backend at its
# best throughput? A simulated backend of 10 workers that each take 100 ms
# (capacity C = 100 requests/s; more requests wait in the backend, as in
# a thread pool) behind, one after another:
#
#   nginx-static      nginx, `server ... max_conns=10` (the best static
#                     number: the backend's workers), keepalive
#   tollgate-none     tollgate with no protection
#   tollgate-static   tollgate, `max_conns: 10` and a queue (50, 100 ms)
#   tollgate-adaptive tollgate, `concurrency: { min: 2, max: 200 }` and a
#                     queue (5, 25 ms), priority classes
#
# Each gets the same open-loop load (examples/overload.rs; a request
# every 1/rate seconds whatever the answers do, latency measured from when
# it was due): 0.5C, 2C, 4C, then 2C while the backend's capacity halves
# for 10 s and comes back. Requests are 10% critical (never shed), 60%
# standard, 30% bulk, by an `x-priority` header from a trusted address
# (nginx ignores it). Goodput counts answers within 300 ms per second.
#
#   bash benches/overload.sh            # about 4 minutes
#   OUT=/tmp/overload bash benches/overload.sh
#   OUT=/tmp/overload ONLY=tollgate-adaptive bash benches/overload.sh
#       runs that one again, the others' results kept from an earlier run
#
# Writes $OUT/<name>.json, $OUT/overload.svg (also copied to
# docs/overload.svg) and prints a table. The proxies run on core 0 and
# the simulator and load on core 1. Needs nginx (installed from Debian's
# packages when missing). Everything listens on 127.0.0.1; every phase is
# bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$(mktemp -d /tmp/overload.XXXX)}
mkdir -p "$OUT"
SIM=127.0.0.1:18180
PROXY=127.0.0.1:18181
ADMIN=127.0.0.1:18182
export TOLLGATE_ADMIN_TOKEN=overload-experiment-token

command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
cargo build --release --bin tollgate --example overload 2>&1 | tail -1
TOLLGATE=${TOLLGATE:-target/release/tollgate}
DRIVER=target/release/examples/overload
ulimit -n 20000 2>/dev/null || true

cat >"$OUT/nginx.conf" <<CONF
worker_processes 1;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log error;
events { worker_connections 8192; }
http {
    access_log off;
    upstream sim { server $SIM max_conns=10; keepalive 64; }
    server {
        listen $PROXY;
        location / {
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream off;
        }
    }
}
CONF

tollgate_conf() { # name upstream-settings [top-level yaml]
    cat >"$OUT/$1.yaml" <<CONF
listeners: [{ bind: "$PROXY" }]
admin: { bind: "$ADMIN", token: "$TOLLGATE_ADMIN_TOKEN" }
log: { access_log: false, level: error }
server: { max_connections: 20000 }
client_ip: { trusted_proxies: ["127.0.0.1/32"] }
priorities:
  classes: [critical, standard, bulk]
  default: standard
  never_shed: [critical]
  header: x-priority
upstreams:
  sim:
    targets: [$2]
    timeout: 10s
    next_upstream: { on: [off] }
$3
routes: [{ match: { path_prefix: / }, upstream: sim }]
CONF
}
tollgate_conf tollgate-none "\"$SIM\"" ""
tollgate_conf tollgate-static "{ address: \"$SIM\", max_conns: 10 }" "    queue: { size: 50, timeout: 100ms }"
tollgate_conf tollgate-adaptive "\"$SIM\"" "    concurrency: { min: 2, max: 200, tolerance: 0.15 }
    queue: { size: 5, timeout: 25ms }"

wait_port() {
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/${1%:*}/${1#*:}) 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on $1" >&2
    return 1
}

run() { # name
    local name=$1 pid admin=()
    if [ "$name" = nginx-static ]; then
        taskset -c 0 "$NGINX" -c "$OUT/nginx.conf" -p "$OUT" -g "daemon off;" &
        pid=$!
    else
        "$TOLLGATE" check --config "$OUT/$name.yaml" >/dev/null
        taskset -c 0 "$TOLLGATE" run --config "$OUT/$name.yaml" >"$OUT/$name.log" 2>&1 &
        pid=$!
        admin=("$ADMIN")
    fi
    wait_port "$PROXY"
    echo "== $name"
    taskset -c 1 "$DRIVER" run "$name" "$SIM" "$PROXY" "$OUT/$name.json" "${admin[@]}" >/dev/null
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    sleep 1
}

ONLY=${ONLY:-}
for name in nginx-static tollgate-none tollgate-static tollgate-adaptive; do
    [ -z "$ONLY" ] || [ "$ONLY" = "$name" ] || [ -f "$OUT/$name.json" ] || continue
    [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
    run "$name"
done

"$DRIVER" plot "$OUT/overload.svg" "$OUT"/nginx-static.json "$OUT"/tollgate-none.json \
    "$OUT"/tollgate-static.json "$OUT"/tollgate-adaptive.json
cp "$OUT/overload.svg" docs/overload.svg

python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
names = ["nginx-static", "tollgate-none", "tollgate-static", "tollgate-adaptive"]
print("\n| run | phase | offered | goodput (share of C) | p50 ms | p99 ms | 503 shed critical/standard/bulk | 502 | failed |")
print("|---|---|---|---|---|---|---|---|---|")
for n in names:
    r = json.load(open(os.path.join(out, n + ".json")))
    for p in r["phases"]:
        shed = "/".join(str(p["shed_503"][c]) for c in ["critical", "standard", "bulk"])
        print(f"| {n} | {p['phase']} | {p['offered_rps']:.0f}/s | {p['goodput_rps']:.1f}/s ({p['goodput_share_of_c']:.2f}) "
              f"| {p['p50_ms']:.0f} | {p['p99_ms']:.0f} | {shed} | {sum(p['refused_502'].values())} "
              f"| {sum(p['failed_or_abandoned'].values())} |")
r = json.load(open(os.path.join(out, "tollgate-adaptive.json")))
print("\nadaptive limit, settled after each step:")
for s in r["settle"]:
    print(f"  after {s['after']:<14} at {s['at_s']:5.1f} s: settled at {s['settled_at']:.0f} within {s['settle_s']:.1f} s")
crit = sum(p["not_ok"]["critical"] for p in r["phases"])
print(f"critical requests not answered 200 by tollgate-adaptive: {crit}")
PY
echo "results in $OUT"
