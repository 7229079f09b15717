#!/usr/bin/env bash
# The whole test suite: installs missing system packages, then `cargo fmt --check`,
# `cargo clippy --all-targets -D warnings` and `cargo test --all-targets`.
# The integration tests start real PostgreSQL clusters (tests/common/pg.rs) and the debug
# `sluice` binary. Usage: bash scripts/test.sh
set -Eeuo pipefail # -E: the ERR trap also fires inside functions
cd "$(dirname "${BASH_SOURCE[0]}")/.."

current_step="setup"
trap 'echo "TESTS FAILED during: $current_step" >&2' ERR
step() {
  current_step=$*
  echo "==> $*"
}

# ---------------------------------------------------------------------------------------------
# 1. System packages. PostgreSQL 15, psql, pgbench and Rust are normally present already;
#    only what is missing gets installed, so reruns skip apt entirely.
# ---------------------------------------------------------------------------------------------
step "checking system packages"
missing=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need_pkg() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing+=("$1")
}
pg_server_present() {
  [[ -n "${SLUICE_PG_BINDIR:-}" ]] || compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null
}

pg_server_present || missing+=(postgresql-15)
need_cmd psql postgresql-client-15
need_cmd pgbench postgresql-15
need_cmd cc gcc                 # linker used by rustc
need_pkg libc6-dev              # crt files and libc for linking
need_cmd setpriv util-linux     # tests run PostgreSQL as the postgres user when root
need_cmd md5sum coreutils       # md5 password hashes in tests/common/pg.rs
need_cmd pgrep procps           # tests that look for leftover processes
[[ -e /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)  # cargo downloads
# Admin console and live view tests (tests/metrics.rs): a real PgBouncer exporter and a
# real browser. About 2 minutes of apt on a cold machine; skipped when present.
[[ -x /usr/bin/prometheus-pgbouncer-exporter ]] || missing+=(prometheus-pgbouncer-exporter)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
# Driver suites add their packages here (see section 4), e.g.:
#   need_cmd python3 python3; need_cmd node nodejs; need_cmd java default-jdk-headless; need_cmd go golang-go

install_packages() {
  local as_root=()
  if [[ $EUID -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "not root and no sudo: not installing $*; tests that need them will fail"
      return 0
    fi
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  step "installing ${missing[*]}"
  install_packages "${missing[@]}"
fi

for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    step "adding rustup component $component"
    rustup component add "$component"
  fi
done

# ---------------------------------------------------------------------------------------------
# 2. Formatting and lints.
# ---------------------------------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

# ---------------------------------------------------------------------------------------------
# 3. Unit and integration tests (the integration tests use the debug binary built here).
# ---------------------------------------------------------------------------------------------
step "cargo test --all-targets"
# tests/metrics.rs fails instead of skipping when the exporter or Chromium is missing.
export SLUICE_REQUIRE_TOOLS=1
cargo test --all-targets

# ---------------------------------------------------------------------------------------------
# 4. Client-driver suites against a running Sluice. Hook each in here when it exists, as a
#    step with its own script, and add its packages to section 1:
#      step "python driver tests (psycopg, asyncpg)";  bash tests/drivers/python/run.sh
#      step "node driver tests (pg, postgres.js)";      bash tests/drivers/node/run.sh
#      step "java driver tests (pgjdbc)";               bash tests/drivers/java/run.sh
#      step "go driver tests (pgx, lib/pq)";            bash tests/drivers/go/run.sh
# ---------------------------------------------------------------------------------------------

trap - ERR
echo "ALL TESTS PASSED: fmt, clippy, cargo test"
