#!/usr/bin/env bash
# Instructions Sluice's own process executes per transaction (user space: Sluice, tokio,
# libc), counted by callgrind on the release binary while pgbench drives it. Unlike
# CPU time, the count repeats to within a fraction of a percent on a noisy machine, so
# two builds can be compared without a quiet box. Kernel work (the syscalls, the
# loopback TCP) is not in it: see docs/performance.md for where that goes.
#
#   bench/callgrind.sh [BINARY ...]      default: target/release/sluice
#
# Each binary runs under valgrind twice per protocol (simple, extended, prepared),
# with the same logins and a warm-up, once for N1 and once for N2 transactions per
# client; the difference divided by the extra transactions is the steady-state count,
# with start-up, logins and the pool's connects cancelled out.
#
# Needs valgrind (apt-get install valgrind) and a PostgreSQL with pgbench's tables:
# by default the shared benchmark's cluster (../shared/bench/pg.sh init: 127.0.0.1:5432,
# database, user and password "bench"). Override with PG_HOST, PG_PORT, DB_NAME,
# DB_USER, DB_PASSWORD. CLIENTS (40), POOL (the pool size, default CLIENTS: fewer
# makes clients queue, e.g. CLIENTS=500 POOL=40 N1=20 N2=60), N1 (100), N2 (300),
# PROTOCOLS, PORT (26990). RECONNECT=1 runs pgbench -C, a new connection per
# transaction: the count is then per connection (login, one transaction, close; the
# logins are not cancelled out), e.g. RECONNECT=1 N1=5 N2=15 PROTOCOLS=simple.
# AUTH (trust) is the clients' auth_type: trust, md5 or scram-sha-256 (with the config's
# plain password Sluice derives SCRAM's keys once: a SCRAM login runs no PBKDF2 on
# Sluice's side).
# KEEP=DIR keeps each run's callgrind output there (I-BINARY-PROTOCOL-N.out, I the
# binary's place in the arguments), for callgrind_annotate or a per-function
# difference of the N1 and N2 runs.
set -euo pipefail

BINS=()
for b in "$@"; do BINS+=("$(realpath "$b")"); done
if [ -n "${KEEP:-}" ]; then KEEP=$(realpath -m "$KEEP"); fi
cd "$(dirname "$0")/.."
[ ${#BINS[@]} -gt 0 ] || BINS=("$PWD/target/release/sluice")
PG_HOST=${PG_HOST:-127.0.0.1} PG_PORT=${PG_PORT:-5432}
DB_NAME=${DB_NAME:-bench} DB_USER=${DB_USER:-bench} DB_PASSWORD=${DB_PASSWORD:-bench}
CLIENTS=${CLIENTS:-40} N1=${N1:-100} N2=${N2:-300} PORT=${PORT:-26990}
PROTOCOLS=${PROTOCOLS:-simple extended prepared}
reconnect= unit=tx
if [ "${RECONNECT:-0}" = 1 ]; then reconnect=-C unit=connection; fi
[ "$N2" -gt "$N1" ] || { echo "callgrind.sh: N2 ($N2) must exceed N1 ($N1)" >&2; exit 1; }

command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "callgrind.sh: $b is not an executable (cargo build --release)" >&2; exit 1; }; done
export PGPASSWORD=$DB_PASSWORD PGSSLMODE=disable
pg_isready -q -h "$PG_HOST" -p "$PG_PORT" || { echo "callgrind.sh: no PostgreSQL on $PG_HOST:$PG_PORT" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT TERM
cat > "$work/select.sql" <<'SQL'
\set aid random(1, 100000)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SQL
cat > "$work/sluice.toml" <<TOML
[general]
listen_addr = ["127.0.0.1"]
listen_port = $PORT
unix_socket_dir = ""
workers = 1
auth_type = "${AUTH:-trust}"
pool_mode = "transaction"
server_tls_sslmode = "disable"
default_pool_size = ${POOL:-$CLIENTS}
max_client_conn = $((CLIENTS + 10))
query_wait_timeout = 600
log_level = "warn"
[databases.$DB_NAME]
host = "$PG_HOST"
port = $PG_PORT
[users.$DB_USER]
password = "$DB_PASSWORD"
TOML

# Total instructions of one Sluice process, into COUNT: warm-up (20 per client), then N
# per client. Runs in this shell (not in $(...)), so the EXIT trap and -e cover it.
COUNT=
count() { # binary protocol N index
    local out="$work/cg.out" i t
    rm -f "$out"*
    valgrind --tool=callgrind --callgrind-out-file="$out" "$1" --config "$work/sluice.toml" \
        > "$work/sluice.log" 2>&1 &
    pid=$!
    for i in $(seq 100); do
        pg_isready -q -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d "$DB_NAME" && break
        kill -0 "$pid" 2>/dev/null || { cat "$work/sluice.log" >&2; exit 1; }
        sleep 0.1
    done
    pg_isready -q -h 127.0.0.1 -p "$PORT" || { echo "callgrind.sh: Sluice did not start listening" >&2; exit 1; }
    for t in 20 "$3"; do
        pgbench -n $reconnect -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -c "$CLIENTS" -j 2 -t "$t" -M "$2" \
            -f "$work/select.sql" "$DB_NAME" > "$work/pgbench.out" 2>&1 \
            || { cat "$work/pgbench.out" >&2; exit 1; }
        grep -q "processed: $((CLIENTS * t))/" "$work/pgbench.out" || { cat "$work/pgbench.out" >&2; exit 1; }
    done
    kill -INT "$pid"
    wait "$pid" || true
    pid=
    # printf, not print: mawk prints sums of 2^31 and more in exponent notation.
    COUNT=$(awk '/^summary:/ {s += $2} END {printf "%.0f\n", s}' "$out"*)
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP"
        for f in "$out"*; do cp "$f" "$KEEP/$4-$(basename "$1")-$2-$3${f#"$out"}.out"; done
    fi
}

printf '%-40s %-9s %12s\n' binary protocol "Ir/$unit"
for i in "${!BINS[@]}"; do
    b=${BINS[$i]}
    for p in $PROTOCOLS; do
        count "$b" "$p" "$N1" "$i"
        a=$COUNT
        count "$b" "$p" "$N2" "$i"
        printf '%-40s %-9s %12d\n' "$b" "$p" $(((COUNT - a) / (CLIENTS * (N2 - N1))))
    done
done
