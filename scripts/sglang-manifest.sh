#!/usr/bin/env bash
# Regenerate the pinned flag manifests from the REAL parsers:
#   serving/data/sglang-<version>-server-flags.json  (sglang.srt.server_args.ServerArgs.add_cli_args)
#   serving/data/smg-<version>-flags.json            (smg.router_args.RouterArgs.add_cli_args, the gateway)
# The server parser runs in a throwaway venv holding just enough of SGLang to import it (pinned in
# scripts/sglang-manifest-requirements.txt), in the user's cache ($EXASERVE_SGLANG_VENV, default
# ${XDG_CACHE_HOME:-~/.cache}/exaserve/venv-sglang: about 2 GB, shared by every checkout and kept across
# clean clones); it is built once and rebuilt only when that file or the interpreter changes. The router parser runs in the project's .venv (bootstrap.sh).
#
#   scripts/sglang-manifest.sh                  rewrite the committed manifests in serving/data
#   scripts/sglang-manifest.sh --out-dir DIR    write them to DIR instead (what the tests compare)
#   scripts/sglang-manifest.sh --venv-only      build (or check) the SGLang venv only (scripts/bootstrap.sh)
set -euo pipefail

out_dir=serving/data
venv_only=0
while (($#)); do
  case "$1" in
    --out-dir) out_dir=$(realpath -m "${2:?--out-dir needs a folder}"); shift 2 ;;
    --venv-only) venv_only=1; shift ;;
    *) echo "sglang-manifest: unknown argument '$1'; the options are --out-dir DIR and --venv-only" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

if ((!venv_only)) && [ ! -x .venv/bin/python ]; then
  echo "sglang-manifest: .venv is missing; run scripts/bootstrap.sh first" >&2
  exit 2
fi

PY=${EXASERVE_PYTHON:-python3}
venv=${EXASERVE_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/exaserve/venv-sglang}
mkdir -p "$(dirname "$venv")"
# One build at a time (test runs, of this checkout or another, may start together): a lock beside the venv.
exec 9>"$venv.lock"
flock 9

lock=scripts/sglang-manifest-requirements.txt
stamp=$venv/.exaserve-installed
want=$({ cat "$lock"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "sglang-manifest: building $venv from $lock" >&2
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-deps --only-binary=:all: -r "$lock"
  echo "$want" >"$stamp"
fi
if ((venv_only)); then
  exit 0
fi
# A clean environment: SGLANG_* variables change the parser (e.g. extra choices).
run_clean() { env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="${HOME:-/root}" LC_ALL=C.UTF-8 "$@"; }
run_clean "$venv/bin/python" scripts/argparse_flags.py dump server --out-dir "$out_dir"
run_clean .venv/bin/python scripts/argparse_flags.py dump router --out-dir "$out_dir"
