#!/usr/bin/env bash
# Sluice's main job on a fresh machine: build it, start a throwaway PostgreSQL 15,
# put Sluice in front of it (transaction pooling, 10 server connections), drive
# pgbench traffic from 50 clients through it, and print the result next to the same
# run against PostgreSQL directly. Everything lives in a temp dir removed at exit.
#   bash scripts/demo.sh [seconds]        (default 10 s per run)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
command -v pgbench >/dev/null && [[ -x $PGBIN/initdb ]] || {
    echo "installing PostgreSQL 15 and its client tools..."
    apt-get update -qq && apt-get install -y -qq postgresql-15 postgresql-client-15 >/dev/null
}

echo "== building sluice (release)"
cargo build --release --locked -q 2>/dev/null || cargo build --release -q

WORK=$(mktemp -d /tmp/sluice-demo.XXXXXX)
chmod 755 "$WORK"
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[[ $(id -u) == 0 ]] && chown postgres "$WORK"
SLUICE_PID=
cleanup() {
    [[ -n $SLUICE_PID ]] && kill "$SLUICE_PID" 2>/dev/null
    as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PGPORT_=$(free_port); SPORT=$(free_port)

echo "== starting a throwaway PostgreSQL on port $PGPORT_"
as_pg "$PGBIN/initdb" -D "$WORK/data" -U postgres -A trust >/dev/null
cat >> "$WORK/data/postgresql.conf" <<CONF
port = $PGPORT_
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
fsync = off
synchronous_commit = off
max_connections = 100
password_encryption = 'scram-sha-256'
CONF
printf 'local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n' > "$WORK/data/pg_hba.conf"
as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/pg.log" -w start >/dev/null
psql -X -q -h "$WORK" -p "$PGPORT_" -U postgres -c "CREATE ROLE demo LOGIN PASSWORD 'demo'" -c "CREATE DATABASE demo OWNER demo"

cat > "$WORK/sluice.toml" <<CONF
[general]
listen_port = $SPORT
unix_socket_dir = "$WORK"
pool_mode = "transaction"
max_client_conn = 200
log_connections = false
log_disconnections = false
[databases.demo]
port = $PGPORT_
pool_size = 10
[users.demo]
password = "demo"
CONF
echo "== starting sluice on port $SPORT (transaction pooling, pool of 10)"
./target/release/sluice --config "$WORK/sluice.toml" > "$WORK/sluice.log" 2>&1 &
SLUICE_PID=$!
for _ in $(seq 100); do pg_isready -q -h 127.0.0.1 -p "$SPORT" && break; sleep 0.1; done

export PGPASSWORD=demo PGSSLMODE=disable
pgbench -q -i -s 5 -h 127.0.0.1 -p "$SPORT" -U demo demo 2>&1 | tail -n 1
run() {
    local label=$1 port=$2
    local out
    out=$(pgbench -n -c 50 -j 2 -T "$SECS" -h 127.0.0.1 -p "$port" -U demo demo 2>&1)
    printf '%-28s %s | %s | %s\n' "$label" \
        "$(grep -oE 'tps = [0-9.]+' <<<"$out" | head -1)" \
        "$(grep -oE 'latency average = [0-9.]+ ms' <<<"$out")" \
        "$(grep -oE 'failed transactions: [0-9]+' <<<"$out" || echo 'failed transactions: 0')"
}
echo "== pgbench TPC-B, 50 clients, ${SECS}s each"
run "direct (50 server conns)" "$PGPORT_"
run "through sluice (10 conns)" "$SPORT"
echo "== server connections PostgreSQL saw from sluice:"
psql -X -qtA -h "$WORK" -p "$PGPORT_" -U postgres -c "SELECT count(*) FROM pg_stat_activity WHERE usename = 'demo'"
