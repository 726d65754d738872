#!/usr/bin/env bash
# CI under load (issue 37): the suite must give the same verdict on a busy machine. Runs `.ci/run` on clean clones
# of HEAD, one after another, as CI runs it (CI=true, a copy of ../shared beside the clone), each with
# `stress-ng --cpu 2` running beside it the whole time, and reports each run's exit status and wall time.
#
#   scripts/ci-under-load.sh [--runs N] [--no-load] [--keep] [--rev REV]
#
# --runs N: how many runs (default 3); --no-load: the same without stress-ng (the comparison); --keep: keep the
# clones and their logs (default: the logs only, under test-output/ci-under-load/REV/); --rev REV: the commit every
# run tests (default: HEAD when the script starts, so commits made meanwhile do not split the runs). Exit 0 when every
# run was green, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 load=1 keep=0 rev=HEAD
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --no-load) load=0; shift ;;
    --keep) keep=1; shift ;;
    --rev) rev=$2; shift 2 ;;
    *) echo "ci-under-load.sh: unknown argument $1 (--runs N, --no-load, --keep, --rev REV)" >&2; exit 2 ;;
  esac
done
shared=$(cd .. && pwd)/shared
[[ -d $shared ]] || { echo "ci-under-load.sh: no $shared beside the checkout: CI runs with a copy of it" >&2; exit 2; }
if ((load)) && ! command -v stress-ng >/dev/null; then
  echo "ci-under-load.sh: installing stress-ng (Debian package)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null; }
fi
commit=$(git rev-parse --verify --quiet "$rev^{commit}") \
  || { echo "ci-under-load.sh: --rev $rev names no commit here (a commit, branch or tag: git log --oneline)" >&2; exit 2; }
head=$(git rev-parse --short "$commit")
logs=$PWD/test-output/ci-under-load/$head$( ((load)) || echo -no-load)
mkdir -p "$logs"
work=$(mktemp -d /tmp/ci-under-load.XXXXXX)
stress=""
cleanup() {
  [[ -n $stress ]] && kill "$stress" 2>/dev/null && wait "$stress" 2>/dev/null || true
  ((keep)) || rm -rf "$work"
}
trap cleanup EXIT
failed=0 summary=()
for ((i = 1; i <= runs; i++)); do
  run=$work/run-$i
  mkdir -p "$run"
  git clone --quiet --no-hardlinks "$PWD" "$run/main"
  git -C "$run/main" checkout --quiet "$commit"
  cp -r "$shared" "$run/shared"
  chmod -R a-w "$run/shared"
  if ((load)); then
    stress-ng --cpu 2 --timeout 0 --quiet & stress=$!
  fi
  start=$SECONDS rc=0
  (cd "$run/main" && CI=true bash .ci/run </dev/null) >"$logs/run-$i.log" 2>&1 || rc=$?
  wall=$((SECONDS - start))
  if [[ -n $stress ]]; then kill "$stress" 2>/dev/null; wait "$stress" 2>/dev/null || true; stress=""; fi
  verdict=$([[ $rc == 0 ]] && echo green || echo "RED (exit $rc)")
  ((rc)) && failed=1
  line="run $i of $runs at $head$( ((load)) && echo ", stress-ng --cpu 2 beside it"): $verdict in $wall s; log $logs/run-$i.log"
  echo "$line"
  summary+=("$line")
  { grep -E "^== pytest: .*exit|^== test.sh:|passed|failed" "$logs/run-$i.log" || true; } | tail -n 8 | sed 's/^/    /'
  chmod -R u+w "$run/shared"
  ((keep)) || rm -rf "$run"
done
echo "== ci-under-load.sh: $runs run(s)"
printf '%s\n' "${summary[@]}"
exit "$failed"
