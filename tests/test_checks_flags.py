"""The pinned SGLang flag manifests and the strict command-line check built on them.

Everything here runs against the REAL parsers: the manifests are regenerated from
``sglang.srt.server_args.ServerArgs.add_cli_args`` (in the throwaway SGLang venv, ``~/.cache/exaserve/venv-sglang``, that
``scripts/sglang-manifest.sh`` builds, about a minute the first time) and from the installed
``smg`` (the gateway), and ``validate_argv`` is checked flag by flag against what those parsers accept. Each
problem is a failing check result (serving.result): ``check`` the ProblemKind, ``subject`` the flag.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from smg.launch_router import parse_router_args

from serving.flags import (
    DATA_DIR,
    FlagManifest,
    FlagSpec,
    FlagValidationError,
    ManifestError,
    ProblemKind,
    check_argv,
    load_manifest,
    load_router_manifest,
    load_server_manifest,
    validate_argv,
)
from serving.result import Status
from tests.support.sglang_parsers import real_parse

ROOT = Path(__file__).resolve().parent.parent
# What argparse lets through although our check rejects it; every other kind argparse rejects too.
LENIENT_IN_ARGPARSE = {
    ProblemKind.ABBREVIATED_FLAG,
    ProblemKind.REPEATED_FLAG,
    ProblemKind.DEPRECATED_FLAG,
    ProblemKind.EXITS,
}

SERVER_ARGV = [
    "--model-path",
    "/models/llama-3.1-70b",
    "--served-model-name",
    "llama-70b",
    "--host",
    "0.0.0.0",
    "--port",
    "30000",
    "--tp-size",
    "8",
    "--pp-size",
    "2",
    "--dp-size",
    "1",
    "--nnodes",
    "2",
    "--node-rank",
    "1",
    "--dist-init-addr",
    "10.0.0.1:5000",
    "--mem-fraction-static",
    "0.85",
    "--max-total-tokens",
    "4Ki",
    "--max-running-requests",
    "256",
    "--chunked-prefill-size",
    "8192",
    "--context-length",
    "131072",
    "--dtype",
    "bfloat16",
    "--enable-metrics",
    "--watchdog-timeout",
    "300",
]
ROUTER_ARGV = [
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
    "--worker-urls",
    "http://10.0.0.1:30000",
    "http://10.0.0.2:30000",
    "--policy",
    "cache_aware",
    "--prometheus-host",
    "127.0.0.1",
    "--prometheus-port",
    "29000",
    "--health-check-interval-secs",
    "5",
    "--health-check-timeout-secs",
    "3",
    "--health-failure-threshold",
    "3",
    "--health-success-threshold",
    "2",
    "--log-level",
    "warn",
]


@pytest.fixture(scope="session")
def server() -> FlagManifest:
    return load_server_manifest()


@pytest.fixture(scope="session")
def router() -> FlagManifest:
    return load_router_manifest()


def kinds(argv: list[str], manifest: FlagManifest) -> list[str]:
    return [p.check for p in validate_argv(argv, manifest)]


# --- the committed manifests are what the real parsers say -----------------------------------------


@pytest.mark.slow
def test_committed_manifests_match_the_real_parsers(regenerated: Path) -> None:
    """Regenerates both manifests from the real parsers; any difference means the pin and the data drifted."""
    fresh = {p.name: p.read_text() for p in regenerated.glob("*.json")}
    committed = {p.name: p.read_text() for p in DATA_DIR.glob("*-flags.json")}
    assert sorted(fresh) == sorted(committed), (
        f"manifest files differ: regenerated {sorted(fresh)}, committed {sorted(committed)}; "
        "run scripts/sglang-manifest.sh and review the diff (docs/sglang-version-bump.md)"
    )
    for name, text in fresh.items():
        diff = "".join(
            difflib.unified_diff(
                committed[name].splitlines(True), text.splitlines(True), f"committed/{name}", f"regenerated/{name}", n=2
            )
        )
        assert not diff, (
            f"{name} no longer matches the real parser:\n{diff[:6000]}\n"
            "Run scripts/sglang-manifest.sh and review the diff (docs/sglang-version-bump.md)."
        )


def test_manifests_record_the_pinned_versions(server: FlagManifest, router: FlagManifest) -> None:
    lock = (ROOT / "scripts" / "sglang-manifest-requirements.txt").read_text()
    pinned = re.search(r"^sglang==(\S+)$", lock, re.MULTILINE)
    assert pinned, "scripts/sglang-manifest-requirements.txt must pin sglang==VERSION"
    assert server.version == pinned.group(1)
    assert (server.package, router.package) == ("sglang", "smg")
    assert router.version == version("smg")
    assert server.allow_abbrev and router.allow_abbrev  # why abbreviations must be caught here
    for flag in (
        "--model-path",
        "--tp-size",
        "--pp-size",
        "--dp-size",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--mem-fraction-static",
        "--enable-metrics",
        "--watchdog-timeout",
    ):
        assert flag in server.flags
    assert server.flags["--tp-size"].option_strings == ("--tp-size", "--tensor-parallel-size")
    assert server.flags["--model-path"].required


# --- validate_argv on hand-written command lines ------------------------------------------------------


def test_good_server_and_router_argv_pass(server: FlagManifest, router: FlagManifest) -> None:
    assert validate_argv(SERVER_ARGV, server) == []
    assert validate_argv(ROUTER_ARGV, router) == []
    check_argv(SERVER_ARGV, server)
    check_argv(ROUTER_ARGV, router)


def test_unknown_flag_names_the_flag_the_version_and_the_closest_flag(server: FlagManifest) -> None:
    [problem] = validate_argv(["--model-path", "/m", "--tp-sise", "2"], server)
    assert (problem.check, problem.status, problem.subject) == (ProblemKind.UNKNOWN_FLAG, Status.FAIL, "--tp-sise")
    assert (
        problem.observed
        == f"Got unknown flag '--tp-sise' (value '2') for sglang {server.version}: the pinned parser has no such flag"
    )
    assert problem.expected == f"a flag of sglang {server.version}"
    assert problem.fix is not None and problem.fix.startswith("Did you mean '--tp-size'")


def test_unknown_flag_with_nothing_close_points_at_the_version_bump(server: FlagManifest) -> None:
    [problem] = validate_argv(["--model-path", "/m", "--zzzzzz"], server)
    assert problem.check == ProblemKind.UNKNOWN_FLAG
    assert "docs/sglang-version-bump.md" in (problem.fix or "")


def test_abbreviation_is_rejected_naming_the_full_flag(server: FlagManifest) -> None:
    [problem] = validate_argv(["--model-path", "/m", "--tp", "2"], server)
    assert problem.check == ProblemKind.ABBREVIATED_FLAG
    assert "'--tp'" in problem.message and "Write the full flag '--tp-size'" in problem.message
    assert f"sglang {server.version}" in problem.message


def test_abbreviation_still_gets_its_value_checked(server: FlagManifest) -> None:
    assert kinds(["--model-path", "/m", "--tp", "two"], server) == [ProblemKind.ABBREVIATED_FLAG, ProblemKind.BAD_TYPE]


def test_ambiguous_prefix_lists_the_candidates(server: FlagManifest) -> None:
    [problem] = validate_argv(["--model-path", "/m", "--enable-metric"], server)
    assert problem.check == ProblemKind.AMBIGUOUS_FLAG
    assert "'--enable-metrics'" in problem.message


@pytest.mark.parametrize(
    ("argv", "kind", "flag", "value", "fragment"),
    [
        (["--tp-size", "two"], ProblemKind.BAD_TYPE, "--tp-size", "two", "(expected an integer, its default is 1)"),
        (["--mem-fraction-static", "high"], ProblemKind.BAD_TYPE, "--mem-fraction-static", "high", "a number"),
        (["--max-total-tokens", "1.5Ki"], ProblemKind.BAD_TYPE, "--max-total-tokens", "1.5Ki", "IEC"),
        (["--cuda-graph-config", "[1]"], ProblemKind.BAD_TYPE, "--cuda-graph-config", "[1]", "JSON object"),
        (["--dtype", "bf16"], ProblemKind.BAD_CHOICE, "--dtype", "bf16", "'bfloat16'"),
        (["--log-requests-level", "7"], ProblemKind.BAD_CHOICE, "--log-requests-level", "7", "'3'"),
        (
            ["--enable-metrics=true"],
            ProblemKind.UNEXPECTED_VALUE,
            "--enable-metrics",
            "true",
            "Write '--enable-metrics' alone",
        ),
        (
            ["--enable-tf32-matmul=1"],
            ProblemKind.UNEXPECTED_VALUE,
            "--enable-tf32-matmul",
            "1",
            "'--no-enable-tf32-matmul' for the opposite",
        ),
        (["--enable-metrics", "true"], ProblemKind.STRAY_VALUE, "--enable-metrics", "true", "takes no further value"),
        (["--served-model-name"], ProblemKind.MISSING_VALUE, "--served-model-name", None, "it takes one value"),
        (
            ["--served-model-name", "-x"],
            ProblemKind.MISSING_VALUE,
            "--served-model-name",
            None,
            "'--served-model-name=VALUE'",
        ),
        (
            ["--tp-size", "2", "--tensor-parallel-size", "4"],
            ProblemKind.REPEATED_FLAG,
            "--tp-size",
            None,
            "'--tp-size 2', '--tensor-parallel-size 4'",
        ),
        (["--enable-dp-attention"], ProblemKind.DEPRECATED_FLAG, "--enable-dp-attention", None, "--attn-dp-size"),
        (["--help"], ProblemKind.EXITS, "--help", None, "never start"),
    ],
)
def test_server_problem(
    server: FlagManifest, argv: list[str], kind: ProblemKind, flag: str, value: str | None, fragment: str
) -> None:
    problems = validate_argv(["--model-path", "/m", *argv], server)
    assert [(p.check, p.subject) for p in problems if p.check != ProblemKind.UNKNOWN_FLAG] == [(kind, flag)]
    assert value is None or f"'{value}'" in problems[0].observed
    assert fragment in problems[0].message
    assert f"sglang {server.version}" in problems[0].message


def test_missing_required_flag_and_a_double_dash(server: FlagManifest) -> None:
    problems = validate_argv(["--tp-size", "2", "--", "x"], server)
    assert [(p.check, p.subject) for p in problems] == [
        (ProblemKind.STRAY_VALUE, "--tp-size"),
        (ProblemKind.STRAY_VALUE, "--tp-size"),
        (ProblemKind.MISSING_REQUIRED, "--model-path"),
    ]
    assert problems[0].observed.startswith("Got stray value '--' at position 2")
    assert problems[1].observed.startswith("Got stray value 'x' at position 3")
    assert "'--model-path' (or '--model')" in problems[-1].message


def test_router_problems(router: FlagManifest) -> None:
    problems = validate_argv(
        [
            "--worker-urls",
            "http://a:1",
            "--policy",
            "cache_awar",
            "--decode",
            "u",
            "v",
            "--prefill",
            "p",
            "9000",
            "--prefill",
            "q",
        ],
        router,
    )
    assert [(p.check, p.subject) for p in problems] == [
        (ProblemKind.BAD_CHOICE, "--policy"),
        (ProblemKind.STRAY_VALUE, "--decode"),
    ]
    assert "'cache_awar'" in problems[0].observed and "'v'" in problems[1].observed
    assert "Did you mean 'cache_aware'?" in problems[0].message
    assert f"smg {router.version}" in problems[0].message


def test_check_argv_raises_listing_every_problem(server: FlagManifest) -> None:
    argv = ["--model-path", "/m", "--tp", "2", "--dtype", "bf16", "--bogus-flag"]
    with pytest.raises(FlagValidationError) as caught:
        check_argv(argv, server)
    assert [r.check for r in caught.value.results] == [
        ProblemKind.ABBREVIATED_FLAG,
        ProblemKind.BAD_CHOICE,
        ProblemKind.UNKNOWN_FLAG,
    ]
    text = str(caught.value)
    assert text.startswith(f"3 problem(s) in the command line for sglang {server.version}:")
    for result in caught.value.results:
        assert f"  - {result.message}" in text


def test_a_single_string_is_refused(server: FlagManifest) -> None:
    with pytest.raises(TypeError, match="split it first"):
        validate_argv("--model-path /m", server)


# --- manifest loading ---------------------------------------------------------------------------------


def test_a_manifest_with_an_unchecked_value_type_does_not_load(tmp_path: Path) -> None:
    data = json.loads(next(DATA_DIR.glob("smg-*-flags.json")).read_text())
    data["flags"]["--port"]["type"] = "some.module.parse_port"
    bad = tmp_path / "router.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"--port \(type some\.module\.parse_port\).*_VALUE_TYPES"):
        load_manifest(bad)


def test_a_missing_manifest_says_how_to_regenerate(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"scripts/sglang-manifest\.sh"):
        load_manifest(tmp_path / "nope.json")


# --- agreement with the real parsers, flag by flag ----------------------------------------------------


def sample_values(spec: FlagSpec) -> list[str]:
    """Values the flag's real parser accepts, as many as its nargs asks for."""
    if spec.nargs == 0:
        return []
    if spec.choices:
        one = str(spec.choices[0])
    else:
        one = {
            "int": "3",
            "float": "0.5",
            "json.loads": "{}",
            "sglang.srt.utils.common.json_list_type": "[]",
            "sglang.srt.utils.common.human_readable_int": "4k",
            "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": "{}",
        }.get(str(spec.type), "x")
    return [one] * (spec.nargs if isinstance(spec.nargs, int) else 1)


def bad_value(spec: FlagSpec) -> str | None:
    """A value the real parser rejects, or None when it takes any string."""
    if spec.choices or spec.type not in (None, "str", "sglang.srt.utils.common.nullable_str"):
        return "{not-valid"
    return None


def differential_cases(manifest: FlagManifest, base: list[str]) -> Iterator[list[str]]:
    """For every flag: a good use, a bad value, a value on a switch, a missing value; plus argparse quirks."""
    for name, spec in manifest.flags.items():
        if spec.action in ("help", "version"):
            continue
        yield [*base, name, *sample_values(spec)]
        bad = bad_value(spec)
        if spec.nargs == 0:
            yield [*base, f"{name}=1"]
        elif bad is not None:
            yield [*base, name, bad]
        if spec.nargs in (None, "+") or isinstance(spec.nargs, int):
            yield [*base, name]
    yield [*base, "--tp", "2"]
    yield [*base, "--tp-size", "2", "--tp-size", "4"]
    yield [*base, "--enable-metric"]
    yield [*base, "--no-such-flag", "1"]
    yield [*base, "stray"]
    yield [*base, "--max-running-requests", "-1"]
    yield ["--tp-size", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["server", "router"])
def test_validate_argv_agrees_with_the_real_parser_on_every_flag(
    kind: str, regenerated: Path, server: FlagManifest, router: FlagManifest
) -> None:
    """The real parser accepts an argv exactly when our check finds nothing argparse itself would reject."""
    manifest, base = (server, ["--model-path", "/m"]) if kind == "server" else (router, [])
    cases = list(differential_cases(manifest, base))
    disagreements = []
    for argv, real in zip(cases, real_parse(kind, cases), strict=True):
        problems = validate_argv(argv, manifest)
        strict_only = all(p.check in LENIENT_IN_ARGPARSE for p in problems)
        if real["ok"] != strict_only:
            disagreements.append(
                f"{argv[len(base) :]}: real parser ok={real['ok']} {real['error']!r:.200}; "
                f"ours {[str(p.check) for p in problems]}"
            )
    assert len(cases) > 3 * len(manifest.flags) // 2
    assert not disagreements, "\n".join(disagreements[:30])


@pytest.mark.slow
def test_argparse_silently_accepts_what_we_reject(regenerated: Path, server: FlagManifest) -> None:
    """Why the check exists: the real parser takes '--tp 2' and a repeated flag without a word."""
    argvs = [["--model-path", "/m", "--tp", "2"], ["--model-path", "/m", "--tp-size", "2", "--tp-size", "4"]]
    assert [r["ok"] for r in real_parse("server", argvs)] == [True, True]
    assert [kinds(a, server) for a in argvs] == [[ProblemKind.ABBREVIATED_FLAG], [ProblemKind.REPEATED_FLAG]]


def test_the_real_router_launcher_parses_a_valid_router_argv(router: FlagManifest) -> None:
    """smg.launch_router.parse_router_args, the function `python -m smg.launch_router` runs."""
    assert validate_argv(ROUTER_ARGV, router) == []
    args = parse_router_args(ROUTER_ARGV)
    assert args.worker_urls == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    assert (args.policy, args.port, args.prometheus_port) == ("cache_aware", 8000, 29000)
    assert (args.health_check_interval_secs, args.health_success_threshold) == (5, 2)


def test_the_real_router_launcher_rejects_what_we_reject(
    router: FlagManifest, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*ROUTER_ARGV, "--health-failure-threshold", "three"]
    assert kinds(argv, router) == [ProblemKind.BAD_TYPE, ProblemKind.REPEATED_FLAG]
    with pytest.raises(SystemExit) as exited:
        parse_router_args(argv)
    assert exited.value.code == 2
    assert "--health-failure-threshold" in capsys.readouterr().err
