"""The simulated worker streams as the pinned SGLang 0.5.23 does, and the load generator reads streams as a client
does (issue 39: the worker answered 400 to ``stream=true``, so no test had ever streamed).

Held against the pinned source: the chat chunks byte for byte against SGLang's own builder
(``sglang/srt/entrypoints/openai/sse_utils.py`` ``build_sse_content``, run in the SGLang venv); the ``/generate``
defaults (``incremental_streaming_output`` off: cumulative text; ``stream_interval`` 1: a chunk per output) and the
completions chunk's fields read from its source with ``ast``; the framing (``text/event-stream``, ``data: [DONE]``).
The client side: a stream read to its ``[DONE]`` is a success with its time to first token and inter-token gaps; one
that breaks off, carries an error chunk (SGLang's own mid-stream error, or smg's ``stream_error``) or ends without
``[DONE]`` is a failed request though its status is 200.
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from serving.router.loadgen import (
    BROKEN_STREAM,
    PRODUCTION_MIX,
    LoadGenerator,
    LoadReport,
    LoadSpec,
    RequestShape,
)
from serving.sandbox.worker_stream import DONE, StreamChunks
from tests.support.patience import PATIENCE_S
from tests.support.sglang_parsers import SGLANG_PYTHON
from tests.support.sglang_routes import sglang_source
from tests.support.sim_worker import make_worker


def _events(raw: bytes) -> list[Any]:
    """The data of every SSE event, ``[DONE]`` as the string."""
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[len(b"data: ") :]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
        else:
            assert block == b"", f"not an SSE data event: {block!r}"
    return out


async def _post(client: TestClient[Any, Any], path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    response = await client.post(path, json=body)
    return response.status, response.headers["Content-Type"], await response.read()


def _stream_of(tmp_path: Path, path: str, body: dict[str, Any]) -> tuple[int, str, list[Any]]:
    async def run() -> tuple[int, str, bytes]:
        async with TestClient(TestServer(make_worker(tmp_path).build_app())) as client:
            return await _post(client, path, body)

    status, kind, raw = asyncio.run(run())
    return status, kind, _events(raw)


def test_generate_streams_a_cumulative_chunk_per_output_then_done(tmp_path: Path) -> None:
    status, kind, events = _stream_of(
        tmp_path, "/generate", {"text": "hi there", "sampling_params": {"max_new_tokens": 3}, "stream": True}
    )
    assert status == 200 and kind.startswith("text/event-stream")
    *chunks, done = events
    assert done == "[DONE]" and len(chunks) == 3
    texts = [c["text"] for c in chunks]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(2)) and len(texts[2].split()) == 3  # cumulative
    assert [c["output_ids"] for c in chunks] == [[0], [0, 1], [0, 1, 2]]
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, {"type": "length", "length": 3}]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert "response_sent_to_client_ts" in chunks[0]["meta_info"] and "e2e_latency" in chunks[2]["meta_info"]
    assert len({c["meta_info"]["id"] for c in chunks}) == 1


def test_completions_stream_deltas_then_usage_when_asked(tmp_path: Path) -> None:
    body = {"model": "m", "prompt": "a b c", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    status, _, events = _stream_of(tmp_path, "/v1/completions", body)
    first, second, usage, done = events
    assert status == 200 and done == "[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in (first, second)] == [None, "length"]
    assert first["choices"][0]["text"] and second["choices"][0]["text"].startswith(" ")  # deltas, not cumulative
    assert first["usage"] is None and first["model"] == "m" and first["object"] == "text_completion"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2 and usage["usage"]["prompt_tokens"] == 3
    _, _, plain = _stream_of(tmp_path, "/v1/completions", {**body, "stream_options": None})
    assert len(plain) == 3, "no usage chunk unless include_usage"


def test_chat_stream_is_byte_for_byte_what_sglang_s_own_builder_makes(tmp_path: Path, regenerated: Path) -> None:
    """Role chunk, content chunks, the separate finish chunk: SGLang's ``build_sse_content`` (run in its venv) makes
    the same bytes from the same fields; only the usage chunk and [DONE] are built elsewhere (serving_chat.py)."""
    del regenerated  # builds the SGLang venv on first use
    chunks = StreamChunks("chat", "rid0", "m", "v1", prompt_tokens=3, completion_tokens=2, include_usage=False)
    chunks.created = 1730000000
    ours = chunks.output(["alpha"]) + chunks.output(["alpha", "beta"]) + chunks.end()
    sse_utils = sglang_source() / "srt" / "entrypoints" / "openai" / "sse_utils.py"
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sse_utils', {str(sse_utils)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "b = lambda **kw: m.build_sse_content('rid0', 1730000000, 'm', 0, **kw)\n"
        "sys.stdout.write(b(role='assistant', content='') + b(content='alpha') + b(content=' beta')"
        " + b(finish_reason='length'))\n"
    )
    theirs = subprocess.run([str(SGLANG_PYTHON), "-c", script], capture_output=True, text=True, check=True).stdout
    assert ours == theirs.encode() + DONE


def _class_fields(module: Path, name: str) -> list[str]:
    tree = ast.parse(module.read_text())
    [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _field_default(module: Path, name: str) -> Any:
    """The default of a ``name: T = field(default=X, …)`` or ``name: T = X`` in SGLang's server-argument fields."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            value = node.value
            if isinstance(value, ast.Call):
                [value] = [k.value for k in value.keywords if k.arg == "default"]
            return ast.literal_eval(value)  # type: ignore[arg-type]
    raise AssertionError(f"{name} not found in {module}")


def _module_constant(module: Path, name: str) -> Any:
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {module}")


def test_the_stream_s_shape_is_the_pinned_source_s(tmp_path: Path, regenerated: Path) -> None:
    del regenerated
    srt = sglang_source() / "srt"
    serving_fields = srt / "arg_groups" / "fields" / "serving.py"  # ServerArgs' serving fields
    # /generate: cumulative text (our chunks carry all words so far), one chunk per output (one per scheduler step)
    assert _field_default(serving_fields, "incremental_streaming_output") is False
    assert _field_default(serving_fields, "stream_interval") == 1
    http_server = (srt / "entrypoints" / "http_server.py").read_text()
    assert 'yield b"data: [DONE]\\n\\n"' in http_server and 'b"data: " + dumps_json(out) + b"\\n\\n"' in http_server
    # completions: the choice's fields and the chunk's, in order (our chunk's keys are these)
    protocol = srt / "entrypoints" / "openai" / "protocol.py"
    choice = _class_fields(protocol, "CompletionResponseStreamChoice")
    chunk = _class_fields(protocol, "CompletionStreamResponse")
    status, _, events = _stream_of(tmp_path, "/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": True})
    assert status == 200
    assert list(events[0]["choices"][0]) == [f for f in choice if f in events[0]["choices"][0]]
    assert set(events[0]["choices"][0]) <= set(choice) and {"index", "text", "finish_reason"} <= set(choice)
    assert list(events[0]) == [f for f in chunk if f in events[0]] and set(events[0]) <= set(chunk)
    assert events[0]["model"] == "default"  # no model given: SGLang echoes its default
    assert _module_constant(protocol, "DEFAULT_MODEL_NAME") == "default"  # CompletionRequest.model's default


def _load(tmp_path: Path, spec_changes: dict[str, Any], count: int = 40, **worker: Any) -> LoadReport:
    """``count`` requests at 200/s to a simulated worker with ``worker``'s changes (40 ms a generation by default)."""

    async def run() -> LoadReport:
        server = TestServer(make_worker(tmp_path, **({"latency_ms": 40.0} | worker)).build_app())
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            spec = LoadSpec(url=url, rate_per_s=200.0, duration_s=count / 200, max_requests=count, **spec_changes)
            return await LoadGenerator(spec).run()
        finally:
            await server.close()

    return asyncio.run(run())


def test_the_production_mix_is_served_whole_streams_timed_per_token(tmp_path: Path) -> None:
    report = _load(tmp_path, {"model": "exaserve-sim", "shapes": PRODUCTION_MIX})
    assert report.errors == 0 and report.count == 40, report.summary()
    streamed = [r for r in report.results if r.streamed]
    assert len(streamed) == sum(s.stream for s in PRODUCTION_MIX) * 40 // len(PRODUCTION_MIX)
    assert all(r.ttft_s is not None and r.ttft_s <= r.latency_s for r in streamed)  # not a timing judgment: order
    # a chunk per output after the first: max_tokens - 1 gaps (chat's role and finish chunks carry no output)
    shapes = [PRODUCTION_MIX[i % len(PRODUCTION_MIX)] for i in range(40)]
    by_shape = sorted(s.max_tokens for s in shapes if s.stream)
    assert sorted(len(r.itl_s) + 1 for r in streamed) == by_shape
    doc = report.to_json()
    assert doc["streamed_share"] == len(streamed) / 40 and doc["errors_by_status"] == {}
    assert doc["ttft_p99_s"] is not None and doc["itl_p99_s"] is not None


async def _broken_server(mode: str) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"text":"a","output_ids":[0],"meta_info":{}}\n\n')
        if mode == "error-chunk":  # smg's answer to an upstream that broke mid-body (stream_failure.rs)
            await response.write(b'data: {"error":{"message":"Stream error: reset","type":"stream_error"}}\n\n')
            await response.write(b"data: [DONE]\n\n")
        elif mode == "cut":  # the connection dropped mid-body
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()  # "no-done": a clean end without [DONE]
        return response

    app = web.Application()
    app.router.add_post("/generate", stream)
    return app


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("error-chunk", "stream error chunk after 1 chunks"),
        ("no-done", "broken stream: the body ended after 1 chunks without data: [DONE]"),
        ("cut", "(the body broke off)"),
    ],
)
def test_a_stream_that_does_not_end_in_done_is_a_failed_request_with_status_200(mode: str, error: str) -> None:
    async def run() -> LoadReport:
        server = TestServer(await _broken_server(mode))
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            shape = RequestShape("generate", stream=True)
            return await LoadGenerator(LoadSpec(url=url, rate_per_s=100.0, duration_s=0.03, shapes=(shape,))).run()
        finally:
            await server.close()

    report = asyncio.run(run())
    assert report.count == 3 and report.status_counts == {200: 3}
    assert report.errors == 3 and report.errors_by_status == {BROKEN_STREAM: 3}, report.summary()
    assert all(error in (r.error or "") for r in report.results), report.results[0].error


def test_a_refusing_release_answers_as_sglang_refuses_and_a_breaking_one_drops_streams(tmp_path: Path) -> None:
    """``bad_request_rate``: SGLang's context-length refusal (400 ``BadRequestError`` on the OpenAI routes, 400
    ``{"error": {"message"}}`` on /generate, 200 with an error chunk on a streamed /generate); ``stream_break_rate``:
    the connection drops after the first chunk. The load generator counts every one of them an error."""
    mix = {"model": "m", "shapes": PRODUCTION_MIX}
    refused = _load(tmp_path, mix, 16, latency_ms=5.0, bad_request_rate=1.0)
    streamed_generate = sum(1 for i in range(16) if PRODUCTION_MIX[i % 8] == RequestShape("generate", True, 32, 16))
    assert refused.count == 16 and refused.errors == 16, refused.summary()
    assert refused.errors_by_status == {"400": 16 - streamed_generate, BROKEN_STREAM: streamed_generate}
    assert all("maximum context length" in (r.error or "") for r in refused.results)
    broken = _load(tmp_path, mix, 16, latency_ms=5.0, stream_break_rate=1.0)
    streamed = sum(s.stream for s in PRODUCTION_MIX) * 2
    assert broken.errors == streamed and broken.errors_by_status == {BROKEN_STREAM: streamed}, broken.summary()
    assert broken.ok == 16 - streamed


def test_a_streamed_engine_failure_comes_after_the_200_head_and_the_client_counts_it(tmp_path: Path) -> None:
    """SGLang sends a stream's 200 head before it generates: an engine failure then comes in the stream (``/generate``:
    a last chunk whose ``finish_reason`` is an abort; the OpenAI routes: an error chunk), then [DONE]. smg sees a 200
    and the worker's success; only the client's read counts it. Non-streamed, it is the 500 it was."""
    report = _load(tmp_path, {"model": "m", "shapes": PRODUCTION_MIX}, 16, latency_ms=5.0, error_rate=1.0)
    streamed = sum(s.stream for s in PRODUCTION_MIX) * 2
    assert report.errors == 16 and report.errors_by_status == {BROKEN_STREAM: streamed, "500": 16 - streamed}
    assert all("simulated engine failure" in (r.error or "") for r in report.results), report.summary()


def test_the_openai_routes_hold_their_head_until_the_first_output_generate_does_not(tmp_path: Path) -> None:
    """A wedged scheduler: ``/generate``'s stream has its 200 head at once (SGLang returns the StreamingResponse before
    generating), the chat route's has none (serving_chat.py awaits the first output first), so smg's request timeout
    ends it before any byte, a 504 it retries elsewhere."""

    async def run() -> tuple[int, bool]:
        async with TestClient(TestServer(make_worker(tmp_path).build_app())) as client:
            await client.put("/sim/fault", json={"wedged": True})
            generate = await asyncio.wait_for(
                client.post("/generate", json={"text": "a", "stream": True}), PATIENCE_S
            )  # its head must come while the scheduler is wedged: a hang here fails as one
            chat = asyncio.create_task(
                client.post(
                    "/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "stream": True}
                )
            )
            await asyncio.sleep(0.5)  # a wedged scheduler never produces: no head however long one waits
            held = not chat.done()
            chat.cancel()
            generate.close()
            await client.delete("/sim/fault")
            return generate.status, held

    assert asyncio.run(run()) == (200, True)


def test_the_chat_usage_chunk_keeps_its_nulls_the_completions_one_does_not() -> None:
    """serving_chat.py dumps its usage chunk with its None fields; serving_completions.py with exclude_none."""
    chat = StreamChunks("chat", "r", "m", "v1", prompt_tokens=3, completion_tokens=1, include_usage=True)
    completions = StreamChunks("completions", "r", "m", "v1", prompt_tokens=3, completion_tokens=1, include_usage=True)
    chat_usage = _events(chat.end())[-2]["usage"]
    completions_usage = _events(completions.end())[-2]["usage"]
    assert chat_usage == {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1, "prompt_tokens_details": None,
                          "reasoning_tokens": 0, "completion_tokens_details": None}  # fmt: skip
    assert completions_usage == {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1, "reasoning_tokens": 0}
