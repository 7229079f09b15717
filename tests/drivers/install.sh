#!/usr/bin/env bash
# Installs the client drivers that tests/drivers.rs runs, from the pinned files in
# tests/drivers/*, outside the source tree:
#   python  target/drivers/venv: python3 -m venv, pip install -r python/requirements.txt
#   node    target/drivers/node/node_modules: npm ci on copies of node/package{,-lock}.json
#   java    ~/.m2 and target/drivers/java/classpath.txt: mvn dependency:build-classpath
#   go      the Go module and build caches: go mod download, go build (warms the cache
#           the test's own `go build` then hits)
# Each part leaves target/drivers/PART.stamp: the sha256 of its pinned files, then their
# paths. A part whose stamp still matches is skipped, so reruns take a fraction of a second;
# the tests read the same stamps and fail, pointing here, when one is missing or stale.
# Needs python3 with venv, node/npm, java (a JDK) with mvn, and go; scripts/test.sh
# installs what Debian packages of those are missing before it runs this.
# Usage: bash tests/drivers/install.sh [python] [node] [java] [go]   (none: all four)
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
src=$root/tests/drivers
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$root/$target
out=$target/drivers
mkdir -p "$out"

# The pinned files of each part, relative to tests/drivers.
declare -A pinned=(
  [python]="python/requirements.txt"
  [node]="node/package.json node/package-lock.json"
  [java]="java/pom.xml"
  [go]="go/go.mod go/go.sum"
)
# What must exist besides the stamp for a part to count as installed.
declare -A product=(
  [python]="$out/venv/bin/python"
  [node]="$out/node/node_modules/pg/package.json"
  [java]="$out/java/classpath.txt"
  [go]="$out/go/pgx-workload"
)

# Runs a command quietly, showing its output only if it fails.
quiet() {
  local log
  if ! log=$("$@" 2>&1); then
    printf '%s\n' "$log" >&2
    return 1
  fi
}

pinned_hash() { (cd "$src" && cat -- "$@") | sha256sum | cut -d' ' -f1; }

up_to_date() {
  local part=$1 stamp=$out/$1.stamp
  # shellcheck disable=SC2086 # the lists are space-separated paths without spaces
  [[ -f $stamp && -e ${product[$part]} ]] && [[ $(head -n1 "$stamp") == "$(pinned_hash ${pinned[$part]})" ]]
}

write_stamp() {
  local part=$1
  # shellcheck disable=SC2086
  { pinned_hash ${pinned[$part]}; printf '%s\n' ${pinned[$part]}; } >"$out/$part.stamp"
}

install_python() {
  local venv=$out/venv
  if ! "$venv/bin/python" -c '' 2>/dev/null; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv"; then
      echo "python3 -m venv failed: on Debian, apt-get install python3-venv" >&2
      return 1
    fi
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$src/python/requirements.txt"
}

install_node() {
  mkdir -p "$out/node"
  cp "$src/node/package.json" "$src/node/package-lock.json" "$out/node/"
  (cd "$out/node" && quiet npm ci --no-audit --no-fund)
}

install_java() {
  mkdir -p "$out/java"
  quiet mvn -B -f "$src/java/pom.xml" "-Dsluice.build.dir=$out/java/build" \
    dependency:build-classpath "-Dmdep.outputFile=$out/java/classpath.txt"
}

install_go() {
  mkdir -p "$out/go"
  (cd "$src/go" && go mod download && go build -mod=readonly -buildvcs=false -o "$out/go/pgx-workload" .)
}

parts=("$@")
((${#parts[@]})) || parts=(python node java go)
for part in "${parts[@]}"; do
  [[ -n ${pinned[$part]:-} ]] || { echo "unknown part '$part' (python, node, java, go)" >&2; exit 2; }
  if up_to_date "$part"; then
    echo "$part drivers: up to date"
    continue
  fi
  started=$SECONDS
  rm -f "$out/$part.stamp"
  "install_$part"
  write_stamp "$part"
  echo "$part drivers: installed in $((SECONDS - started)) s"
done
