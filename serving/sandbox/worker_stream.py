"""The SSE streams of a SIMULATED SGLang worker (:mod:`serving.sandbox.worker`), chunk by chunk as SGLang 0.5.23 sends
them (paths under ``sglang/srt/``; tests/test_sandbox_worker_stream.py holds them against the pinned source):

* every route: ``text/event-stream``, the status (200) sent before the first chunk, each chunk ``data: JSON\\n\\n``
  (compact JSON), the end ``data: [DONE]\\n\\n`` (``entrypoints/http_server.py`` ``stream_results``,
  ``entrypoints/openai/serving_completions.py``, ``serving_chat.py``), no ``event:`` or ``id:`` lines;
* ``/generate``: one chunk per output (``stream_interval`` 1), ``text`` and ``output_ids`` cumulative
  (``incremental_streaming_output`` off), ``meta_info.finish_reason`` null until the last chunk, which carries
  ``{"type": "length", "length": N}`` and ``e2e_latency`` (``managers/tokenizer_manager.py``);
* ``/v1/completions``: one chunk per output, its ``text`` the delta, the last with ``finish_reason`` and
  ``matched_stop``, ``usage`` null in each; then, when ``stream_options.include_usage``, a usage chunk with no choices;
* ``/v1/chat/completions``: a role chunk (``delta: {"reasoning_content": null, "role": "assistant", "content": ""}``)
  before the first content, one content chunk per output with ``finish_reason`` null, a separate finish chunk with
  an empty delta, then the usage chunk as above (``entrypoints/openai/sse_utils.py``).

The simulated generation ends by length, never by a stop token: ``finish_reason`` ``length``, ``matched_stop`` null.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

Endpoint = Literal["generate", "completions", "chat"]
DONE = b"data: [DONE]\n\n"
CONTENT_TYPE = "text/event-stream; charset=utf-8"  # starlette's StreamingResponse(media_type="text/event-stream")


def event(chunk: Any) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class StreamChunks:
    """The chunks of one streamed request: :meth:`output` for each output as the scheduler produces it (the words so
    far), :meth:`end` after the last (the finish and usage chunks, then ``[DONE]``)."""

    def __init__(
        self,
        endpoint: Endpoint,
        rid: str,
        model: str,
        version: str,
        prompt_tokens: int,
        completion_tokens: int,
        include_usage: bool,
    ) -> None:
        self.endpoint = endpoint
        self.rid = rid
        self.model = model
        self.version = version
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.include_usage = include_usage
        self.created = int(time.time())  # fixed once per stream, as SGLang's
        self.started = time.monotonic()

    def output(self, words: list[str]) -> bytes:
        """The chunk(s) for output ``len(words)``: its word (the delta) or all so far (``/generate``)."""
        n = len(words)
        last = n == self.completion_tokens
        if self.endpoint == "generate":
            meta: dict[str, Any] = {
                "id": self.rid,
                "finish_reason": {"type": "length", "length": n} if last else None,
                "prompt_tokens": self.prompt_tokens,
                "weight_version": self.version,
                "completion_tokens": n,
                "cached_tokens": 0,
            }
            if n == 1:
                meta["response_sent_to_client_ts"] = time.time()
            if last:
                meta["e2e_latency"] = time.monotonic() - self.started
            return event({"text": " ".join(words), "output_ids": list(range(n)), "meta_info": meta})
        delta = (" " if n > 1 else "") + words[-1]
        if self.endpoint == "completions":
            choice = {
                "index": 0,
                "text": delta,
                "logprobs": None,
                "finish_reason": "length" if last else None,
                "matched_stop": None,
            }
            return event(self._openai("text_completion", choice) | {"usage": None})
        content = {"index": 0, "delta": {"reasoning_content": None, "content": delta}, "logprobs": None,
                   "finish_reason": None, "matched_stop": None}  # fmt: skip
        chunk = event(self._openai("chat.completion.chunk", content))
        if n == 1:
            role = {"index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None, "matched_stop": None}  # fmt: skip
            return event(self._openai("chat.completion.chunk", role)) + chunk
        return chunk

    def end(self) -> bytes:
        """After the last output: the chat's finish chunk, the usage chunk when asked for, ``[DONE]``."""
        out = b""
        if self.endpoint == "chat":
            finish = {"index": 0, "delta": {"reasoning_content": None}, "logprobs": None, "finish_reason": "length",
                      "matched_stop": None}  # fmt: skip
            out += event(self._openai("chat.completion.chunk", finish))
        if self.include_usage and self.endpoint != "generate":
            kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
            usage: dict[str, Any] = {
                "prompt_tokens": self.prompt_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "completion_tokens": self.completion_tokens,
            }
            if self.endpoint == "chat":  # dumped with its nulls (serving_chat.py); completions' without (exclude_none)
                usage |= {"prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}
            else:
                usage["reasoning_tokens"] = 0
            out += event({"id": self.rid, "object": kind, "created": self.created, "model": self.model,
                          "choices": [], "usage": usage})  # fmt: skip
        return out + DONE

    def _openai(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}
