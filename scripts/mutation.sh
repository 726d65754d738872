#!/usr/bin/env bash
# Mutation score of the pure core: the planner, the rollout gates and state machine, the fan-out guard
# (pyproject.toml [tool.mutmut]), each mutant run against the fast unit tests that reach it. Prints the
# score per module (killed / mutants; a mutant no test reaches counts as surviving) and the survivors.
# Target: >= 85 % killed on each module. Too slow for every CI run (see docs/testing.md for the time).
#
#   scripts/mutation.sh [--max-children N] [--keep] [--deselect NODEID]... [MUTANT-GLOB]...
#
# MUTANT-GLOB limits the run to some modules' mutants, e.g. 'serving.runtime.*' (mutmut's names: module, then
# __mutmut_N); without one every module in [tool.mutmut] only_mutate is mutated.
# Runs in a copy of the working tree (tracked and untracked, not ignored files) so the checkout is never
# mutated; --keep leaves the copy (and mutmut's results, `mutmut show NAME` there) behind. The selected tests
# must pass on the unmutated tree; --deselect leaves out a test that fails for a reason of its own (say so).
# Exit status: 0 when every module reaches the target, 1 when one does not, 2 on a tool failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
children=2
keep=false
deselect=()
only=()
target=85
while (($#)); do
  case $1 in
    --max-children) children=$2; shift 2 ;;
    --keep) keep=true; shift ;;
    --deselect) deselect+=("\"--deselect\", \"$2\""); shift 2 ;;
    -*) echo "usage: scripts/mutation.sh [--max-children N] [--keep] [--deselect NODEID]... [MUTANT-GLOB]..." >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done
export PATH="$root/.venv/bin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/exaserve-mutation.XXXXXX")
if [[ $keep == false ]]; then trap 'rm -rf "$work"' EXIT; fi
git ls-files -z --cached --others --exclude-standard \
  | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$work"
cd "$work"
if ((${#deselect[@]})); then
  args=$(IFS=,; echo "${deselect[*]}")
  sed -i "/^\[tool.mutmut\]/a pytest_add_cli_args = [$args]" pyproject.toml
fi
started=$SECONDS
mutmut run --max-children "$children" "${only[@]}" >mutmut.log 2>&1 || { tail -40 mutmut.log >&2; exit 2; }
elapsed=$((SECONDS - started))
mutmut results --all true >results.txt
python - "$target" "$elapsed" <<'PY'
import collections
import sys

target, elapsed = float(sys.argv[1]), int(sys.argv[2])
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
by_module: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
survivors: dict[str, list[str]] = collections.defaultdict(list)
for line in open("results.txt"):
    key, _, status = line.strip().rpartition(": ")
    if "__mutmut_" not in key:
        continue
    module = key.split("__mutmut_")[0].rsplit(".", 1)[0]
    by_module[module][status] += 1
    if status not in KILLED and status not in ("skipped", "not checked"):
        survivors[module].append(f"{key} ({status})")
print(f"mutation run: {elapsed // 60} min {elapsed % 60} s")
print(f"{'module':34} {'mutants':>8} {'killed':>7} {'survived':>9} {'no tests':>9} {'score':>7}")
ok = True
for module, counts in sorted(by_module.items()):
    if all(s in ("skipped", "not checked") for s in counts):
        continue  # not in this run's MUTANT-GLOB
    total = sum(n for s, n in counts.items() if s not in ("skipped", "not checked"))
    killed = sum(counts[s] for s in KILLED)
    score = 100 * killed / total if total else 100.0
    ok = ok and score >= target
    print(f"{module:34} {total:8} {killed:7} {counts['survived']:9} {counts['no tests']:9} {score:6.1f}%")
for module, names in sorted(survivors.items()):
    print(f"\nsurviving in {module} ({len(names)}):")
    print("\n".join(f"  {n}" for n in names))
print(f"\ntarget {target:.0f} % on each module: {'met' if ok else 'NOT met'}")
sys.exit(0 if ok else 1)
PY
