"""Traces: block hashing, the readers, the synthetic workload and the Mooncake facts."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import MOONCAKE, require

from vllm_admission.core.traces import (
    SKIP_BEYOND_MAX_REQUESTS,
    SKIP_OVER_MAX_PROMPT,
    LogNormal,
    Request,
    SpanPrompt,
    SyntheticConfig,
    TokenPrompt,
    Trace,
    TraceError,
    generate,
    load_trace,
    span_token,
    write_token_jsonl,
)

BIG_VOCAB = 1 << 40  # large enough that two different span contents never give equal tokens by chance


def _write(tmp_path: Path, lines: list, name: str = "t.jsonl") -> Path:
    """Write ``lines`` (dicts become JSON, strings are written as they are) one per line."""
    path = tmp_path / name
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


def _mc(ts: float = 2000, n: int = 1000, out: int = 10, ids: list | None = None) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids if ids is not None else [0, 1]}


def _tok(tokens: list | None = None, out: int = 4, **extra) -> dict:
    return {"prompt_token_ids": tokens if tokens is not None else [1, 2, 3], "output_len": out, **extra}


def _req(rid: str, prompt, out: int = 1) -> Request:
    return Request(rid, prompt, out, None, None)


# ---------------------------------------------------------------- block hashing

# Few keys, so that the same key often recurs at other positions and with other lengths.
_spans = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=0, max_size=6)


@settings(max_examples=300, deadline=None)
@given(common=_spans, tail_a=_spans, tail_b=_spans, block_size=st.integers(1, 48))
def test_span_hashes_follow_token_content_at_any_block_size(common, tail_a, tail_b, block_size):
    spans_a, spans_b = tuple(common + tail_a), tuple(common + tail_b)
    if not spans_a or not spans_b:
        return
    a, b = SpanPrompt(spans_a), SpanPrompt(spans_b)
    toks_a, toks_b = a.token_ids(BIG_VOCAB), b.token_ids(BIG_VOCAB)
    ha, hb = a.block_hashes(block_size), b.block_hashes(block_size)
    ta = TokenPrompt(tuple(toks_a)).block_hashes(block_size)
    tb = TokenPrompt(tuple(toks_b)).block_hashes(block_size)
    assert len(ha) == len(ta) == a.num_tokens // block_size
    assert len(hb) == len(tb) == b.num_tokens // block_size
    for k in range(min(len(ha), len(hb))):
        end = (k + 1) * block_size
        same_content = toks_a[:end] == toks_b[:end]
        assert (ha[k] == hb[k]) == same_content
        assert (ta[k] == tb[k]) == same_content


def _all_span_prompts(max_tokens: int, keys: tuple[int, ...]) -> list[tuple[tuple[int, int], ...]]:
    """Every span sequence over ``keys`` with a total length of 1..max_tokens."""
    found: list[tuple[tuple[int, int], ...]] = []

    def extend(prefix: tuple[tuple[int, int], ...], left: int) -> None:
        for key in keys:
            for length in range(1, left + 1):
                spans = prefix + ((key, length),)
                found.append(spans)
                extend(spans, left - length)

    extend((), max_tokens)
    return found


def test_span_hashes_follow_token_content_exhaustively():
    # All prompts of up to 5 tokens over two keys (242 prompts): every pair, every block size.
    prompts = [SpanPrompt(spans) for spans in _all_span_prompts(5, (0, 1))]
    tokens = [p.token_ids(BIG_VOCAB) for p in prompts]
    for block_size in (1, 2, 3, 4):
        hashes = [p.block_hashes(block_size) for p in prompts]
        for k in range(5 // block_size):
            end = (k + 1) * block_size
            by_content = collections.defaultdict(set)
            for toks, h in zip(tokens, hashes, strict=True):
                if len(h) > k:
                    by_content[tuple(toks[:end])].add(h[k])
            assert all(len(s) == 1 for s in by_content.values())  # equal content -> equal hash
            assert len(set().union(*by_content.values())) == len(by_content)  # different content -> different hash


@settings(max_examples=200, deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 2), st.integers(2, 60)), min_size=1, max_size=5),
       where=st.integers(0, 4), cut=st.integers(1, 59), block_size=st.integers(1, 64))
def test_splitting_or_shortening_a_span_changes_exactly_the_affected_blocks(spans, where, cut, block_size):
    i = where % len(spans)
    key, length = spans[i]
    cut = 1 + cut % (length - 1)
    split = spans[:i] + [(key, cut), (key, length - cut)] + spans[i + 1 :]  # restarts the span: new content
    shortened = spans[:i] + [(key, cut)] + spans[i + 1 :]  # a prefix of the span, then the same spans
    base = SpanPrompt(tuple(spans))
    base_tokens = base.token_ids(BIG_VOCAB)
    for variant in (SpanPrompt(tuple(split)), SpanPrompt(tuple(shortened))):
        toks = variant.token_ids(BIG_VOCAB)
        # The blocks both prompts have (the shortened one has fewer).
        pairs = zip(base.block_hashes(block_size), variant.block_hashes(block_size), strict=False)
        for k, (a, b) in enumerate(pairs):
            end = (k + 1) * block_size
            assert (a == b) == (base_tokens[:end] == toks[:end])


@pytest.mark.parametrize(("block_size", "shared"), [(512, 2), (544, 1), (256, 4), (16, 64), (1000, 1), (2048, 0)])
def test_mooncake_blocks_reblocked(block_size, shared):
    # Two prompts that agree on their first 1,024 tokens (two 512-token source blocks).
    a = SpanPrompt(((0, 512), (1, 512), (2, 512), (3, 100)))
    b = SpanPrompt(((0, 512), (1, 512), (5, 512)))
    ha, hb = a.block_hashes(block_size), b.block_hashes(block_size)
    equal = [x == y for x, y in zip(ha, hb, strict=False)]   # the blocks both prompts have
    assert equal == [True] * shared + [False] * (len(equal) - shared)


def test_shorter_span_with_same_key_is_a_prefix():
    long, short = SpanPrompt(((7, 300),)), SpanPrompt(((7, 200), (8, 100)))
    assert short.token_ids(1000)[:200] == long.token_ids(1000)[:200]
    assert long.block_hashes(100)[:2] == short.block_hashes(100)[:2]
    assert long.block_hashes(100)[2] != short.block_hashes(100)[2]


def test_partial_last_block_is_not_hashed():
    tokens = TokenPrompt(tuple(range(10)))
    spans = SpanPrompt(((4, 6), (9, 4)))
    for prompt in (tokens, spans):
        assert len(prompt.block_hashes(4)) == 2
        assert len(prompt.block_hashes(4, include_partial=True)) == 3
        assert len(prompt.block_hashes(5)) == 2
        assert len(prompt.block_hashes(5, include_partial=True)) == 2
        assert prompt.block_hashes(11) == []
    # Changing only the partial tail leaves every full-block hash as it was.
    assert TokenPrompt(tuple(range(8)) + (99, 98)).block_hashes(4) == tokens.block_hashes(4)
    assert TokenPrompt(tuple(range(8)) + (99,)).block_hashes(4) == tokens.block_hashes(4)
    assert _req("r", spans).block_hashes(4) == spans.block_hashes(4)


def test_block_hashes_are_chained():
    prompt = TokenPrompt((5, 5, 5, 5, 5, 5))
    h = prompt.block_hashes(2)
    assert len(set(h)) == 3  # equal block contents at different depths hash differently


def test_bad_block_size_and_vocab():
    with pytest.raises(ValueError, match="block_size"):
        TokenPrompt((1, 2)).block_hashes(0)
    with pytest.raises(ValueError, match="block_size"):
        SpanPrompt(((1, 2),)).block_hashes(-3)
    with pytest.raises(ValueError, match="vocabulary of 100"):
        TokenPrompt((1, 100)).token_ids(100)
    with pytest.raises(ValueError, match="bad span"):
        SpanPrompt(((1, 0),))  # an empty span would make the content encoding ambiguous
    for spans in (((1, 2), (3, 4, 5)), ((1, 2), [3, 4]), ((-1, 2),), ((1, 2.0),), ()):
        with pytest.raises(ValueError, match="SpanPrompt.spans|bad span"):
            SpanPrompt(spans)


def test_span_tokens_are_deterministic_and_in_range():
    prompt = SpanPrompt(((3, 50), (2**62 + 5, 50)))
    ids = prompt.token_ids(151_936)
    assert ids == prompt.token_ids(151_936)
    assert len(ids) == 100 and all(0 <= t < 151_936 for t in ids)
    assert ids[0] == span_token(3, 0, 151_936)
    assert len(set(ids)) > 90  # the mixer spreads neighbouring offsets


_PROCESS_DIGEST = (
    "from vllm_admission.core.traces import load_trace\n"
    "t = load_trace('synthetic', num_requests=60, seed=3)\n"
    "print([r.request_id for r in t.requests][:5], t.block_hashes(16)[-1][-3:], t.block_hashes(544)[7],"
    " t.requests[9].token_ids(32000)[:20])\n"
)


def test_hashes_and_synthetic_trace_are_the_same_in_every_process():
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        command = [sys.executable, "-c", _PROCESS_DIGEST]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        outputs.add(out.stdout)
    assert len(outputs) == 1


# ---------------------------------------------------------------- Trace


def _token_trace(*prompts: tuple[int, ...]) -> Trace:
    return Trace("t", [_req(f"r{i}", TokenPrompt(p)) for i, p in enumerate(prompts)], {}, "test")


def test_trace_block_hashes_are_memoised_per_block_size():
    trace = _token_trace(tuple(range(10)), tuple(range(7)))
    first = trace.block_hashes(3)
    assert first == [r.block_hashes(3) for r in trace.requests]
    assert trace.block_hashes(3) is first
    assert trace.block_hashes(2) == [r.block_hashes(2) for r in trace.requests]


def test_infinite_capacity_bound_by_hand():
    base = tuple(range(10))  # block size 4: two full blocks and a 2-token tail
    trace = _token_trace(
        base,  # nothing earlier: 0
        base[:8] + (50, 51, 52, 53),  # both full blocks of r0, cap (12-1)//4 = 2 blocks: 8
        base,  # both full blocks; cap (10-1)//4 = 2: 8
        base[:8],  # both blocks match but the cap (8-1)//4 = 1 block: 4
        base[:4] + (60, 61, 62, 63, 64),  # only block 0: 4
        (70, 71, 72, 73) + base[4:8],  # block 1 content was seen, but after another block 0: 0
    )
    prompt_tokens = 10 + 12 + 10 + 8 + 9 + 8
    assert trace.infinite_capacity_bound(4) == (8 + 8 + 4 + 4, prompt_tokens)
    reuse = trace.prefix_reuse(4)
    assert (reuse.hit_blocks, reuse.total_blocks) == (2 + 2 + 1 + 1, 2 + 3 + 2 + 2 + 2 + 2)
    # Mooncake's way: partial tails are blocks, no cap; r2's tail (8, 9) equals r0's, so r2 hits all 10 tokens.
    loose = trace.prefix_reuse(4, partial_blocks=True, cap=False)
    assert dataclasses.astuple(loose) == (2 + 3 + 2 + 1 + 0, 3 + 3 + 3 + 2 + 3 + 2, 8 + 10 + 8 + 4 + 0, prompt_tokens)
    assert loose.block_hit_rate == 8 / 16 and loose.token_hit_rate == 30 / prompt_tokens


def test_bound_counts_only_earlier_prompts():
    trace = _token_trace((1, 2, 3, 4, 1, 2, 3, 4, 0))  # repeated content inside one prompt is no hit
    assert trace.infinite_capacity_bound(4) == (0, 9)


def test_summary():
    trace = Trace(
        "s",
        [
            Request("a", TokenPrompt((1, 2, 3)), 5, 1.0, "x"),
            Request("b", TokenPrompt((1,)), 7, 4.5, "x"),
            Request("c", SpanPrompt(((1, 8),)), 9, 6.0, "y"),
        ],
        {"why": 2},
        "test",
    )
    s = trace.summary()
    assert (s["requests"], s["prompt_tokens_total"], s["prompt_tokens_max"], s["prompt_tokens_mean"]) == (3, 12, 8, 4.0)
    assert (s["output_tokens_total"], s["output_tokens_max"], s["output_tokens_mean"]) == (21, 9, 7.0)
    assert (s["sessions"], s["duration_s"], s["skipped"]) == (2, 5.0, {"why": 2})


# ---------------------------------------------------------------- Mooncake reader


def test_mooncake_records_become_512_token_spans(tmp_path):
    path = _write(tmp_path, [_mc(0, 1000, 3, [0, 1]), "", "   ", _mc(1500, 512, 1, [0]), _mc(1500, 1025, 2, [0, 1, 9])])
    trace = load_trace(path)
    assert trace.name == "mooncake/t" and trace.source == str(path) and trace.skipped == {}
    a, b, c = trace.requests
    assert [r.request_id for r in trace.requests] == ["mooncake-1", "mooncake-4", "mooncake-5"]  # file line numbers
    assert a.prompt == SpanPrompt(((0, 512), (1, 488)))
    assert c.prompt == SpanPrompt(((0, 512), (1, 512), (9, 1)))
    assert (a.prompt_len, a.output_len, a.arrival_s, a.session) == (1000, 3, 0.0, None)
    assert b.arrival_s == 1.5
    assert a.block_hashes(512)[0] == b.block_hashes(512)[0] == c.block_hashes(512)[0]
    assert a.block_hashes(512) == c.block_hashes(512)[:1]  # a has one full block
    assert c.block_hashes(512)[1] != a.prompt.block_hashes(512, include_partial=True)[1]


def test_mooncake_block_tokens_shrink_prompts_and_keep_sharing(tmp_path):
    path = _write(tmp_path, [_mc(0, 1000, 3, [0, 1]), _mc(1500, 1025, 2, [0, 1, 9])])
    a, c = load_trace(path, mooncake_block_tokens=128).requests
    # full blocks become 128 tokens; a last block of 488 becomes ceil(488 / 4) = 122, of 1 -> 1
    assert a.prompt == SpanPrompt(((0, 128), (1, 122)))
    assert c.prompt == SpanPrompt(((0, 128), (1, 128), (9, 1)))
    assert (a.prompt_len, a.output_len, c.prompt_len) == (250, 3, 257)
    assert a.block_hashes(128) == c.block_hashes(128)[:1]  # the shared first hash id
    assert c.block_hashes(128)[1] != a.prompt.block_hashes(128, include_partial=True)[1]
    full = load_trace(path).requests  # the default keeps the published 512
    assert [r.prompt_len for r in full] == [1000, 1025]


@pytest.mark.parametrize("value", [0, 513, 2.0])
def test_bad_mooncake_block_tokens(tmp_path, value):
    with pytest.raises(TraceError, match="mooncake_block_tokens"):
        load_trace(_write(tmp_path, [_mc()]), mooncake_block_tokens=value)


_MOONCAKE_BAD = [
    ({"input_length": 10, "output_length": 1, "hash_ids": [0]}, "timestamp", "missing"),
    (_mc(ts="5"), "timestamp", "finite number"),
    (_mc(ts=True), "timestamp", "finite number"),
    (_mc(ts=-1), "timestamp", ">= 0"),
    (_mc(n=1000.0), "input_length", "integer"),
    (_mc(n=0, ids=[]), "input_length", ">= 1"),
    (_mc(out=0), "output_length", ">= 1"),
    (_mc(out=-2), "output_length", ">= 1"),
    (_mc(out="7"), "output_length", "integer"),
    (_mc(ids="0,1"), "hash_ids", "list of integers"),
    (_mc(ids=[0, "1"]), "hash_ids", "item 1"),
    (_mc(ids=[0, -1]), "hash_ids", "item 1"),
    (_mc(ids=[0, 1.0]), "hash_ids", "item 1"),
    (_mc(ids=[0]), "hash_ids", "has 1 ids, but input_length 1000 needs ceil(1000/512) = 2"),
    (_mc(ids=[0, 1, 2]), "hash_ids", "has 3 ids"),
    ({**_mc(), "session": "s"}, "session", "unknown field"),
    (_mc(ts=999), "timestamp", "goes backwards (0.999 after 1.0 at"),
]


@pytest.mark.parametrize(("record", "field", "what"), _MOONCAKE_BAD)
def test_malformed_mooncake_line_names_file_line_and_field(tmp_path, record, field, what):
    path = _write(tmp_path, [_mc(ts=1000), record])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: field '{field}': ")
    assert what in message


# ---------------------------------------------------------------- token JSONL reader


def test_token_jsonl_records(tmp_path):
    path = _write(
        tmp_path,
        [
            _tok([1, 2, 3, 4, 5], 2, session_id="s1", timestamp=0.5, request_id="first"),
            _tok([1, 2, 3, 4, 9], 3, timestamp=1),
            "",
            _tok([7], 1, session_id="s1", timestamp=1),
        ],
        name="mine.jsonl",
    )
    trace = load_trace(path)
    assert trace.name == "tokens/mine"
    a, b, c = trace.requests
    assert (a.request_id, a.session, a.arrival_s, a.output_len) == ("first", "s1", 0.5, 2)
    assert (b.request_id, b.session, b.arrival_s) == ("line-2", None, 1.0)
    assert c.request_id == "line-4" and c.prompt == TokenPrompt((7,))
    assert a.block_hashes(2) == b.block_hashes(2)  # 4 shared leading tokens
    assert a.token_ids(10) == [1, 2, 3, 4, 5]


def test_token_jsonl_without_timestamps_has_no_arrivals(tmp_path):
    trace = load_trace(_write(tmp_path, [_tok(), _tok()]))
    assert [r.arrival_s for r in trace.requests] == [None, None]


_TOKEN_BAD = [
    ({"output_len": 1}, "prompt_token_ids", "missing"),  # still detected as token JSONL: format comes from line 1
    (_tok([]), "prompt_token_ids", "is empty"),
    (_tok([1, -1]), "prompt_token_ids", "item 1"),
    (_tok([1, 2.5]), "prompt_token_ids", "item 1"),
    (_tok([True]), "prompt_token_ids", "item 0"),
    (_tok("1 2 3"), "prompt_token_ids", "list of integers"),
    ({"prompt_token_ids": [1]}, "output_len", "missing"),
    (_tok(out=0), "output_len", ">= 1"),
    (_tok(out=1.5), "output_len", "integer"),
    (_tok(session_id=3, timestamp=2), "session_id", "string"),
    (_tok(request_id=""), "request_id", "non-empty string"),
    (_tok(request_id="a"), "request_id", "duplicate 'a'"),
    (_tok(), "timestamp", "missing, but"),
    (_tok(timestamp="now"), "timestamp", "finite number"),
    (_tok(timestamp=0.5), "timestamp", "goes backwards"),
    (_tok(timestamp=2, max_tokens=3), "max_tokens", "unknown field (known fields: prompt_token_ids"),
]


@pytest.mark.parametrize(("record", "field", "what"), _TOKEN_BAD)
def test_malformed_token_line_names_file_line_and_field(tmp_path, record, field, what):
    path = _write(tmp_path, [_tok(request_id="a", timestamp=1.0), record])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: field '{field}': ")
    assert what in message


def test_timestamp_on_a_later_line_only_is_an_error(tmp_path):
    path = _write(tmp_path, [_tok(), "", _tok(timestamp=3.0)])
    with pytest.raises(TraceError, match=rf"^{path}:3: field 'timestamp': present, but {path}:1 has none"):
        load_trace(path)


# ---------------------------------------------------------------- lines, files and filters


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("7", "got int"),
        ("null", "got NoneType"),
    ],
)
@pytest.mark.parametrize("first", [_mc(), _tok()])
def test_non_object_lines(tmp_path, first, line, what):
    path = _write(tmp_path, [first, "", line])
    with pytest.raises(TraceError, match=rf"^{path}:3: .*{what}"):
        load_trace(path)


def test_first_line_not_json(tmp_path):
    path = _write(tmp_path, ["{oops", _mc()])
    with pytest.raises(TraceError, match=rf"^{path}:1: not valid JSON"):
        load_trace(path)


def test_unknown_format(tmp_path):
    path = _write(tmp_path, [{"prompt": "hello", "output_len": 3}])
    with pytest.raises(TraceError, match=rf"^{path}:1: cannot tell the trace format.*\['output_len', 'prompt'\]"):
        load_trace(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=f"trace file not found: {path}"):
        load_trace(path)


def test_not_a_file_and_not_utf8(tmp_path):
    with pytest.raises(TraceError, match=f"trace path is not a file: {tmp_path}"):
        load_trace(tmp_path)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(_tok()).encode() + b"\n" + b'{"prompt_token_ids": [1], "x": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=rf"^{path}:2: not UTF-8 text"):
        load_trace(path)


@pytest.mark.parametrize("lines", [[], ["", "  "]])
def test_empty_file(tmp_path, lines):
    path = _write(tmp_path, lines)
    with pytest.raises(TraceError, match=f"trace {path} is empty"):
        load_trace(path)


def test_filters_count_what_they_skip(tmp_path):
    lengths = [600, 2000, 700, 1500, 800, 900]
    path = _write(tmp_path, [_mc(0, n, 1, list(range(-(-n // 512)))) for n in lengths])
    trace = load_trace(path, max_requests=3)
    assert [r.prompt_len for r in trace.requests] == [600, 2000, 700]
    assert trace.skipped == {SKIP_BEYOND_MAX_REQUESTS: 3}
    trace = load_trace(path, max_prompt_tokens=1000)
    assert [r.prompt_len for r in trace.requests] == [600, 700, 800, 900]
    assert trace.skipped == {SKIP_OVER_MAX_PROMPT: 2}
    trace = load_trace(path, max_prompt_tokens=1000, max_requests=3)  # the first 3 that fit
    assert [r.request_id for r in trace.requests] == ["mooncake-1", "mooncake-3", "mooncake-5"]
    assert trace.skipped == {SKIP_OVER_MAX_PROMPT: 2, SKIP_BEYOND_MAX_REQUESTS: 1}
    assert trace.summary()["skipped"] == trace.skipped
    assert load_trace(path, max_requests=6).skipped == {}


def test_filters_that_leave_nothing(tmp_path):
    path = _write(tmp_path, [_mc()])
    with pytest.raises(TraceError, match="no request of .* is left after the filters"):
        load_trace(path, max_prompt_tokens=999)


@pytest.mark.parametrize("kwargs", [{"max_requests": 0}, {"max_prompt_tokens": -1}, {"max_requests": 2.0}])
def test_bad_filter_values(tmp_path, kwargs):
    with pytest.raises(TraceError, match=next(iter(kwargs))):
        load_trace(_write(tmp_path, [_mc()]), **kwargs)


def test_synthetic_parameters_with_a_file_are_refused(tmp_path):
    with pytest.raises(TraceError, match="only apply to load_trace"):
        load_trace(_write(tmp_path, [_mc()]), num_requests=5)


# ---------------------------------------------------------------- writer


def test_token_jsonl_round_trip_keeps_requests_and_sharing(tmp_path):
    trace = load_trace("synthetic", num_requests=120, seed=5)
    path = tmp_path / "synthetic.jsonl"
    assert write_token_jsonl(trace, path, vocab_size=BIG_VOCAB) == 120
    back = load_trace(path)
    assert [(r.request_id, r.session, r.arrival_s, r.output_len, r.prompt_len) for r in back.requests] == [
        (r.request_id, r.session, r.arrival_s, r.output_len, r.prompt_len) for r in trace.requests
    ]
    assert back.requests[17].token_ids(BIG_VOCAB) == trace.requests[17].token_ids(BIG_VOCAB)
    for block_size in (16, 37, 544):  # the same prompt content is shared, so the same hits
        assert back.prefix_reuse(block_size) == trace.prefix_reuse(block_size)
        # The token format keeps prompts, not the outputs' content: a later turn that repeats an
        # earlier output hits it only in the original trace, so its bound can only be higher.
        assert back.infinite_capacity_bound(block_size) <= trace.infinite_capacity_bound(block_size)


def test_writer_refuses_mixed_arrivals(tmp_path):
    timed, untimed = Request("a", TokenPrompt((1,)), 1, 0.0, None), Request("b", TokenPrompt((1,)), 1, None, None)
    trace = Trace("m", [timed, untimed])
    with pytest.raises(TraceError, match="some requests have arrival times"):
        write_token_jsonl(trace, tmp_path / "m.jsonl", 10)


# ---------------------------------------------------------------- synthetic workload


@pytest.fixture(scope="module")
def synthetic() -> Trace:
    return load_trace("synthetic")


def test_synthetic_is_deterministic_per_seed(synthetic):
    assert synthetic.name == "synthetic(seed=0)" and synthetic.source == "synthetic"
    again = generate(SyntheticConfig(), 0)
    assert again.requests == synthetic.requests
    other = load_trace("synthetic", seed=1)
    assert other.name == "synthetic(seed=1)"
    assert [r.prompt for r in other.requests] != [r.prompt for r in synthetic.requests]


def test_synthetic_mix_and_sizes(synthetic):
    reqs = synthetic.requests
    cfg = SyntheticConfig()
    assert len(reqs) == cfg.num_requests == 2000
    kinds = collections.Counter(r.session.split("-")[0] for r in reqs)
    assert kinds == {"chat": 1000, "fewshot": 400, "agent": 600}
    assert len({r.request_id for r in reqs}) == len(reqs)
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert 0.5 < len(reqs) / arrivals[-1] < 4  # about request_rate = 2 per second
    lengths = [r.prompt_len for r in reqs]
    assert max(lengths) <= cfg.max_prompt_len
    # Hard floors from the clipped draws: an agent prompt holds a context and a task.
    agent_floor = cfg.agent_context_len.lo + cfg.agent_task_len.lo
    assert all(r.prompt_len >= agent_floor for r in reqs if r.session.startswith("agent"))
    # Below 1,024 tokens there can only be early chat turns and few-shot prompts on a
    # short template. A system prompt is below 1,024 with p = Phi(ln(1024/1200)/0.5)
    # = 0.37, and a first turn adds a user message (median 150): about 0.3 of first
    # turns, a fifth of the chat requests (5 turns on average), so 0.5 x 0.2 x 0.3 =
    # 0.03 of all requests; a template is below 1,024 with p = Phi(ln(1024/2500)/0.5)
    # = 0.04, so 0.2 x 0.04 = 0.008. Expected share in range: about 0.96; 0.9 leaves
    # room for the Zipf draw of the 8 system prompts and 6 templates.
    assert sum(1024 <= n <= 32768 for n in lengths) / len(lengths) > 0.9
    assert all(r.output_len >= 1 for r in reqs)


def _sessions(trace: Trace) -> dict[str, list[tuple[int, Request]]]:
    by: dict[str, list[tuple[int, Request]]] = collections.defaultdict(list)
    for position, r in enumerate(trace.requests):
        by[r.session].append((position, r))
    return by


def test_synthetic_turns_extend_the_previous_prompt_and_output(synthetic):
    grown = 0
    for session, turns in _sessions(synthetic).items():
        if session.startswith("fewshot"):
            assert len(turns) == 1
        assert [r.request_id for _, r in turns] == [f"{session}-{i}" for i in range(len(turns))]
        for (_, prev), (_, cur) in pairwise(turns):
            n = len(prev.prompt.spans)
            assert cur.prompt.spans[:n] == prev.prompt.spans
            assert cur.prompt.spans[n][1] == prev.output_len  # the previous answer, then one new span
            assert len(cur.prompt.spans) == n + 2
            grown += 1
    assert grown > 500


def test_synthetic_sessions_are_interleaved(synthetic):
    """Two turns of a session are adjacent in the trace only if no other request arrived
    in the exponential gap between them. With other requests arriving at rate ``lam``,
    that happens with p = 1 / (1 + lam x mean gap): 1/61 for chat (30 s) and 1/9 for
    agents (4 s) at 2 requests/s. The expected share of adjacent turns follows from the
    trace's own rate and turn counts; the observed one must be close to it."""
    cfg = SyntheticConfig()
    reqs = synthetic.requests
    lam = len(reqs) / reqs[-1].arrival_s
    mean_gap = {"chat": cfg.chat_think_s, "agent": cfg.agent_step_gap_s}
    gaps, expected_adjacent = [], 0.0
    for session, turns in _sessions(synthetic).items():
        for (a, _), (b, _) in pairwise(turns):
            gaps.append(b - a)
            expected_adjacent += 1 / (1 + lam * mean_gap[session.split("-")[0]])
    observed = sum(g == 1 for g in gaps) / len(gaps)
    expected = expected_adjacent / len(gaps)
    assert min(gaps) >= 1 and abs(observed - expected) < 0.03, (observed, expected)
    assert observed < 0.2  # other requests usually come between two turns


def test_synthetic_shared_prefixes(synthetic):
    first_spans = collections.defaultdict(collections.Counter)
    for session, turns in _sessions(synthetic).items():
        first_spans[session.split("-")[0]][turns[0][1].prompt.spans[0]] += 1
    cfg = SyntheticConfig()
    pools = {"chat": cfg.num_system_prompts, "fewshot": cfg.num_templates, "agent": cfg.num_agent_contexts}
    for kind, pool in pools.items():
        counts = sorted(first_spans[kind].values(), reverse=True)
        assert 1 < len(counts) <= pool
        assert counts[0] > sum(counts) / len(counts)  # Zipf: the head is above the average
    agent_contexts = [span[1] for span in first_spans["agent"]]
    assert min(agent_contexts) >= cfg.agent_context_len.lo
    # With unlimited capacity every later turn hits at least the full blocks of its
    # session's previous prompt, which it re-sends (shared system prompts, templates
    # and contexts add more): a lower bound computed from the trace itself.
    hit, total = synthetic.infinite_capacity_bound(16)
    history = sum(prev.prompt_len // 16 * 16 for turns in _sessions(synthetic).values()
                  for (_, prev), _ in pairwise(turns))
    assert hit >= history and history / total > 0.5


def test_synthetic_parameters(tmp_path):
    params = {"num_requests": 50, "agent_fraction": 0.0, "chat_fraction": 0.8, "template_len": (900, 0.1, 800, 1000)}
    trace = load_trace("synthetic", **params)
    assert trace.name == (
        "synthetic(seed=0, num_requests=50, chat_fraction=0.8, agent_fraction=0.0,"
        " template_len=LogNormal(median=900, sigma=0.1, lo=800, hi=1000))"
    )
    assert collections.Counter(r.session.split("-")[0] for r in trace.requests) == {"chat": 40, "fewshot": 10}
    assert all(800 <= r.prompt.spans[0][1] <= 1000 for r in trace.requests if r.session.startswith("fewshot"))
    assert isinstance(SyntheticConfig(template_len=(900, 0.1, 800, 1000)).template_len, LogNormal)
    trace = load_trace("synthetic", num_requests=30, max_requests=10)
    assert len(trace.requests) == 10 and trace.skipped == {SKIP_BEYOND_MAX_REQUESTS: 20}


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"num_request": 10}, r"unknown synthetic parameter\(s\) \['num_request'\]; known: .*num_requests"),
        ({"chat_fraction": 0.9}, "must sum to 1"),
        ({"num_requests": 0}, "num_requests"),
        ({"user_message_len": (100, 1.0, 0, 50)}, "user_message_len"),
        ({"user_message_len": 100}, r"user_message_len must be \(median, sigma, lo, hi\)"),
        ({"request_rate": 0}, "request_rate"),
    ],
)
def test_bad_synthetic_parameters(kwargs, what):
    with pytest.raises(TraceError, match=what):
        load_trace("synthetic", **kwargs)


# ---------------------------------------------------------------- the real Mooncake trace


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace(require(MOONCAKE))


def test_mooncake_file_facts(mooncake):
    s = mooncake.summary()
    assert s["requests"] == 12_031
    assert s["prompt_tokens_max"] == 126_195
    assert round(s["prompt_tokens_mean"]) == 12_035
    assert round(s["output_tokens_mean"]) == 343
    assert s["sessions"] == 0 and s["skipped"] == {}
    assert {h[0] for h in mooncake.block_hashes(512)} == {mooncake.block_hashes(512)[0][0]}  # all start with id 0


def test_mooncake_infinite_cache_figures(mooncake):
    # SOURCE.md's figures count every hash_id as a block (partial tails too) and cap nothing;
    # a matched tail block adds its real length to the token-weighted figure.
    published = mooncake.prefix_reuse(512, partial_blocks=True, cap=False)
    assert (published.hit_blocks, published.total_blocks) == (105_710, 288_500)
    assert round(100 * published.block_hit_rate, 2) == 36.64
    assert round(100 * published.token_hit_rate, 2) == 37.36
    # With vLLM's rules (full blocks, hit capped at prompt_len - 1) the bound is a little lower.
    assert mooncake.infinite_capacity_bound(512) == (54_063_104, 144_793_823)
    hit, total = mooncake.infinite_capacity_bound(544)
    assert round(100 * hit / total, 2) == 33.78  # 544 does not divide 512: a block spanning a miss misses


def test_the_documented_token_jsonl_example_loads(tmp_path):
    doc = (Path(__file__).resolve().parents[1] / "docs/trace-format.md").read_text()
    example = doc.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.jsonl"
    path.write_text(example)
    trace = load_trace(path)
    assert [r.request_id for r in trace.requests] == ["chat-0-0", "qa-7", "chat-0-1"]
    assert trace.summary()["sessions"] == 1
    assert trace.infinite_capacity_bound(2) == (4, 15)  # chat-0-1 reuses chat-0-0's 4 tokens
