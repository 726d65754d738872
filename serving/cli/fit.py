"""``exaserve fit``: every layout that serves a model on the cluster, ranked, by SGLang's memory arithmetic."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from serving.cli.options import (
    DEFAULT_STACK,
    EXIT_PROBLEM,
    JsonOpt,
    OutputOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    fail,
    print_table,
    require_file,
    resolve_stack,
)
from serving.plan import calibration, planner
from serving.plan.fit import ONLINE_FP8, WEIGHT_BYTES, Layout, enumerate_layouts
from serving.plan.model import CapacityChain
from serving.plan.weights import FP8_CHECKPOINT
from serving.spec.checkpoint import CheckpointError, read_checkpoint
from serving.spec.schema import GIB, Architecture, architecture_from_hf_config
from serving.spec.stack import NAMESPACE, SpecError, load_stack_file, read_stack_document

QUANTIZATION = {"bf16": None, "fp8": "fp8", ONLINE_FP8: "fp8", "int8": "w8a8_int8", "int4": "awq"}
"""SGLang's ``--quantization`` for a precision, where the checkpoint's own method does not name it."""
CHECKPOINT_PRECISION = {"fp8": "fp8", "awq": "int4", "gptq": "int4", "w8a8_int8": "int8"}
"""A quantised checkpoint's precision by its config.json ``quantization_config.quant_method``: the methods SGLang
0.5.23 registers under these names (``layers/quantization/__init__.py``) that the spec can name. SGLang refuses a
``--quantization`` other than the checkpoint's method (``configs/model_config.py:2143``), so ``fit`` searches that
precision alone and writes the checkpoint's method."""


def _quantization(lay: Layout, arch: Architecture) -> str | None:
    """The ``--quantization`` a layout runs with: the checkpoint's own method where the layout keeps its precision."""
    method = arch.quant_method
    if method is not None and CHECKPOINT_PRECISION.get(method) == lay.precision:
        return method
    return QUANTIZATION[lay.precision]


STACK_PRECISION = {ONLINE_FP8: "fp8"}
"""``model.precision`` of a written layout where it differs from fit's label: online FP8 serves FP8 weights."""


def _architecture(path: Path, params: int | None) -> Architecture:
    """The model's architecture, its checkpoint's quantisation method among it (None: a 16-bit checkpoint)."""
    try:
        cfg = json.loads(path.read_text())
        if not isinstance(cfg, dict):
            raise ValueError("it does not hold a JSON object")
        fields = architecture_from_hf_config(cfg, str(path))
        if params is not None:
            fields["parameter_count"] = params
        elif "parameter_count" not in fields:
            fail(
                f"--hf-config {path}: the parameter count cannot be counted from it (a layer shape such as "
                "intermediate_size is missing); give it with --params"
            )
        return Architecture.model_validate(fields)
    except (ValueError, ValidationError) as exc:
        fail(f"--hf-config {path} is not a transformer config.json ({exc}); point it at the model's config.json")


def _layout_json(lay: Layout, rps: float, arch: Architecture) -> dict[str, Any]:
    return {
        "precision": lay.precision,
        "quantization": _quantization(lay, arch),
        "online_quantization": lay.online,
        "kv_cache_dtype": lay.kv_cache_dtype,
        "tp": lay.tp,
        "pp": lay.pp,
        "attn_dp": lay.attn_dp,
        "gpus_per_replica": lay.gpus_per_replica,
        "replicas": lay.replicas,
        "replicas_per_node": lay.replicas_per_node,
        "nodes_per_replica": lay.nodes_per_replica,
        "mem_fraction_static": lay.mem_fraction_static,
        "weights_bytes_per_gpu": lay.weights_per_gpu,
        "load_peak_bytes_per_gpu": lay.load_peak_per_gpu,
        "kv_pool_tokens_per_replica": lay.kv_pool_tokens,
        "kv_pools_per_replica": lay.attn_dp,
        "sequences_per_replica": lay.sequences_per_replica,
        "served_sequences": lay.served_sequences,
        "requests_per_second": round(rps, 3),
        "ep": lay.ep,
        "decode_step_s": lay.step.seconds,
        "decode_step_bound": lay.step.bound,
        "output_tokens_per_second": round(lay.tokens_per_s, 1),
        "rank_reason": lay.rank_reason,
        "breakdown": lay.breakdown,
    }


def _dp(lay: Layout) -> str:
    """A layout's attention DP and EP, as the table and the written stack's header name them (empty without)."""
    return (f" (attention DP {lay.attn_dp})" if lay.attn_dp > 1 else "") + (f" EP {lay.ep}" if lay.ep > 1 else "")


def _null(representer: Any, _: None) -> Any:
    """``null`` spelled out (ruamel's round trip writes an empty value), as the stack files write it."""
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def _write_stack(
    out: Path,
    base: Path,
    lay: Layout,
    hf_config: Path,
    arch: Architecture,
    gpu: str,
    checkpoint: Path | None,
    limits: dict[str, int],
) -> None:
    """The chosen layout written over the base stack's model, parallelism, serving and GPU product, and the
    ``limits`` it was ranked at where given on the command line (``--context-length``, ``--max-running-requests``).
    The base file is edited round-trip (ruamel.yaml), so its comments, key order and quoting stay; only the fields
    set here change."""
    read_stack_document(base)  # a base that is no stack file fails here, naming the file and the fix
    rt = YAML()  # round-trip: a CommentedMap keeps each comment beside its key
    rt.preserve_quotes, rt.width = True, 4096  # the base's quoting; never fold a long value onto a second line
    rt.indent(mapping=2, sequence=4, offset=2)  # the stack files' layout: a list's dash indented under its key
    rt.representer.add_representer(type(None), _null)
    # everything else of the base stays as it is, as `pulumi stack init --copy-config-from` copies a stack's config:
    # other namespaces' keys, and the secrets provider their `secure:` values are encrypted for
    raw = rt.load(base.read_text(encoding="utf-8"))
    config = raw["config"]

    def section(name: str, parent: Any = config) -> Any:
        key = name if parent is not config else f"{NAMESPACE}:{name}"
        if not isinstance(parent.get(key), dict):
            parent[key] = CommentedMap()
        return parent[key]

    model = section("model")
    for key in ("checkpoint", "checkpoint_weights"):  # the layout was counted from this checkpoint, or none
        model.pop(key, None)
    if checkpoint is not None:
        model["checkpoint"] = os.path.relpath(checkpoint.resolve(), out.resolve().parent)
    model.update(
        # relative to the written file, as the stack loader reads it: the file moves with its checkout
        hf_config=os.path.relpath(hf_config.resolve(), out.resolve().parent),
        precision=STACK_PRECISION.get(lay.precision, lay.precision),
        quantization=_quantization(lay, arch),
        kv_cache_dtype=lay.kv_cache_dtype,
        architecture=CommentedMap(parameter_count=arch.parameter_count),
    )
    section("parallelism").update(tp=lay.tp, pp=lay.pp, dp=1, attn_dp=lay.attn_dp, ep=lay.ep)
    section("serving").update(replicas=lay.replicas, replicas_per_node=lay.replicas_per_node)
    if limits:
        section("limits").update(limits)
    section("gpu", section("cluster"))["product"] = gpu
    text = io.StringIO()
    rt.dump(raw, text)
    out.write_text(
        f"# Written by `exaserve fit` from {base.name}: {lay.precision} TP {lay.tp} × PP {lay.pp}{_dp(lay)}"
        + (" (a 16-bit checkpoint SGLang quantises to FP8 at load)" if lay.online else "")
        + f", {lay.replicas} replicas, {lay.sequences_per_replica} sequences each.\n"
        + text.getvalue(),
        encoding="utf-8",
    )
    try:
        load_stack_file(out)
    except SpecError as exc:
        fail(f"--write-stack {out}: the written stack does not load:\n{exc}")


@app.command()
def fit(
    hf_config: Annotated[Path, typer.Option("--hf-config", help="The model's config.json.", dir_okay=False)],
    params: Annotated[
        int | None, typer.Option("--params", min=1, help="Parameter count (default: counted from config.json).")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU product (nvidia.com/gpu.product); default: the stack's.")
    ] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="Nodes; default: the stack's.")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node; default: the stack's.")
    ] = None,
    context_length: Annotated[int | None, typer.Option("--context-length", min=1)] = None,
    max_running_requests: Annotated[
        int | None,
        typer.Option(
            "--max-running-requests",
            min=1,
            help="Requests a replica runs at once (SGLang --max-running-requests): the load the layouts are ranked "
            "at. Default: the stack's limits.max_running_requests.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Target concurrent sequences across the fleet.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.0, help="Target requests per second (the capacity chain).")
    ] = None,
    precision: Annotated[
        list[str] | None,
        typer.Option(
            "--precision",
            help="Checkpoint precisions the model has (repeat): bf16, fp8 (an FP8 checkpoint), int8, int4, or "
            f"{ONLINE_FP8} (a 16-bit checkpoint SGLang quantises to FP8 as it loads it). Default: the checkpoint's own "
            "for a config.json whose quantization_config.quant_method is fp8 (fp8), awq or gptq (int4) or w8a8_int8 "
            f"(int8); bf16 and {ONLINE_FP8} for one without quantization_config.",
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint",
            help="The checkpoint's model.safetensors.index.json, .safetensors file or directory: weights are counted "
            "from its shard headers (or the index's total_size) instead of config.json.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Layouts to show.")] = 10,
    write_stack: Annotated[
        Path | None, typer.Option("--write-stack", help="Write the best layout into this stack file.", dir_okay=False)
    ] = None,
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    output: OutputOpt = "table",
    as_json: JsonOpt = False,
) -> None:
    """Enumerate the layouts (precision, KV dtype, TP, PP, attention DP, EP, replicas per node) that serve a model
    on the cluster by SGLang's memory arithmetic, ranked by the output tokens a second the fleet makes at the load
    (every replica running what --max-running-requests and its KV pool allow; a decode step's roofline, docs/planner.md).
    Exit 1 when none meets the target. The stack (default prod) gives the cluster, the limits and the base for
    --write-stack."""
    require_file(hf_config, "--hf-config", "point it at the model's config.json")
    st = resolve_stack(stack, stack_file)
    spec = st.spec
    arch = _architecture(hf_config, params)
    product = gpu or spec.cluster.gpu.product
    try:
        gpu_product = calibration.gpu_product(product)
    except calibration.UnknownGpuError as exc:
        fail(f"--gpu: {exc}")
    fp8_checkpoint = arch.fp8_checkpoint
    method = arch.quant_method
    if precision:
        precisions = tuple(precision)
    elif method is None:
        precisions = ("bf16", ONLINE_FP8)
    elif method in CHECKPOINT_PRECISION:
        precisions = (CHECKPOINT_PRECISION[method],)
    else:
        fail(
            f"--hf-config {hf_config}: quantization_config.quant_method {method!r} is not a method fit plans (it "
            f"knows {', '.join(f'{m} as {p}' for m, p in CHECKPOINT_PRECISION.items())}, and 16-bit checkpoints); "
            "give the precision of the checkpoint's weights with --precision"
        )
    unknown = sorted(set(precisions) - set(WEIGHT_BYTES))
    if unknown:
        fail(f"--precision {unknown}: not a precision; use {', '.join(WEIGHT_BYTES)}")
    if ONLINE_FP8 in precisions and fp8_checkpoint:
        fail(
            f"--precision {ONLINE_FP8}: --hf-config {hf_config} is already FP8 (quantization_config.quant_method = "
            f"{arch.quant_method!r}, {FP8_CHECKPOINT.where}); SGLang loads it as FP8 and quantises nothing. Use "
            "--precision fp8"
        )
    weights = None
    if checkpoint is not None:
        if len(precisions) != 1:
            fail(
                f"--checkpoint {checkpoint}: one checkpoint has one precision, not {list(precisions)}; give its "
                "--precision once"
            )
        try:
            weights = read_checkpoint(checkpoint)
        except CheckpointError as exc:
            fail(f"--checkpoint: {exc}")
        missing = sorted(set(range(arch.num_layers)) - set(weights.layer_indices))
        if missing:
            fail(
                f"--checkpoint {checkpoint} holds no tensors of layer {missing[0]} (of {arch.num_layers} in "
                f"--hf-config {hf_config}); point both at the same checkpoint"
            )
    n = nodes or spec.cluster.node_count
    gpn = gpus_per_node or spec.cluster.gpu.count_per_node
    lim = spec.limits
    ctx = context_length or lim.context_length
    running = max_running_requests or lim.max_running_requests
    if gpu_product.speed is None:
        fail(
            f"--gpu {gpu_product.label}: its datasheet figures (HBM bandwidth, tensor-core peaks, GPU link) are not in "
            "serving/plan/calibration.py GPU_PRODUCTS; add them as GpuSpeed with their source"
        )
    fabric = spec.cluster.fabric
    result = enumerate_layouts(
        arch,
        gpu_product,
        gpu_product.speed,
        gpn,
        n,
        ctx,
        running,
        lim.chunked_prefill_size,
        precisions,
        fabric.link_rate_gbps / 8 * max(1, len(fabric.hcas)) / gpn,
        weights,
    )
    layouts = result.layouts
    chains = [
        planner.capacity_chain(
            lay.sequences_per_replica,
            lay.replicas,
            lim.balance_efficiency,
            lim.failure_reserve,
            lim.burst_buffer,
            lim.mean_request_s,
        )
        for lay in layouts
    ]
    meets = [
        i
        for i, c in enumerate(chains)
        if (concurrency is None or c.sustained.value >= concurrency)
        and (rate is None or c.requests_per_second.value >= rate)
    ]
    ok = bool(meets)
    if write_stack is not None and ok:
        if n != spec.cluster.node_count:
            fail(f"--write-stack: --nodes {n} differs from the stack's {spec.cluster.node_count}; drop --nodes")
        if gpn != spec.cluster.gpu.count_per_node:
            fail(
                f"--write-stack: --gpus-per-node {gpn} differs from the stack's {spec.cluster.gpu.count_per_node}; "
                "drop --gpus-per-node"
            )
        chosen = layouts[meets[0]]
        if chosen.precision == "fp8" and not fp8_checkpoint:
            fail(
                f"--write-stack: the best layout is an FP8 checkpoint's, but --hf-config {hf_config} names none "
                f"(quantization_config.quant_method {arch.quant_method!r}): the stack would plan it as the 16-bit "
                f"checkpoint quantised at load. Point --hf-config at the FP8 checkpoint's config.json, or search "
                f"--precision {ONLINE_FP8}"
            )
        given = {"context_length": context_length, "max_running_requests": max_running_requests}
        _write_stack(
            write_stack,
            st.path,
            chosen,
            hf_config,
            arch,
            gpu_product.label,
            checkpoint,
            {k: v for k, v in given.items() if v is not None},
        )
    refused = f"--write-stack: no layout meets the target ({_short_of(chains, concurrency, rate)}); nothing written"
    if as_json:
        if write_stack is not None and not ok:
            fail(refused, EXIT_PROBLEM)  # the error object is the one JSON object
        emit_json(
            {
                "gpu": gpu_product.label,
                "nodes": n,
                "gpus_per_node": gpn,
                "context_length": ctx,
                "max_running_requests": running,
                "parameter_count": arch.parameter_count,
                "layouts": [
                    _layout_json(layouts[i], chains[i].requests_per_second.value, arch) for i in range(len(layouts))
                ],
                "meets_target": [
                    _layout_json(layouts[i], chains[i].requests_per_second.value, arch) for i in meets[:1]
                ],
                "excluded": [
                    {"precision": e.precision, "tp": e.tp, "pp": e.pp, "attn_dp": e.attn_dp, "reasons": list(e.reasons)}
                    for e in result.excluded
                ],
                "written": str(write_stack) if write_stack else None,
            },
            stack=st.name,
            ok=ok,
        )
    else:
        table = Table(
            title=f"{hf_config} ({arch.parameter_count / 1e9:,.1f} B params) on {n} × "
            f"{gpn} {gpu_product.label}, {ctx:,}-token context, {running:,} running requests a replica",
            title_justify="left",
        )
        for col in ("precision", "kv", "TP×PP", "replicas", "mfs", "weights/GPU", "KV tokens", "seqs/rep", "served",
                    "sustained"):  # fmt: skip
            table.add_column(col, justify="right")
        table.add_column("req/s", justify="right")
        table.add_column("step", justify="right")
        table.add_column("tok/s", justify="right")
        table.add_column("why here")
        for lay, chain in list(zip(layouts, chains, strict=True))[:top]:
            table.add_row(
                lay.precision,
                lay.kv_cache_dtype,
                f"{lay.tp}×{lay.pp}{_dp(lay)}",
                f"{lay.replicas:,}",
                f"{lay.mem_fraction_static:.3f}",
                f"{lay.weights_per_gpu / GIB:,.1f} GiB",
                f"{lay.kv_pool_tokens:,}",
                str(lay.sequences_per_replica),
                f"{lay.served_sequences:,}",
                f"{chain.sustained.value:,.0f}",
                f"{chain.requests_per_second.value:,.0f}",
                f"{lay.step.seconds * 1e3:,.1f} ms",
                f"{lay.tokens_per_s:,.0f}",
                lay.rank_reason,
            )
        print_table(table, output)
        if layouts:
            console.print(f"best: {layouts[0].breakdown}", soft_wrap=True)
        for e in result.excluded:
            console.print(
                f"excluded {e.precision} TP {e.tp}{f' × PP {e.pp}' if e.pp is not None else ''}"
                f"{' attention DP ' + str(e.attn_dp) if e.attn_dp > 1 else ''} ({e.why}): {'; '.join(e.reasons)}",
                soft_wrap=True,
            )
        console.print(
            f"[green]{len(meets)} of {len(layouts)} layouts meet the target[/]"
            if ok
            else f"[red]no layout meets the target[/]: {_short_of(chains, concurrency, rate)}",
            soft_wrap=True,
        )
        if write_stack is not None and ok:
            console.print(f"wrote {write_stack}")
    if write_stack is not None and not ok:
        fail(refused, EXIT_PROBLEM)  # after the table: the layouts are what the operator needs to choose
    if not ok:
        raise typer.Exit(EXIT_PROBLEM)


def _short_of(chains: list[CapacityChain], concurrency: int | None, rate: float | None) -> str:
    """How far the best layout is from the target: the target is met on what a layout *sustains* (served
    sequences after balance efficiency, the failure reserve and the burst buffer, limits.*), not what it serves."""
    if not chains:
        return "no layout fits the model on this cluster"
    parts = []
    if concurrency is not None:
        c = max(chains, key=lambda c: c.sustained.value)
        how = "; ".join(f.formula for f in (c.raw, c.balanced, c.after_reserve, c.sustained))
        parts.append(f"the most any layout sustains is {c.sustained.value:,.0f} concurrent sequences ({how}) < "
                     f"--concurrency {concurrency:,}")  # fmt: skip
    if rate is not None:
        top = max(c.requests_per_second.value for c in chains)
        parts.append(f"the most any serves is {top:,.0f} req/s < --rate {rate:,.0f}")
    return "; ".join(parts)
