"""The reference engine decodes speculatively and losslessly (greedy-equivalent)."""

from __future__ import annotations

import random

import pytest

from pytest_specperf.engines.reference.engine import GenRequest, GenResult, RequestError


def _prompt(seed: int, n: int = 96) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 4096) for _ in range(n)]


@pytest.mark.parametrize("layout", ["contiguous", "fragmented"])
@pytest.mark.parametrize("block", [2, 4, 8, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dflash_equals_greedy(tiny_engine_factory, seed, block, layout):
    spec = tiny_engine_factory("DFLASH", block)
    greedy = tiny_engine_factory("NONE")
    req = GenRequest(rid=f"s{seed}", max_new_tokens=48, input_ids=_prompt(seed), ignore_eos=True)
    for eng in (spec, greedy):
        eng.set_kv_layout(layout, 1.0, seed)
    out_spec = spec.generate([req])[0]
    out_greedy = greedy.generate([req])[0]
    assert out_spec.output_ids == out_greedy.output_ids
    assert len(out_spec.output_ids) == 48
    # real speculation happened: fewer target forwards than tokens
    assert out_spec.spec_verify_ct < out_greedy.spec_verify_ct
    if layout == "fragmented":
        assert out_spec.kv_fragmentation > 0.9


@pytest.mark.parametrize("layout", ["contiguous", "fragmented"])
def test_long_synthetic_context_lossless(tiny_engine_factory, layout):
    """Past the synthetic prefill, DFLASH and NONE agree at a long context too."""
    spec, greedy = tiny_engine_factory("DFLASH", 8), tiny_engine_factory("NONE")
    req = GenRequest(rid="long", max_new_tokens=40, context_len=20000, ignore_eos=True, seed=7)
    outs = []
    for eng in (spec, greedy):
        eng.set_kv_layout(layout, 1.0, 3)
        outs.append(eng.generate([req])[0].output_ids)
    assert outs[0] == outs[1]


def test_batch_equals_single(tiny_engine_factory):
    """Lockstep batch decoding gives each request the tokens it gets alone."""
    eng = tiny_engine_factory("DFLASH", 8)
    reqs = [
        GenRequest(
            rid=f"b{i}", max_new_tokens=24, input_ids=_prompt(10 + i, 40 + 9 * i), ignore_eos=True
        )
        for i in range(3)
    ]
    together = eng.generate(reqs)
    alone = [eng.generate([r])[0] for r in reqs]
    assert [r.output_ids for r in together] == [r.output_ids for r in alone]


def test_mean_acceptance_is_not_trivial(tiny_engine_factory):
    """Acceptance comes from token matches and is above 1.5 tokens per step (tiny config)."""
    eng = tiny_engine_factory("DFLASH", 8)
    steps = tokens = 0
    for seed in range(4):
        r = eng.generate(
            [
                GenRequest(
                    rid=f"a{seed}", max_new_tokens=96, context_len=8192, ignore_eos=True, seed=seed
                )
            ]
        )[0]
        steps += r.spec_verify_ct
        tokens += r.completion_tokens - 1
    mean = tokens / steps
    assert 1.5 < mean < 8.0, mean


def test_simulated_acceptance_pins_the_mean(tiny_engine_factory):
    eng = tiny_engine_factory("DFLASH", 8, simulate=3.5)
    r = eng.generate(
        [GenRequest(rid="sim", max_new_tokens=401, input_ids=_prompt(3), ignore_eos=True, seed=1)]
    )[0]
    assert abs(r.spec_accept_length - 3.5) < 0.4
    again = eng.generate(
        [GenRequest(rid="sim", max_new_tokens=401, input_ids=_prompt(3), ignore_eos=True, seed=1)]
    )[0]
    assert again.output_ids == r.output_ids  # seeded: the same run to run


def test_eos_stops_unless_ignored(tiny_engine_factory):
    from pytest_specperf.engines.reference.engine import EOS_TOKEN_ID

    eng = tiny_engine_factory("NONE")
    # find the first prompt whose greedy continuation hits EOS within 64 tokens, a full
    # batch of candidates at a time (one by one took 35 s on a slow box)
    batch = eng.cfg.max_batch_size
    seed = None
    for first in range(0, 200, batch):
        seeds = range(first, min(first + batch, 200))
        outs = eng.generate(
            [GenRequest(rid=f"c{s}", max_new_tokens=64, input_ids=_prompt(s, 8), ignore_eos=True)
             for s in seeds]
        )  # fmt: skip
        seed = next((s for s, o in zip(seeds, outs) if EOS_TOKEN_ID in o.output_ids), None)
        if seed is not None:
            break
    if seed is None:
        pytest.skip("no EOS in 200 greedy continuations")
    ids = _prompt(seed, 8)
    # the continuation alone, as the stopped request decodes it
    free = eng.generate(
        [GenRequest(rid="e", max_new_tokens=64, input_ids=ids, ignore_eos=True)]
    )[0].output_ids
    assert EOS_TOKEN_ID in free
    stopped = eng.generate([GenRequest(rid="e", max_new_tokens=64, input_ids=ids)])[0]
    assert stopped.output_ids == free[: free.index(EOS_TOKEN_ID) + 1]
    assert stopped.finish_reason == "stop"


@pytest.mark.parametrize("algorithm", ["DFLASH", "NONE"])
def test_max_decode_steps_ends_a_request_on_its_step(tiny_engine_factory, algorithm):
    """A step limit ends the request after that many decode steps, whatever the
    acceptance, and what it produced is the start of the unlimited continuation."""
    eng = tiny_engine_factory(algorithm)

    def run(steps: int | None) -> GenResult:
        req = GenRequest(rid="s", max_new_tokens=200, context_len=4096, ignore_eos=True,
                         seed=3, max_decode_steps=steps)  # fmt: skip
        return eng.generate([req])[0]

    free = run(None)
    assert free.spec_verify_ct > 5
    for steps in (1, 5):
        capped = run(steps)
        assert capped.spec_verify_ct == steps and capped.finish_reason == "length"
        assert capped.output_ids == free.output_ids[: len(capped.output_ids)]
    # max_new_tokens still ends a request before its step limit
    short = eng.generate([GenRequest(rid="t", max_new_tokens=3, context_len=4096,
                                     ignore_eos=True, seed=3, max_decode_steps=50)])[0]  # fmt: skip
    assert short.completion_tokens == 3 and short.spec_verify_ct < 50
    with pytest.raises(RequestError, match="max_decode_steps must be at least 1, got 0"):
        run(0)


def test_graph_mode_forward_matches_eager(tiny_engine_factory):
    """The static-shape forward captured in CUDA graphs gives the eager forward's result."""
    import torch

    from pytest_specperf.engines.reference.attention import plan_reads
    from pytest_specperf.engines.reference.engine import _Live
    from pytest_specperf.engines.reference.graphs import page_bucket, static_inputs
    from pytest_specperf.engines.reference.model import PlannedReads, SeqRows

    eng = tiny_engine_factory("DFLASH", 8)
    eng.set_kv_layout("fragmented", 0.5, 3)
    lives = [
        _Live(req=GenRequest(f"r{i}", 4, context_len=n, seed=i), pages=[])
        for i, n in enumerate((3000, 1700))
    ]
    try:
        for lr in lives:
            eng._prefill(lr)
            eng._ensure_pages(lr, lr.seq_len + 8)
        t = 8
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(3, 4096, (2 * t,), generator=gen)
        positions = torch.cat([torch.arange(lr.seq_len, lr.seq_len + t) for lr in lives])
        slots = torch.tensor([s for lr in lives for s in eng._slots(lr, lr.seq_len, t)])
        eager = PlannedReads(
            [
                SeqRows(i * t, (i + 1) * t, plan_reads(lr.pages, lr.seq_len, 16, "cpu"))
                for i, lr in enumerate(lives)
            ]
        )
        l1, f1 = eng.target.forward(tokens, positions, eager, eng.kv, slots)
        bucket = page_bucket(max(-(-lr.seq_len // 16) for lr in lives))
        padded = static_inputs(
            [lr.pages for lr in lives], [lr.seq_len for lr in lives], bucket, "cpu"
        )
        l2, f2 = eng.target.forward(tokens, positions, padded, eng.kv, slots)
        assert torch.allclose(l1, l2, atol=1e-4) and torch.allclose(f1, f2, atol=1e-4)
        assert torch.equal(l1.argmax(-1), l2.argmax(-1))
        anchors = torch.tensor([lr.anchor for lr in lives])
        pos = torch.tensor([lr.seq_len for lr in lives])
        cond = torch.stack([lr.cond for lr in lives])
        plans = [plan_reads(lr.pages, lr.seq_len, 16, "cpu") for lr in lives]
        d1 = eng.drafter.draft(anchors, pos, cond, plans, eng.kv, t)
        d2 = eng.drafter.draft(anchors, pos, cond, padded, eng.kv, t)
        assert torch.equal(d1, d2)
    finally:
        for lr in lives:
            eng.allocator.free(lr.pages)


def test_engine_reports_eager_on_cpu(tiny_engine_factory):
    eng = tiny_engine_factory("DFLASH", 8)
    eng.generate([GenRequest(rid="g", max_new_tokens=20, input_ids=_prompt(1), ignore_eos=True)])
    info = eng.info()
    assert info["cuda_graphs"] is None
    assert info["graph_counters"]["target_verify"]["replay"] == 0
    assert info["graph_counters"]["target_verify"]["eager"] > 0
