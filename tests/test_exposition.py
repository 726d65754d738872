"""serving.exposition answers to prometheus_client's parser: the same samples on real expositions (a simulated
SGLang worker's, prometheus_client's own with hostile label values) and on each edge of the text format, the fast
path taken where the exporters' lines are plain (else its speed would be fiction), prometheus_client's parser (and its
ValueError) where they are not. The real smg router's exposition is held to the same in tests/test_sandbox_processes.py.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving import exposition
from serving.sandbox.worker import SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig
from tests.support.exposition import comparable, reference


def agrees(text: str) -> list[exposition.Parsed]:
    got = exposition.samples(text)
    assert comparable(got) == comparable(reference(text)), text
    return got


def fast(text: str) -> bool:
    """Whether the fast path vouched for every line of ``text``."""
    try:
        exposition._fast(text)
    except exposition._Unvouched:
        return False
    return True


def test_a_simulated_sglang_workers_exposition_after_traffic_takes_the_fast_path() -> None:
    config = WorkerConfig(port=1, latency_ms=0.0, jitter_ms=0.0, model_path="/m", dp_size=2, priority_scheduling=True)

    async def served() -> str:
        worker = SimulatedWorker(config)
        metrics = worker.metrics
        for priority in ("0", "5"):
            labels = metrics.request_labels(priority)
            metrics._e2e.labels(**labels).observe(0.3)
            metrics._requests.labels(**labels).inc()
        for rank, labels in enumerate(metrics.scheduler_labels):
            metrics.export_rank(rank, labels, worker.scheduler.load, 0.25)
        return generate_latest(metrics.registry).decode()

    text = asyncio.run(served())
    assert fast(text)
    got = agrees(text)
    names = {name for name, _labels, _value in got}
    assert {"sglang:e2e_request_latency_seconds_bucket", "sglang:num_requests_total", "sim_worker_info"} <= names
    assert any(name.endswith("_created") for name in names)  # prometheus_client's untyped singletons


@pytest.mark.parametrize("seed", range(40))
def test_prometheus_clients_own_output_with_hostile_label_values(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = 'ab,={}" \\\n#é_:.'  # no tab: prometheus_client writes it as it is, which is not the fast path's
    registry = CollectorRegistry()
    counter = Counter("jobs", "jobs done, \\ and \n in help", ["path", "kind"], registry=registry)
    gauge = Gauge("temperature", "a gauge", ["where"], registry=registry)
    histogram = Histogram("latency_seconds", "a histogram", ["route"], registry=registry, buckets=(0.1, 1, 10))
    summary = Summary("size_bytes", "a summary", ["route"], registry=registry)
    for _ in range(6):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        counter.labels(path=value, kind=str(rng.randint(0, 3))).inc(rng.random() * 100)
        gauge.labels(where=value).set(rng.choice([float("nan"), float("inf"), -float("inf"), -2.5e-7, 3.0]))
        histogram.labels(route=value).observe(rng.random() * 20)
        summary.labels(route=value).observe(rng.random())
    text = generate_latest(registry).decode()
    assert fast(text)
    agrees(text)


# each: a text on the fast path, held to prometheus_client's samples
PLAIN = {
    "counter without _total gets it": '# TYPE jobs counter\njobs 3\njobs{a="b"} 4\n',
    "counter with _total keeps its name": "# HELP jobs_total x\n# TYPE jobs_total counter\njobs_total 3\n",
    "a stray sample ends the family, no _total for it": "# TYPE jobs counter\njobs 1\nother 2\njobs 3\n",
    "help then type, another help": "# HELP a x\n# TYPE a gauge\na 1\n# HELP b y\nb 2\n",
    "summary quantiles": '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 3\n',
    "histogram": '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n',
    "timestamps": 'a 1 1700000000000\nb{x="y"} 2.5 -5\n',
    "trailing comma and empty labels": 'a{x="y",} 1\nb{} 2\n',
    "escapes, braces and commas in values": 'a{x="q\\"uote",y="new\\nline",z="back\\\\slash",w="}, {=",v="a # b"} 1\n',
    "an unknown escape stays": 'a{x="odd\\q"} 1\n',
    "special values": "a NaN\nb +Inf\nc -Inf\nd 1e-05\ne 7\n",
    "comments, blank lines, CRLF": "# just a comment\n#\n\n# HELP a x\r\na 1\r\n\r\n",
    "untyped family with a help": "# HELP u a thing\nu 1\nu_other 2\n",
}


@pytest.mark.parametrize("text", PLAIN.values(), ids=PLAIN.keys())
def test_plain_lines_take_the_fast_path_with_prometheus_clients_samples(text: str) -> None:
    assert fast(text)
    agrees(text)


# each: a text outside the fast grammar, parsed by prometheus_client (the same samples, or its ValueError)
UNVOUCHED = {
    "a tab": "a\t1\n",
    "spaces in labels": 'a{ x = "y" } 1\n',
    "space before the brace": 'a {x="y"} 1\n',
    "no space before the value": 'a{x="y"}1\n',
    "quoted UTF-8 name": '{"my.metric",x="y"} 1\n',
    "__name__ label": '{__name__="a",x="y"} 1\n',
    "exemplar": 'a 1 # {trace="t"} 2\n',
    "three tokens": "a 1 2 3\n",
    "colon in a label name": 'a{x:y="z"} 1\n',
    # a review's counterexamples, each of which the fast path once read otherwise than prometheus_client
    "a quote in a comment makes it no TYPE": '#" TYPE foo counter\nfoo 1\n',
    "a no-break space in a comment": "#\xa0TYPE foo counter\nfoo 1\n",
    "an ideographic space in a help": "# TYPE foo counter\nfoo 1\n#\u3000HELP bar x\nfoo 2\n",
    "an information separator in a type": "# TYPE\x1cfoo counter\nfoo 1\n",
    "a no-break space before the type": "# TYPE foo\xa0counter\nfoo 1\n",
    "a no-break space as the separator": "foo\xa01\n",
    "an unknown type": "# TYPE foo bogus\nfoo 1\n",
    "a type in capitals": "# TYPE foo Counter\nfoo 1\n",
    "a counter named _total": "# TYPE _total counter\n",
    "a 400-digit timestamp": "foo 1 " + "1" * 400 + "\n",
}


@pytest.mark.parametrize("text", UNVOUCHED.values(), ids=UNVOUCHED.keys())
def test_other_lines_go_to_prometheus_client(text: str) -> None:
    assert not fast(text)
    try:
        expected = comparable(reference(text))
    except (ValueError, OverflowError):  # prometheus_client's int timestamp / 1000 overflows a float
        with pytest.raises(ValueError):
            exposition.samples(text)
        return
    assert comparable(exposition.samples(text)) == expected


def test_numbers_read_as_prometheus_client_reads_them() -> None:
    """prometheus_client reads an integer token as an int: "-0" is 0, not -0.0; one too long for a float stays an
    exact int there, and is a ValueError here (a float cannot hold it), never a silent inf."""
    assert comparable(agrees("foo -0\nbar +7\nbaz 1e3\n")) == [
        ("foo", {}, "0.0"),
        ("bar", {}, "7.0"),
        ("baz", {}, "1000.0"),
    ]
    assert fast("foo " + "9" * 300 + "\n")
    huge = "foo " + "9" * 400 + "\n"
    assert [s.value for f in text_string_to_metric_families(huge) for s in f.samples] == [int("9" * 400)]
    with pytest.raises(ValueError, match="too large"):
        exposition.samples(huge)


@pytest.mark.parametrize(
    "text",
    [
        'a{x="y",x="z"} 1\n',  # a duplicate label
        "a 1_000\n",  # float() would take it
        "# TYPE a\n",  # a type without a type
        "# HELP 9bad x\n",
        'a{x="unterminated} 1\n',
        "a{x=y} 1\n",
        "a one\n",
    ],
)
def test_what_prometheus_client_rejects_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        reference(text)
    with pytest.raises(ValueError):
        exposition.samples(text)
