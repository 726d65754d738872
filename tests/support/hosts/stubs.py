"""Stub `nvidia-smi`, `ibstat` and `chronyc` for the SSH test hosts.

This machine has no GPU, no InfiniBand HCA and no NTP server, so these three tools are the one
stand-in of the test hosts. Each stub is a /bin/sh script that prints a real recorded output from
tests/data/probes (see the README there for where each came from), with the host's faults applied
by the pure functions below; any argument list that was not recorded fails loudly (rc 2) instead
of printing something made up.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import REPO

from .faults import STUBBED_TOOLS, HostFaults

DATA_DIR = REPO / "tests" / "data" / "probes"

IBSTAT_SAMPLE = "ibstat_h100_node.txt"
CHRONY_TEXT_SAMPLE = "chronyc_tracking_manpage.txt"
CHRONY_CSV_SAMPLE = "chronyc_tracking_manpage.csv"
CHRONY_UNSYNC_TEXT = "chronyc_tracking_unsynchronised.txt"
CHRONY_UNSYNC_CSV = "chronyc_tracking_unsynchronised.csv"
CHRONY_NO_DAEMON = "chronyc_no_daemon.txt"
NVIDIA_TABLE_SAMPLE = "nvidia_smi_query_h100x8.csv"
NVIDIA_BANNER_SAMPLE = "nvidia_smi_h100x8.txt"
NVIDIA_NO_DRIVER = "nvidia_smi_no_driver.txt"

# The nvidia-smi invocations the stub answers: the module's query and the source's preflight one.
MODULE_QUERY_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version")
SOURCE_QUERY_FIELDS = ("index", "name", "memory.total", "memory.used")
_HEREDOC_END = "__EXASERVE_STUB_EOF__"


@dataclass(frozen=True)
class Reply:
    """What one stub invocation prints and returns."""

    stdout: str
    rc: int = 0
    stderr: str = ""


def sample(name: str) -> str:
    """The text of one recorded sample in tests/data/probes."""
    return (DATA_DIR / name).read_text(encoding="utf-8")


# --- ibstat -----------------------------------------------------------------------------------


def ibstat_with_faults(
    text: str,
    *,
    down: Collection[str] = (),
    rate_gbps: int | None = None,
    port_rates: Collection[tuple[str, int, int]] = (),
) -> str:
    """`ibstat` output with the ports of the CAs in `down` Down (Physical state Polling, Rate 10,
    as an unplugged port reports), every other InfiniBand port at `rate_gbps`, and each
    `(ca, port, gbps)` of `port_rates` at its own rate (that one port only)."""
    lines = text.splitlines(keepends=True)
    context: list[tuple[str, str]] = []  # (ca, port) of each line
    link_layer: dict[tuple[str, str], str] = {}
    ca = port = ""
    for line in lines:
        stripped = line.strip()
        header = re.match(r"^CA '([^']+)'$", stripped)
        if header:
            ca, port = header.group(1), ""
        elif re.match(r"^Port \d+:$", stripped):
            port = stripped
        elif stripped.startswith("Link layer:"):
            link_layer[(ca, port)] = stripped.partition(":")[2].strip()
        context.append((ca, port))
    unknown = sorted(set(down) - {c for c, _ in context})
    if unknown:
        raise ValueError(f"ib_down={unknown}: the sample has no such CA")
    one_port = {(ca, f"Port {port}:"): gbps for ca, port, gbps in port_rates}
    absent = sorted(key for key in one_port if key not in link_layer)
    if absent:
        raise ValueError(f"ib_port_rates names {absent}: the sample has no such CA port")
    out = []
    for line, (line_ca, line_port) in zip(lines, context, strict=True):
        indent, label = line[: len(line) - len(line.lstrip())], line.strip().partition(":")[0]
        if line_port and line_ca in down and label in ("State", "Physical state", "Rate"):
            value = {"State": "Down", "Physical state": "Polling", "Rate": "10"}[label]
            out.append(f"{indent}{label}: {value}\n")
        elif label == "Rate" and (line_ca, line_port) in one_port:
            out.append(f"{indent}Rate: {one_port[(line_ca, line_port)]}\n")
        elif (
            line_port
            and label == "Rate"
            and rate_gbps is not None
            and link_layer.get((line_ca, line_port)) == "InfiniBand"
        ):
            out.append(f"{indent}Rate: {rate_gbps}\n")
        else:
            out.append(line)
    return "".join(out)


# --- chronyc ----------------------------------------------------------------------------------


def chronyc_text_with_offset(text: str, offset_s: float) -> str:
    """`chronyc tracking` with the System time line set to `offset_s` (clock minus NTP time);
    chronyc prints the magnitude with "fast" (ahead, or zero) or "slow" (behind)."""
    direction = "slow" if offset_s < 0 else "fast"
    line = f"System time     : {abs(offset_s):.9f} seconds {direction} of NTP time"
    new, count = re.subn(r"(?m)^System time     : .*$", line, text)
    if count != 1:
        raise ValueError("sample has no 'System time' line")
    return new


def chronyc_csv_with_offset(text: str, offset_s: float) -> str:
    """`chronyc -c tracking` with field 5 set for `offset_s`: chronyc prints the correction it
    would apply, i.e. NTP time minus clock (positive when the clock is slow)."""
    cells = text.rstrip("\n").split(",")
    if len(cells) != 14:
        raise ValueError(f"expected 14 CSV fields, got {len(cells)}")
    cells[4] = f"{-offset_s + 0.0:.9f}"
    return ",".join(cells) + "\n"


# --- nvidia-smi -------------------------------------------------------------------------------


def nvidia_query(
    table: str,
    fields: Sequence[str],
    *,
    header: bool,
    units: bool,
    gpu_count: int | None = None,
    memory_used_mib: int | None = None,
    driver_version: str | None = None,
) -> str:
    """`nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]` rendered from a recorded
    query `table` (header with units, values with units) that holds every field asked for."""
    if header and not units:
        raise ValueError("the stub records csv (header, units) and csv,noheader[,nounits] only")
    rows = [line.split(", ") for line in table.splitlines() if line.strip()]
    columns = [re.sub(r" \[[^\]]+\]$", "", cell) for cell in rows[0]]
    header_cells = dict(zip(columns, rows[0], strict=True))
    missing = [field for field in fields if field not in columns]
    if missing:
        raise ValueError(f"the recorded table has no column {missing}; it has {columns}")
    gpus = [
        dict(zip(columns, row, strict=True))
        for row in rows[1 : 1 + (gpu_count if gpu_count is not None else len(rows))]
    ]
    for gpu in gpus:
        if memory_used_mib is not None:
            gpu["memory.used"] = f"{memory_used_mib} MiB"
        if driver_version is not None:
            gpu["driver_version"] = driver_version
    out = [", ".join(header_cells[field] for field in fields)] if header else []
    for gpu in gpus:
        cells = [gpu[field] for field in fields]
        if not units:
            cells = [re.sub(r" (MiB|%|W|MHz)$", "", cell) for cell in cells]
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def nvidia_banner(
    text: str,
    *,
    gpu_count: int | None = None,
    memory_used_mib: int | None = None,
    driver_version: str | None = None,
    cuda_version: str | None = None,
) -> str:
    """The plain `nvidia-smi` summary with the first `gpu_count` GPU blocks kept and the driver,
    CUDA version and used memory replaced at the widths nvidia-smi prints them."""
    lines = text.splitlines()
    version = re.compile(r"^\| NVIDIA-SMI (\S+)\s+Driver Version: (\S+)\s+CUDA Version: (\S+)\s+\|$")
    for i, line in enumerate(lines):
        match = version.match(line)
        if match:
            driver = driver_version or match.group(2)
            cuda = cuda_version or match.group(3)
            lines[i] = f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|"
    first = next(i for i, line in enumerate(lines) if line.startswith("|====")) + 1
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith(("|", "+")))
    blocks = [lines[i : i + 4] for i in range(first, end, 4)]
    if gpu_count is not None:
        blocks = blocks[:gpu_count]
    if memory_used_mib is not None:
        for block in blocks:
            block[1] = re.sub(r" +\d+MiB /", lambda m: f"{memory_used_mib}MiB /".rjust(len(m.group(0))), block[1])
    kept = [line for block in blocks for line in block]
    return "\n".join(lines[:first] + kept + lines[end:]) + "\n"


# --- the stub scripts -------------------------------------------------------------------------


def shell_stub(tool: str, replies: Mapping[str, Reply], note: str) -> str:
    """A /bin/sh script that answers each recorded argument string (`"$*"`) with its reply."""
    script = ["#!/bin/sh", f"# ExaServe test stub for {tool}: {note}", "# Not the real tool.", 'case "$*" in']
    for args, reply in replies.items():
        if "'" in args:
            raise ValueError(f"argument string {args!r} must not contain a single quote")
        script.append(f"'{args}')")
        for stream, text in (("", reply.stdout), (" >&2", reply.stderr)):
            if not text:
                continue
            if not text.endswith("\n") or f"\n{_HEREDOC_END}\n" in f"\n{text}":
                raise ValueError(f"{tool} {args!r}: output must end with a newline and not hold the delimiter")
            script += [f"cat{stream} <<'{_HEREDOC_END}'", text.rstrip("\n"), _HEREDOC_END]
        script.append(f"exit {reply.rc} ;;")
    script += [
        "*)",
        f'echo "{tool} (ExaServe test stub): no recorded output for arguments: $*" >&2',
        "exit 2 ;;",
        "esac",
    ]
    return "\n".join(script) + "\n"


def hanging_stub(tool: str, note: str) -> str:
    """A /bin/sh script that never answers, whatever its arguments: it becomes `sleep` (so killing
    the tool's process ends it), like nvidia-smi on a wedged GPU or chronyc on a stuck socket."""
    return f"#!/bin/sh\n# ExaServe test stub for {tool}: {note}\n# Not the real tool: it hangs.\nexec sleep 86400\n"


def _query_args(fields: Sequence[str], fmt: str) -> str:
    return f"--query-gpu={','.join(fields)} --format={fmt}"


def nvidia_smi_replies(faults: HostFaults) -> dict[str, Reply]:
    """Every recorded `nvidia-smi` invocation for a host with `faults`."""
    invocations = {
        "": None,
        _query_args(MODULE_QUERY_FIELDS, "csv,noheader,nounits"): (MODULE_QUERY_FIELDS, False, False),
        _query_args(MODULE_QUERY_FIELDS, "csv"): (MODULE_QUERY_FIELDS, True, True),
        _query_args(SOURCE_QUERY_FIELDS, "csv"): (SOURCE_QUERY_FIELDS, True, True),
    }
    if faults.nvidia_driver_failed:
        return {args: Reply(sample(NVIDIA_NO_DRIVER), rc=9) for args in invocations}
    if faults.gpu_count == 0:
        return {args: Reply("No devices were found\n", rc=6) for args in invocations}
    changes = {"gpu_count": faults.gpu_count, "memory_used_mib": faults.gpu_memory_used_mib}
    replies = {}
    for args, query in invocations.items():
        if query is None:
            text = nvidia_banner(
                sample(NVIDIA_BANNER_SAMPLE),
                driver_version=faults.driver_version,
                cuda_version=faults.cuda_version,
                **changes,
            )
        else:
            fields, header, units = query
            text = nvidia_query(
                sample(NVIDIA_TABLE_SAMPLE),
                fields,
                header=header,
                units=units,
                driver_version=faults.driver_version,
                **changes,
            )
        replies[args] = Reply(text)
    return replies


def ibstat_replies(faults: HostFaults) -> dict[str, Reply]:
    """Every recorded `ibstat` invocation for a host with `faults`."""
    text = ibstat_with_faults(
        sample(IBSTAT_SAMPLE), down=faults.ib_down, rate_gbps=faults.ib_rate_gbps, port_rates=faults.ib_port_rates
    )
    return {"": Reply(text)}


def chronyc_replies(faults: HostFaults) -> dict[str, Reply]:
    """Every recorded `chronyc` invocation for a host with `faults`."""
    if faults.chrony == "stopped":
        # chronyc prints this on stdout and exits 1 when no chronyd answers.
        no_daemon = Reply(sample(CHRONY_NO_DAEMON), rc=1)
        return {"tracking": no_daemon, "-c tracking": no_daemon}
    if faults.chrony == "unsynchronised":
        return {"tracking": Reply(sample(CHRONY_UNSYNC_TEXT)), "-c tracking": Reply(sample(CHRONY_UNSYNC_CSV))}
    text, csv = sample(CHRONY_TEXT_SAMPLE), sample(CHRONY_CSV_SAMPLE)
    if faults.clock_offset_s is not None:
        text = chronyc_text_with_offset(text, faults.clock_offset_s)
        csv = chronyc_csv_with_offset(csv, faults.clock_offset_s)
    return {"tracking": Reply(text), "-c tracking": Reply(csv)}


def write_stubs(directory: Path, node: str, faults: HostFaults) -> None:
    """Write the stub tools of one host into `directory` (bind-mounted over /usr/local/sbin)."""
    directory.mkdir(parents=True, exist_ok=True)
    makers = {"nvidia-smi": nvidia_smi_replies, "ibstat": ibstat_replies, "chronyc": chronyc_replies}
    assert set(makers) == set(STUBBED_TOOLS)
    for tool, make in makers.items():
        if tool in faults.missing_tools:
            continue
        path = directory / tool
        note = f"host {node}, faults: {faults.describe()}"
        path.write_text(hanging_stub(tool, note) if tool in faults.hangs else shell_stub(tool, make(faults), note))
        path.chmod(0o755)
