#!/usr/bin/env bash
# Checks formatting and lint, builds dtcore with its C++ tests, then runs them all: GoogleTest
# (ctest), then pytest.
# Every multi-rank test has its own timeout; the limits below only stop a runaway suite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/lint.sh

PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
  -Cbuild-dir=build/py -Ccmake.define.DTCORE_BUILD_TESTS=ON .

ctest --test-dir build/py --output-on-failure -j2 --timeout 120
timeout 1500 python3 -m pytest --durations=25 tests/py  # (the slowest tests listed: the suite must stay under its budget)
