#!/usr/bin/env bash
# The whole test suite: installs missing system packages, then `cargo fmt --check`,
# `cargo clippy --all-targets -D warnings`, installs the pinned client drivers
# (tests/drivers/install.sh) and runs `cargo test` on the lib, bins and tests. The
# micro-benchmarks (benches/) are compiled by clippy --all-targets, never run here.
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
need_cmd cc gcc                 # linker used by rustc; also builds AWS-LC (TLS crypto, no cmake/nasm needed)
need_pkg libc6-dev              # crt files and libc for linking
need_cmd setpriv util-linux     # tests run PostgreSQL as the postgres user when root
need_cmd md5sum coreutils       # md5 password hashes in tests/common/pg.rs
need_cmd pgrep procps           # tests that look for leftover processes
need_cmd openssl openssl         # s_client offers chosen TLS 1.2 suites and curves (tests/tls)
[[ -e /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)  # cargo downloads
# Driver suites (tests/drivers.rs runs the programs in tests/drivers; section 3 installs the
# pinned drivers): the toolchains. Java runs the workload with the source launcher, which needs
# a JDK. Debian 12's golang-go (1.19) is older than pgx needs (go.mod says 1.25); it is only
# the fallback where no Go is installed, and `go build` then says so.
need_cmd python3 python3
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
need_cmd node nodejs
need_cmd npm npm
need_cmd javac default-jdk-headless
need_cmd mvn maven
need_cmd go golang-go
# Admin console and live view tests (tests/metrics.rs): a real PgBouncer exporter and a
# real browser. About 2 minutes of apt on a cold machine; skipped when present.
[[ -x /usr/bin/prometheus-pgbouncer-exporter ]] || missing+=(prometheus-pgbouncer-exporter)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)

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
# 3. Client drivers for the driver suites. The suites themselves are cargo tests
#    (tests/drivers.rs: one test per driver and pool mode, and per driver over TLS with
#    verify-full, each starting PostgreSQL and Sluice and running a program from
#    tests/drivers), so they run in section 4; this installs their
#    pinned drivers outside the source tree first: target/drivers/{venv,node,java,go}, ~/.m2 and
#    Go's module cache. Parts whose pinned files did not change are skipped (well under a
#    second). A new driver suite adds its program under tests/drivers, a part to
#    tests/drivers/install.sh, its toolchain to section 1 and its tests to tests/drivers.rs.
# ---------------------------------------------------------------------------------------------
step "installing client drivers (tests/drivers/install.sh)"
bash tests/drivers/install.sh

# ---------------------------------------------------------------------------------------------
# 4. Unit and integration tests (the integration tests use the debug binary built here), the
#    driver suites (tests/drivers.rs) included.
# ---------------------------------------------------------------------------------------------
step "cargo test --lib --bins --tests"
# tests/metrics.rs fails instead of skipping when the exporter or Chromium is missing,
# and the tests that need root (tests/dns.rs, the Unix socket's group) when run as root.
export SLUICE_REQUIRE_TOOLS=1
if [[ "$(id -u)" == 0 ]]; then export SLUICE_REQUIRE_ROOT=1; fi
# Not --all-targets: that would also run each criterion bench once; clippy --all-targets
# above already compiles them (`cargo bench`, bench/README.md, runs them).
cargo test --lib --bins --tests

trap - ERR
echo "ALL TESTS PASSED: fmt, clippy, cargo test (driver suites included)"
