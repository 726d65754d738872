#!/usr/bin/env bash
# The rehearsal: every real-time judgment against the plan's targets, which the CI suite (scripts/test.sh) never
# makes (its verdicts must not depend on how fast or loaded its machine is: docs/testing.md, "Two tiers"). Run it on
# a quiet machine before resolving anything that touches the runtime, the drills, the gates or the router, and put
# its report's summary in the closing note.
#
#   scripts/rehearse.sh [--out DIR] [--no-scale] [PYTEST_ARGS…]
#
# 1. tests/rehearsal/ (pytest -m rehearsal), one test at a time, one sandbox per module: every fault drill judged on
#    the plan's targets (detection, recovery, restoration, takeover, client errors; a drill whose probes slipped is
#    `invalid`, measured once more, never passed), the sandbox rollouts with their QPS and P99 gates enforced, and
#    the timing claims the CI tests make only as events (timeouts honoured, detection within the routers' budget);
# 2. the scale rehearsal at the largest size the machine holds (bench/scale_bench.py --sections reference,rollout
#    --rollout-batches 0: all 5 batches, every one passed, no client error), unless --no-scale (about 15 minutes
#    at 2,048 replicas on 2 cores).
# Each test writes its record (every figure, its target, its verdict) under DIR/records; the report is
# DIR/report.json (default DIR: test-output/rehearsal). Exit 0 when every target was met, 1 when one was missed (or
# a step could not run), 3 when only invalid measurements stand in the way of a pass (run it again, quieter).
set -euo pipefail
cd "$(dirname "$0")/.."
out=test-output/rehearsal scale=1
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --no-scale) scale=0; shift ;;
    *) break ;;
  esac
done
bash scripts/bootstrap.sh --sglang-parser
export PATH="$PWD/.venv/bin:$PATH"
unset PYTHONDONTWRITEBYTECODE
rm -rf "$out/records"
mkdir -p "$out/records"
out=$(cd "$out" && pwd)
export EXASERVE_REHEARSAL_OUT="$out/records"
# one at a time: a rehearsal measures the product, not its neighbours
tests=0
(($#)) || set -- tests/rehearsal  # PYTEST_ARGS: what to run of the rehearsal tier (default: all of it)
pytest -q -p no:cacheprovider -m rehearsal --durations=10 --junitxml="$out/pytest-rehearsal.xml" "$@" || tests=$?
not_run=()
[[ "$*" != tests/rehearsal ]] && not_run+=("tests/rehearsal/ but what was selected by: $*")
if ((scale)); then
  echo "== scale rehearsal (bench/scale_bench.py at the largest size this machine holds)"
  PYTHONPATH=. python bench/scale_bench.py --sections reference,rollout --rollout-batches 0 --cpu-share 1.0 --json \
    >"$out/scale.json" || echo "== rehearse.sh: the scale rehearsal exited $? (its record says why)"
  python -m tests.support.rehearsal scale "$out/scale.json" "$out/records"
else
  not_run+=("the scale rehearsal (--no-scale)")
fi
rc=0
# the records checked against pytest's own outcomes: a test that failed before it recorded anything (its sandbox did
# not start, say), or after (an assert past its figures), fails the report
python -m tests.support.rehearsal gather "$out/records" "$out/report.json" "$out/pytest-rehearsal.xml" \
  "${not_run[@]}" || rc=$?
if ((tests && !rc)); then  # pytest failed in a way no record or JUnit case shows (a collection error, say)
  echo "== rehearse.sh: pytest exited $tests with every record passed: see its output above"
  rc=1
fi
echo "== rehearse.sh: $SECONDS s; report $out/report.json"
exit "$rc"
