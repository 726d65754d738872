#!/usr/bin/env bash
# The whole test suite: bootstrap (idempotent), then the lock check, linters, type checks and every test.
# CI runs exactly this (see .ci/run). Exit status: non-zero when any step fails.
#
#   scripts/test.sh [PYTEST_ARGS…]         everything (what CI runs)
#   scripts/test.sh --fast [PYTEST_ARGS…]  the inner loop: ruff, mypy and the tests that start no sandbox, use no SSH
#                                          test host and are not marked slow (a few minutes on 2 cores)
#
# pytest runs in four parts (pytest-xdist), so that the tests that wait on running processes in real time do not lose
# the cores to the CPU-bound ones (a starved router or worker would read as a slow release to the gates):
#   * in the foreground, one after another:
#     1. timed: the modules marked `timed` (the 512-replica scale sandbox, the sandbox capacity calibration): they
#        judge real-time heartbeats and measure CPU costs, and are themselves CPU-heavy; two workers (--dist loadfile);
#     2. wait-bound: the `sandbox` tests but the drills (tests/conftest.py marks them), six workers, one sandbox each
#        (--dist loadgroup: one module, or one of its SANDBOX_GROUPS, per worker). They idle most of their wall time
#        (the healthy-rollout test: 0.45 of a core in 91 s); their judgments compare a canary with its peers in the same window,
#        so a neighbour's load is weather to both. Eight workers (236 s instead of 281) failed two timing judgments
#        in the second of two CI runs (a drain's requests finished before the restart read them; 503s from the router
#        while a never-ready batch timed out): the neighbours' load, not the code.
#   * in the background, beside 1 and 2, in a CPU cgroup of low weight (cpu.shares 256 against the 1,024 of each
#     session's autogroup; cgroup v2: cpu.weight 25), so that it takes the cores the foreground leaves idle and little
#     of what the foreground wants: the cpu-bound tests (every test not marked `sandbox` or `timed`, one module per
#     worker, --dist loadfile, three workers: they wait on SSH hosts and subprocesses too), then mypy and the YAML and
#     Ansible checks. `nice` alone would not do: the kernel's autogroups share the CPU between sessions first, and the
#     sandboxes and SSH hosts start sessions of their own. Where no cgroup can be made (not root), the background
#     parts run first, in the foreground, and the run says so;
#   * last, alone: 3. drills: the fault drills (`drill`, tests/test_drill_run.py), four workers, one sandbox per drill
#     group: they judge client latency against the baseline taken before the fault, and the rollout tests' client
#     load would read as the fault's. Four drill sandboxes keep both cores busy. A starved prober is `invalid` and
#     measured again; the recovery windows are judged by a binomial test (one slow request of ~60 is no evidence: CI
#     once failed replica-crash on it beside the rollout tests).
# The loadfile parts deal their modules longest first, and the split sandbox modules' tests are dealt into their groups
# longest first, by the seconds each test took in the last measured run (tests/durations.json; tests/support/schedule.py
# says how, and how to refresh it): a phase lasts as long as its busiest worker.
# Each phase writes its JUnit XML (per-test times) to test-output/.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ ${1:-} == --fast ]]; then
  fast=1
  shift
fi
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== lock (uv.lock and requirements*.lock agree with pyproject.toml; offline)"; scripts/lock.sh --check
echo "== ruff";          ruff check serving infra policies ansible tests bench scripts
mkdir -p test-output
static_checks() {  # mypy, the YAML and Ansible checks (a whole run does them in the background, below); the first
  # failure ends them (&&: `set -e` is off in a function whose status is tested)
  echo "== mypy (strict on serving/)" && mypy serving &&
    echo "== yamllint" && yamllint -s . &&
    echo "== ansible-lint (production profile)" && (cd ansible && ansible-lint) &&
    echo "== ansible-test sanity" && scripts/ansible-sanity.sh &&
    echo "== ansible-playbook --syntax-check" &&
    (cd ansible && ansible-playbook --syntax-check -i inventory/prod.exaserve.yml preflight.yml site.yml)
}
background_cgroup() {  # the cgroup.procs file of a new CPU cgroup of low weight; nothing where none can be made
  local v1=/sys/fs/cgroup/cpu v2=/sys/fs/cgroup name="exaserve-test-background-$$"
  if [[ -f $v1/cpu.shares && -w $v1/cgroup.procs ]]; then
    mkdir "$v1/$name" && echo 256 > "$v1/$name/cpu.shares" && echo "$v1/$name/cgroup.procs"
  elif [[ -f $v2/cgroup.controllers && -w $v2/cgroup.procs ]] && grep -qw cpu "$v2/cgroup.controllers"; then
    { grep -qw cpu "$v2/cgroup.subtree_control" || echo +cpu > "$v2/cgroup.subtree_control"; } &&
      mkdir "$v2/$name" && echo 25 > "$v2/$name/cpu.weight" && echo "$v2/$name/cgroup.procs"
  fi 2>/dev/null || true
}
gpu=""  # gpu-marked tests run where torch sees a CUDA device; elsewhere they are deselected, and said so
if [[ $(python -m tests.support.gpu 2>/dev/null) == 0 ]]; then gpu=" and not gpu"; echo "== no CUDA device: gpu tests deselected"; fi
ran=0 failed=0
run_phase() {  # run_phase NAME MARKERS WORKERS DIST [PYTEST_ARGS…]: pytest's exit status
  local name=$1 markers=$2 workers=$3 dist=$4 rc=0 start=$SECONDS
  shift 4
  echo "== pytest: $name (-m '$markers', $workers workers)"
  pytest -q -p no:cacheprovider -m "$markers" -n "$workers" --dist "$dist" --durations=10 \
    --junitxml="test-output/pytest-$name.xml" "$@" || rc=$?
  echo "== pytest: $name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}
settle() {  # settle NAME RC: exit 5 (nothing selected) is a failure only in a whole run (PYTEST_ARGS may select one
  # phase's tests); a failed phase does not stop the next one (CI's log shows all); the script's status is the first
  # failure's
  local name=$1 rc=$2
  if ((rc == 5 && !selecting)); then  # a whole run where a phase selects nothing: the markers broke, not a pass
    echo "test.sh: phase $name selected no test; tests/conftest.py marks them" >&2
    rc=1
  fi
  if ((rc == 0)); then ran=1; elif ((rc != 5)); then ran=1; ((failed)) || failed=$rc; fi
}
phase() {  # phase NAME MARKERS WORKERS DIST [PYTEST_ARGS…], in the foreground
  local rc=0
  run_phase "$@" || rc=$?
  settle "$1" "$rc"
}
selecting=$(($# > 0))  # PYTEST_ARGS may select tests of one phase only
if ((fast)); then
  echo "== mypy (strict on serving/)"; mypy serving
  phase fast "not sandbox and not hosts and not slow$gpu" 2 loadfile "$@"
else
  procs=$(background_cgroup)
  background() {  # the cpu-bound tests, then the static checks; each one's output and exit status in test-output/
    local rc=0
    rm -f test-output/cpu-bound.rc test-output/static-checks.rc
    run_phase cpu-bound "not sandbox and not timed$gpu" 3 loadfile "$@" > test-output/cpu-bound.log 2>&1 || rc=$?
    echo "$rc" > test-output/cpu-bound.rc
    rc=0
    static_checks > test-output/static-checks.log 2>&1 || rc=$?
    echo "$rc" > test-output/static-checks.rc
  }
  show_background() {
    local rc
    cat test-output/cpu-bound.log test-output/static-checks.log
    settle cpu-bound "$(cat test-output/cpu-bound.rc 2>/dev/null || echo 1)"
    rc=$(cat test-output/static-checks.rc 2>/dev/null || echo 1)
    if ((rc)); then echo "== mypy or the YAML and Ansible checks failed (exit $rc)"; ran=1; ((failed)) || failed=$rc; fi
  }
  if [[ -n $procs ]]; then
    (echo "$BASHPID" > "$procs" && background "$@") & back=$!  # its children stay in the cgroup
  else
    echo "== no CPU cgroup can be made here (root, cgroup v1 cpu or v2): the cpu-bound tests run first, not beside"
    background "$@"
    show_background
  fi
  phase timed "timed and not sandbox$gpu" 2 loadfile "$@"
  phase wait-bound "sandbox and not drill$gpu" 6 loadgroup "$@"
  if [[ -n $procs ]]; then
    wait "$back" || true
    echo "== background (cpu-bound tests, static checks): ended $SECONDS s into the run"
    show_background
    rmdir "$(dirname "$procs")" 2>/dev/null || true
  fi
  phase drills "drill$gpu" 4 loadgroup "$@"
fi
if ((!ran)); then
  echo "test.sh: no test was selected by: $*" >&2
  exit 5
fi
echo "== test.sh: $SECONDS s in all"
exit "$failed"
