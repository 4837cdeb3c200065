"""RequestAdmission: the one per-request admission object of the simulator and the plugin."""

from __future__ import annotations

import pytest

from vllm_admission.core.admission import (
    ADMISSION_POLICIES,
    ADMIT,
    HOST,
    SKIP,
    TENTATIVE,
    AdmissionPolicy,
    CheckpointKind,
    HitProbe,
    RequestAdmission,
    SegmentCosts,
    checkpoint_kinds,
    get_admission,
    prompt_ends,
    register_admission,
    sequence_end,
    stock_admission,
)

B = 128
# P = 1000, O = 40: prompt end 896, sequence end floor(1039 / 128) * 128 = 1024; a junction at 512.
PROBE = HitProbe(prompt_len=1000, block_size=B, kv_hit=512, state_hit=256)


def decisions(name: str, total_len: int | None) -> dict[int, int]:
    adm = RequestAdmission(get_admission(name), PROBE, total_len=total_len)
    return {pos: adm.decide(pos) for pos in range(B, 1024 + 1, B)}


def test_known_length_never_tentative_and_writes_the_expected_states():
    # P = 1,000 tokens, O = 40, B = 128, a junction at 512 (the attention hit's block boundary
    # past the state hit): the chunk ends are every block boundary up to the prompt end 896
    # (floor(999 / 128) * 128), the sequence end 1,024 (floor(1,039 / 128) * 128).
    every = {128 * i for i in range(1, 9)}
    written_out = {
        "none": set(),
        "last": every,             # every chunk end, the prompt end, the sequence end
        "vllm": {512, 896},        # the junction and the prompt end
        "block": {512, 896},       # vllm without a smaller hash block size
        "marconi": {512, 1024},    # the junction and the sequence end
        "dense": every,
        "written": every,          # last's states, the junction among them
    }
    assert set(written_out) == set(ADMISSION_POLICIES)  # a new built-in needs its line here
    for name, want in written_out.items():
        got = decisions(name, 1040)
        assert TENTATIVE not in got.values(), name
        assert {p for p, d in got.items() if d == ADMIT} == want, name


def test_decide_follows_the_checkpoint_kinds_a_policy_admits():
    # The one rule decide() applies with a known length, for a policy that exists only
    # here: it admits junctions and the sequence end (marconi's kinds) but nothing else.
    class JunctionsAndEnds(AdmissionPolicy):
        name = "junctions-and-ends-test"
        summary = "test only"

        admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.SEQUENCE_END})

        def junction(self, probe):
            return probe.junction

    adm = RequestAdmission(JunctionsAndEnds(), PROBE, total_len=1040)
    got = {pos: adm.decide(pos) for pos in range(B, 1024 + 1, B)}
    assert {p for p, d in got.items() if d == ADMIT} == {512, 1024}
    assert checkpoint_kinds(1024, prompt_len=1000, total_len=1040, block_size=B,
                            junction=512) >= {CheckpointKind.SEQUENCE_END}


def test_unknown_length_keeps_marconis_sequence_end_tentative():
    got = decisions("marconi", None)
    assert {p for p, d in got.items() if d == ADMIT} == {512}  # the junction only
    assert {p for p, d in got.items() if d == TENTATIVE} == {896, 1024}  # at/after the prompt end
    assert all(d == SKIP for p, d in got.items() if p < 896 and p != 512)
    # Policies that keep no tentative sequence end decide the same with or without the length.
    plain = [n for n in ADMISSION_POLICIES if not get_admission(n).tentative_sequence_end]
    assert {"none", "last", "vllm", "dense"} <= set(plain) and "marconi" not in plain
    for name in plain:
        assert decisions(name, None) == decisions(name, 1040), name


def test_junction_and_stops():
    assert RequestAdmission(get_admission("vllm"), PROBE, total_len=None).junction == 512
    assert RequestAdmission(get_admission("last"), PROBE, total_len=None).junction == 0
    assert RequestAdmission(get_admission("vllm"), PROBE, total_len=None, junction=640).junction == 640
    assert RequestAdmission(get_admission("marconi"), PROBE, total_len=None).stops == (512,)
    assert RequestAdmission(get_admission("dense"), PROBE, total_len=None).stops == tuple(
        range(384, 897, 128))


def test_derived_attributes_follow_the_policys_answers():
    """uses_junction (overrides junction()), every_block (stops() at every boundary) and
    tentative_sequence_end (admits a sequence end it would not admit as a decode boundary) are
    derived from the policy's hooks, never declared."""
    derived = {n: (p.uses_junction, p.every_block, p.tentative_sequence_end)
               for n, p in ((n, get_admission(n)) for n in ("none", "last", "vllm", "marconi", "dense"))}
    assert derived == {"none": (False, False, False), "last": (False, False, False),
                       "vllm": (True, False, False), "marconi": (True, False, True),
                       "dense": (False, True, False)}
    assert stock_admission() == "vllm"
    with pytest.raises(TypeError, match="derived"):
        class Declared(AdmissionPolicy):  # the class statement is the test
            name, summary, admitted = "declared", "declares a derived attribute", frozenset()
            own_stops = True
    # every_block is declared, and gives the stops: declaring it beside stops() is refused.
    with pytest.raises(TypeError, match="every_block and its own stops"):
        class Both(AdmissionPolicy):  # the class statement is the test
            name, summary, admitted = "both", "every_block and its own stops", frozenset()
            every_block = True

            def stops(self, probe):
                return ()
    dense = get_admission("dense")
    assert dense.own_stops and dense.stops(HitProbe(1000, 128, 256, 256)) == (384, 512, 640, 768, 896)
    vllm = type(get_admission("vllm"))
    assert register_admission(vllm) is vllm   # the same class again: a no-op

    class Impostor(AdmissionPolicy):
        name, summary, admitted = "vllm", "another class under a taken name", frozenset()

    with pytest.raises(ValueError, match="already registered"):
        register_admission(Impostor)
    assert not Impostor.vllm_native and stock_admission() == "vllm"


def test_checkpoints_and_values_follow_record_and_unrecord():
    costs = SegmentCosts(block_size=B, num_attention_groups=1, num_state_groups=1,
                         bytes_per_block=10, segment_flops=lambda end, start: float(end - start))
    adm = RequestAdmission(get_admission("marconi"), PROBE, total_len=None)
    asked = []

    def cached(i: int) -> bool:
        asked.append(i)
        return i == 0  # the state after block 0 (128) is in the cache

    assert adm.checkpoints(cached) == [128, 256]  # 128 cached below the hit, then the hit
    adm.record(896)
    # The segment (256, 896]: 640 FLOPs over 5 attention blocks and 1 state block of 10 bytes.
    assert adm.block_value(896, True, costs, cached) == pytest.approx(640 / 60)
    assert adm.block_value(256, True, costs, cached) == pytest.approx(128 / 20)   # (128, 256]
    assert adm.block_value(512, False, costs, cached) == pytest.approx(640 / 60)  # inside it
    assert adm.block_value(640, True, costs, cached) == 0.0   # a state that is no checkpoint
    # A superseded tentative end: the values must be recomputed although the count is the same.
    adm.unrecord(896)
    adm.record(1024)
    assert adm.block_value(896, True, costs, cached) == 0.0
    assert adm.block_value(1024, True, costs, cached) == pytest.approx(
        (1024 - 256) / ((1024 - 256) // B * 10 + 10))
    assert adm.block_value(640, False, costs, cached) == adm.block_value(1024, True, costs, cached)
    assert adm.block_value(1152, False, costs, cached) == 0.0  # past the last checkpoint
    assert asked == [0, 1]  # the cache was asked once
    adm.unrecord(4096)  # never recorded: ignored
    assert adm.admitted == [1024]


@pytest.mark.parametrize("name", sorted(ADMISSION_POLICIES))
def test_kept_as_sequence_end_is_what_a_live_engine_caches_tentatively(name):
    """Among the states the simulator admits (length known), exactly those the engine
    (length unknown) decides TENTATIVE are kept only as the sequence end."""
    known = RequestAdmission(get_admission(name), PROBE, total_len=1040)
    live = RequestAdmission(get_admission(name), PROBE, total_len=None)
    for pos in range(B, 1024 + 1, B):
        if known.decide(pos) == ADMIT:
            assert known.kept_as_sequence_end(pos) == (live.decide(pos) == TENTATIVE), pos
    assert known.kept_as_sequence_end(1024) == (name == "marconi")


# --- vLLM's prefix_cache_retention_interval: what the stock policy keeps ---------------
@pytest.mark.parametrize("interval,kept", [
    (0, {512, 896}),                               # junction and prompt end (vLLM's default)
    (384, {384, 512, 768, 896}),                   # ... plus every multiple of 384 written
    (256, {256, 512, 768, 896, 1024}),             # 1024: a decode boundary on the grid
    (None, {128 * i for i in range(1, 9)}),        # every state written
])
def test_vllm_follows_the_engines_retention_interval(interval, kept):
    """MambaManager.reachable_block_mask (vllm/v1/core/single_type_kv_cache_manager.py):
    0 keeps the reachable boundaries, N > 0 adds the states on the N grid, None keeps all."""
    policy = get_admission("vllm", retention_interval=interval)
    assert policy.retention_interval == interval
    for total_len in (1040, None):  # the simulator knows the length, a live engine does not
        adm = RequestAdmission(policy, PROBE, total_len=total_len)
        got = {p for p in range(B, 1024 + 1, B) if adm.decide(p) == ADMIT}
        assert got == kept, (interval, total_len)
        assert TENTATIVE not in {adm.decide(p) for p in range(B, 1024 + 1, B)}
    # The junction stays a chunk stop whatever is retained (_mamba_block_aligned_split).
    assert policy.stops(PROBE) == (512,)


def test_only_the_stock_policy_follows_the_retention_interval():
    for name in ADMISSION_POLICIES:
        fixed = decisions(name, 1040)
        adm = RequestAdmission(get_admission(name, retention_interval=None), PROBE, total_len=1040)
        dense = {pos: adm.decide(pos) for pos in range(B, 1024 + 1, B)}
        assert (dense == fixed) == (not get_admission(name).vllm_native), name


@pytest.mark.parametrize("bad", [-128, 1.5, "256", True])
def test_a_retention_interval_vllm_refuses_is_an_error(bad):
    with pytest.raises(ValueError, match="prefix_cache_retention_interval"):
        get_admission("vllm", retention_interval=bad)


# --- hand-computed positions: kinds, prompt and sequence ends, the hash block, the host tier --
def test_checkpoint_kinds_of_hand_picked_positions():
    # P = 1,000, total 1,040, B = 128, a junction at 512: prompt end 896, sequence end 1,024.
    K = CheckpointKind

    def kinds(pos, total_len=1040, period=0):
        return checkpoint_kinds(pos, prompt_len=1000, total_len=total_len, block_size=B,
                                junction=512, period=period)

    assert kinds(128) == {K.CHUNK_END}
    assert kinds(512) == {K.CHUNK_END, K.JUNCTION}
    assert kinds(896) == {K.CHUNK_END, K.PROMPT_END, K.PROMPT_UNIT_END}  # no finer unit: the unit end is PROMPT_END
    assert K.TAIL is K.PROMPT_UNIT_END  # the former spelling, kept for other packages' policies
    assert kinds(1024) == {K.DECODE, K.SEQUENCE_END}
    assert kinds(1024, total_len=None) == {K.DECODE}          # a live engine: end unknown
    assert kinds(1152, total_len=2000) == {K.DECODE}
    assert kinds(256, period=256) == {K.CHUNK_END, K.PERIODIC}
    assert kinds(384, period=256) == {K.CHUNK_END}
    assert kinds(1024, period=256) == {K.DECODE, K.SEQUENCE_END, K.PERIODIC}


def test_prompt_and_sequence_ends_by_hand():
    # Without EAGLE a resend hits at most P - 1 tokens: floor((P - 1) / B) * B.
    assert prompt_ends(1000, 128) == (896,)
    assert prompt_ends(1024, 128) == (896,)
    assert prompt_ends(1025, 128) == (1024,)
    assert prompt_ends(100, 128) == ()
    # EAGLE/MTP: one block below each of floor((P - 1) / B) * B and floor(P / B) * B.
    assert prompt_ends(1000, 128, eagle=True) == (768,)
    assert prompt_ends(1024, 128, eagle=True) == (768, 896)
    assert prompt_ends(200, 128, eagle=True) == ()
    # The last block boundary the sequence reaches: floor((total - 1) / B) * B.
    assert sequence_end(1000, 1040, 128) == 1024
    assert sequence_end(1000, 1010, 128) == 896
    # EAGLE/MTP: an extending request matches the KV of at most L = floor((total - 1) / B) * B
    # tokens and drops a block, so the end is the highest state written at or below L - B:
    # L - B past the prompt (a decode boundary) ...
    assert sequence_end(1000, 1200, 128, eagle=True) == 1024   # L = 1152
    # ... or the prompt's end on a block boundary (the last prefill chunk ends there) ...
    assert sequence_end(1024, 1200, 128, eagle=True) == 1024   # L = 1152
    # ... else the prompt checkpoint, where vLLM ends a chunk (a block below the last
    # boundary a resend reaches).
    assert sequence_end(1000, 1040, 128, eagle=True) == 768    # L = 1024: L - B inside the prompt
    assert sequence_end(1000, 1010, 128, eagle=True) == 768    # L = 896
    assert sequence_end(1024, 1100, 128, eagle=True) == 896    # L = 1024 = P
    # EAGLE with a hash block size below the block size: the last state written, L when decode
    # crossed a boundary, else the prompt checkpoint or a higher block-aligned unit end.
    assert sequence_end(1000, 1040, 128, eagle=True, prompt_unit_end=896) == 1024
    assert sequence_end(1000, 1010, 128, eagle=True, prompt_unit_end=896) == 896
    assert sequence_end(1000, 1010, 128, eagle=True, prompt_unit_end=960) == 768  # inside a block


def test_a_finer_hash_unit_gives_the_prompt_unit_end_positions():
    # P = 1,000, B = 128, u = 32: the prompt's unit end floor(999 / 32) * 32 = 992 lies
    # inside the last block (896, 1024).
    vllm = RequestAdmission(get_admission("vllm"), PROBE, total_len=1040, hash_block_size=32)
    assert (vllm.prompt_unit_end, vllm.state_sub_block_end, vllm.attn_sub_block_end,
            vllm.prompt_end) == (992, 992, 992, 896)
    assert vllm.decide(992) == ADMIT and vllm.keeps_prompt_unit_end()  # vllm keeps PROMPT_UNIT_END
    block = RequestAdmission(get_admission("block"), PROBE, total_len=1040, hash_block_size=32)
    assert block.decide(992) == SKIP and not block.keeps_prompt_unit_end()  # block does not
    assert block.decide(896) == ADMIT                                # but the prompt end
    # EAGLE: the lookup drops one unit, so the state's unit end is a unit lower (960); the
    # attention groups' sub-block key stays where a lookup matches (floor(1,000 / 32) * 32 = 992).
    eagle = RequestAdmission(get_admission("vllm"), PROBE, total_len=1040, hash_block_size=32,
                             eagle=True)
    assert (eagle.prompt_unit_end, eagle.state_sub_block_end, eagle.attn_sub_block_end,
            eagle.prompt_end) == (960, 960, 992, 768)
    # A unit end on a block boundary is no sub-block position: P = 897 -> 896.
    aligned = RequestAdmission(get_admission("vllm"), HitProbe(897, B, 512, 256), total_len=900,
                               hash_block_size=32)
    assert (aligned.prompt_unit_end, aligned.state_sub_block_end, aligned.attn_sub_block_end) == (896, 0, 0)
    # Without a finer unit there is no unit end at all.
    plain = RequestAdmission(get_admission("vllm"), PROBE, total_len=1040)
    assert (plain.prompt_unit_end, plain.state_sub_block_end, plain.attn_sub_block_end) == (0, 0, 0)
    assert not plain.keeps_prompt_unit_end()


def test_a_host_policy_adds_host_only_states_and_their_stops():
    # vllm on the GPU (the junction 512 and the prompt end 896), dense for the host tier.
    adm = RequestAdmission(get_admission("vllm"), PROBE, total_len=None,
                           host_policy=get_admission("dense"))
    assert adm.host_stops == (384, 640, 768, 896)
    assert adm.stops == (384, 512, 640, 768, 896)
    got = {p: adm.decide(p) for p in range(B, 1024 + 1, B)}
    assert got == {128: HOST, 256: HOST, 384: HOST, 512: ADMIT, 640: HOST, 768: HOST,
                   896: ADMIT, 1024: SKIP}  # host-only states lie inside the prompt
    alone = RequestAdmission(get_admission("vllm"), PROBE, total_len=None)
    assert alone.host_stops == () and HOST not in {alone.decide(p) for p in got}


def test_cached_live_is_admitted_host_or_a_possible_sequence_end():
    marconi = RequestAdmission(get_admission("marconi"), PROBE, total_len=None)
    live = {p for p in range(B, 1024 + 1, B) if marconi.cached_live(p)}
    assert live == {512, 896, 1024}  # the junction, then every state from the prompt end
    vllm = RequestAdmission(get_admission("vllm"), PROBE, total_len=None)
    assert {p for p in range(B, 1024 + 1, B) if vllm.cached_live(p)} == {512, 896}


class _Block:
    """What RequestTracker reads of vLLM's KVCacheBlock."""

    is_null = False

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.block_hash: object | None = None


class _Request:
    def __init__(self, prompt_len: int) -> None:
        self.request_id = "r"
        self.num_prompt_tokens = prompt_len


@pytest.mark.parametrize("eagle", [False, True])
@pytest.mark.parametrize("prompt_len,total_len", [
    (1000, 1010), (1000, 1040), (1000, 1200), (1000, 1500), (1024, 1030), (1024, 1100),
    (1024, 1200), (1100, 1160), (300, 700)])
def test_the_live_tracker_keeps_the_sequence_end_the_simulator_caches(prompt_len, total_len, eagle):
    """A live ``marconi`` request (length unknown) caches each state at or after its prompt
    end tentatively; when it finishes, the one state still cached is the one the simulator
    (length known) admits, and every other was dropped. Under EAGLE the end lags a block, so
    the tracker keeps two tentative states until the finish (``RequestTracker.settle``)."""
    from vllm_admission.plugin.requests import RequestTracker

    tracker = RequestTracker(get_admission("marconi"), None, block_size=B, first_state=0,
                             state_groups=(0,), partial_hash_block_size=None, eagle=eagle)
    request = _Request(prompt_len)
    tracker.on_lookup(request, 0, 0)
    track = tracker.track(request)
    known = RequestAdmission(get_admission("marconi"), HitProbe(prompt_len, B, 0, 0),
                             total_len=total_len, eagle=eagle)
    # The states align mode writes from the prompt checkpoint on: the checkpoint (a chunk
    # ends there), the prompt's end on a boundary, every boundary decode crosses.
    last = (total_len - 1) // B * B
    written = sorted({known.prompt_end, *(p for p in range(B, last + 1, B) if p >= prompt_len)} - {0})
    blocks = [_Block(i) for i in range(last // B + 1)]

    def drop(block):
        block.block_hash = None

    most_held = 0
    for pos in written:
        i = pos // B - 1
        admitted, tentative, _ = tracker.decide(track, i, i + 1, blocks)
        assert (admitted, tentative) == ([], [pos])
        blocks[i].block_hash = ("state", pos)
        tracker.supersede(track, 0, tentative, blocks, drop)
        most_held = max(most_held, sum(b.block_hash is not None for b in blocks))
    tracker.settle(track, total_len, drop)
    cached = [(b.block_id + 1) * B for b in blocks if b.block_hash is not None]
    assert cached == [p for p in written if known.decide(p) == ADMIT]
    assert len(cached) == 1
    assert most_held == min(len(written), 2 if eagle else 1)
    if eagle and last - B >= prompt_len:
        assert cached == [last - B]      # not the last state written: a lookup drops that block
