#!/usr/bin/env bash
# The whole test suite: bootstrap (idempotent), then the lock check, linters, type checks and every test.
# CI runs exactly this (see .ci/run). Exit status: non-zero when any step fails.
#
#   scripts/test.sh [PYTEST_ARGS…]         everything (what CI runs)
#   scripts/test.sh --fast [PYTEST_ARGS…]  the inner loop: ruff, mypy and the tests that start no sandbox, use no SSH
#                                          test host and are not marked slow (a few minutes on 2 cores)
#
# No test here judges how long something took: the real-time judgments against the plan's targets are the
# rehearsal's (scripts/rehearse.sh, tests/rehearsal/, deselected here by the `rehearsal` marker; docs/testing.md,
# "Two tiers"), so every verdict below is the same on a quiet machine and a loaded one (scripts/ci-under-load.sh).
# pytest runs in four phases (pytest-xdist), each dealt so that its busiest worker ends as early as it can:
#   1. cpu-bound: every test not marked `sandbox` or `scale`, one module per worker (--dist loadfile), three workers
#      (these tests wait on SSH hosts and subprocesses too: three workers kept 1.4 of the 2 cores busy); mypy and the
#      YAML and Ansible checks run beside it;
#   2. wait-bound: the `sandbox` tests but the drills (tests/conftest.py marks them), five workers, one sandbox each
#      (--dist loadgroup: one module, or one of its SANDBOX_GROUPS, per worker); they wait on real routers, workers,
#      etcd and Prometheus by events, with patience (tests/support/patience.py), and their rollouts keep the QPS and
#      P99 gates in dry run (tests/support/sandbox.py DRY_RUN_GATES);
#   3. drills: the fault drills judged by order (`exaserve drill --judge order`, tests/test_drill_run.py), three
#      workers, one sandbox per drill group: out of rotation, restarted, back, a new leader, no client error, the
#      alerts; a drill group takes half a core;
#   4. scale: the scale sandbox (tests/test_sandbox_scale.py, marked `scale`), alone: its 512 simulated replicas,
#      64 agents and 3 controllers take what the machine has. Beside the cpu-bound phase under load they missed
#      their 3 s probes everywhere at once (every rack read unhealthy, so the controller rightly acted on nothing);
#      beside the wait-bound phase they starved its sandboxes (CI under load at 5fb21ad and 0c95f41).
# How the work is dealt: by pytest-xdist's own loadfile and loadgroup (both its LoadScopeScheduling, xdist/scheduler/
# loadscope.py; the project has no scheduler of its own). A phase's work units (a module under loadfile; an
# xdist_group under loadgroup: a sandbox module, or one of its SANDBOX_GROUPS) are queued once every worker has
# collected; each worker gets one unit, a worker whose unit has two tests or fewer a second at once, and then its next
# unit as soon as it has two tests or fewer left, so a unit is never split and the queue's order decides what runs
# last. xdist queues the units with the most tests first (--loadscope-reorder), which left a long unit of one or two
# tests to the end; tests/conftest.py turns that off and orders each worker's collection unit by unit, the heaviest
# first by the seconds each test took in the last measured run (tests/durations.json), so the longest unit is dealt
# first: a phase lasts as long as its busiest worker. The sandbox phases' first wave alternates the lightest and the
# heaviest group (their heaviest rollouts started together failed timing judgments), and a split sandbox module's
# tests are dealt into its groups longest first (tests/support/schedule.py says how, and how to refresh the file).
# Not worksteal: it moves single tests between workers, so a module's module-scoped fixtures (a sandbox module's
# sandbox) would be set up again on each worker that takes some of its tests.
# Each phase writes its JUnit XML (per-test times) to test-output/.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ ${1:-} == --fast ]]; then
  fast=1
  shift
fi
bash scripts/bootstrap.sh --sglang-parser
echo "== bootstrap: $SECONDS s"
export PATH="$PWD/.venv/bin:$PATH"
# Python caches the bytecode of what it imports (our modules, and pytest's assertion-rewritten tests) in __pycache__,
# which git ignores; a machine that sets PYTHONDONTWRITEBYTECODE (this one does) compiles them again in every process:
# each xdist worker's collection took 6.7 s of CPU against 2.6 s cached (2026-12-05), every phase starts one per worker
unset PYTHONDONTWRITEBYTECODE
echo "== lock (uv.lock and requirements*.lock agree with pyproject.toml; offline)"; scripts/lock.sh --check
echo "== ruff";          ruff check serving infra policies ansible tests bench scripts
mkdir -p test-output
static_checks() {  # mypy, the YAML and Ansible checks; a whole run does them beside the cpu-bound phase (below)
  set -e
  # each with its seconds: a machine without ansible-test's virtualenvs builds them in the sanity step (~50 s of CPU)
  timed() { local name=$1 t=$SECONDS; shift; echo "== $name"; "$@"; echo "   ($name: $((SECONDS - t)) s)"; }
  timed "mypy (strict on serving/)" mypy serving
  timed "yamllint" yamllint -s .
  # ansible.cfg's default inventory fails by design (no stack is a default) and any_unparsed_is_failed makes that fatal:
  # ansible-lint lifts it for one of its syntax checks but not for the one that loads an imported playbook, which it
  # would then skip with an ERROR line and still pass; lifted here for the whole lint, and a playbook it could not
  # load fails the step
  timed "ansible-lint (production profile)" bash -c 'cd ansible && set -o pipefail &&
    ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED=False ansible-lint 2>&1 | tee /dev/stderr | { ! grep -q "Failed to load"; }'
  timed "ansible-test sanity" scripts/ansible-sanity.sh
  timed "ansible-playbook --syntax-check" bash -c \
    'cd ansible && ansible-playbook --syntax-check -i inventory/prod.exaserve.yml preflight.yml site.yml'
}
gpu=""  # gpu-marked tests run where torch sees a CUDA device; elsewhere they are deselected, and said so
if [[ $(python -m tests.support.gpu 2>/dev/null) == 0 ]]; then gpu=" and not gpu"; echo "== no CUDA device: gpu tests deselected"; fi
ran=0 failed=0
phase() {  # phase NAME MARKERS WORKERS DIST [PYTEST_ARGS…]; exit 5 (nothing selected) is a failure only in a whole run
  # (PYTEST_ARGS may select one phase's tests); a failed phase does not stop the next one (CI's log shows both); the
  # script's status is the first failure's
  # (the rehearsal tier, tests/rehearsal/, is never run here: its real-time judgments are scripts/rehearse.sh's)
  local name=$1 markers="not rehearsal and ($2)" workers=$3 dist=$4 rc=0 start=$SECONDS
  shift 4
  echo "== pytest: $name (-m '$markers', $workers workers)"
  pytest -q -p no:cacheprovider -m "$markers" -n "$workers" --dist "$dist" --durations=10 \
    --junitxml="test-output/pytest-$name.xml" "$@" || rc=$?
  echo "== pytest: $name: exit $rc after $((SECONDS - start)) s"
  if ((rc == 5 && !selecting)); then  # a whole run where a phase selects nothing: the markers broke, not a pass
    echo "test.sh: phase $name selected no test (-m '$markers'); tests/conftest.py marks them" >&2
    rc=1
  fi
  if ((rc == 0)); then ran=1; elif ((rc != 5)); then ran=1; ((failed)) || failed=$rc; fi
}
selecting=$(($# > 0))  # PYTEST_ARGS may select tests of one phase only
if ((fast)); then
  echo "== mypy (strict on serving/)"; mypy serving
  phase fast "not sandbox and not hosts and not slow$gpu" 2 loadfile "$@"
else
  # the cpu-bound phase keeps about 1.4 of the 2 cores busy (its tests wait on SSH hosts and subprocesses too): mypy
  # (cold on a clean clone) and the YAML and Ansible checks (about 40 s of one core) run beside it, their output
  # shown after it
  static_checks > test-output/static-checks.log 2>&1 & checks=$!
  phase cpu-bound "not sandbox and not scale$gpu" 3 loadfile "$@"
  checks_rc=0; wait "$checks" || checks_rc=$?
  cat test-output/static-checks.log
  if ((checks_rc)); then echo "== mypy or the YAML and Ansible checks failed (exit $checks_rc)"; ran=1; ((failed)) || failed=$checks_rc; fi
  phase wait-bound "sandbox and not drill$gpu" 5 loadgroup "$@"
  phase drills "drill$gpu" 3 loadgroup "$@"
  phase scale "scale$gpu" 1 loadfile "$@"
fi
if ((!ran)); then
  echo "test.sh: no test was selected by: $*" >&2
  exit 5
fi
echo "== test.sh: $SECONDS s in all"
exit "$failed"
