"""Reference outputs for the stand-in ``sgl_kernel``'s bookkeeping ops: SGLang's own Triton
kernels for the same operations, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET=1 python tests/sglang_cpu/triton_reference.py OUT.pt`` (the unit tests run
it so, without ``SGLANG_USE_CPU_ENGINE``: SGLang then takes its Triton path) writes
``{case: {"op": stand-in op name, "args": [...], "out": [indices of mutated args],
"expected": [their values after the Triton kernel]}}`` with ``torch.save``. Inputs are seeded
and shaped as SGLang's draft/verify loop makes them (EAGLE's draft tree included, topk 1 and
topk > 1).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

Case = dict[str, Any]


def _case(op: str, args: list[Any], out: list[int], run: Any) -> Case:
    ref = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run(ref)
    return {"op": op, "args": args, "out": out, "expected": [ref[i] for i in out]}


def pools(g: torch.Generator) -> dict[str, Case]:
    from sglang.kernels.ops.speculative.cache_locs import (
        assign_draft_cache_locs_contiguous,
        assign_extend_cache_locs,
    )
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    cases: dict[str, Case] = {}
    rows, width = 6, 96
    table = torch.randperm(rows * width, generator=g).reshape(rows, width).to(torch.int32)
    idx = torch.tensor([4, 1, 3], dtype=torch.int64)
    start = torch.tensor([0, 17, 40], dtype=torch.int64)
    end = torch.tensor([33, 17, 90], dtype=torch.int64)  # an empty range in the middle
    n = int((end - start).sum())
    locs = torch.randperm(5000, generator=g)[:n].to(torch.int64)
    cases["assign_req_to_token_pool"] = _case(
        "assign_req_to_token_pool_cpu",
        [idx, table, start, end, locs, width],
        [1],
        lambda a: assign_req_to_token_pool[(3,)](*a[:5], width, 4),
    )
    out = torch.full((n,), -7, dtype=torch.int64)
    cases["assign_extend_cache_locs"] = _case(
        "assign_extend_cache_locs_cpu",
        [idx, table, start, end, out, width],
        [4],
        lambda a: assign_extend_cache_locs[(3,)](*a[:5], width, 4),
    )
    for topk, steps in ((1, 3), (2, 3)):
        seq = torch.tensor([5, 30, 61], dtype=torch.int64)
        out = torch.full((3 * topk * steps,), -7, dtype=torch.int64)
        cases[f"assign_draft_cache_locs_contiguous_topk{topk}"] = _case(
            "assign_draft_cache_locs_contiguous_cpu",
            [idx, table, seq, out, width, topk, steps],
            [3],
            lambda a, t=topk, s=steps: assign_draft_cache_locs_contiguous[(3,)](
                a[0], a[1], a[2], a[3], width, t, s, BS=3
            ),
        )
    return cases


def accept(g: torch.Generator) -> dict[str, Case]:
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens

    cases: dict[str, Case] = {}
    bs, stride = 4, 5
    tokens = torch.randint(0, 4000, (bs, stride), generator=g, dtype=torch.int64)
    lens = torch.tensor([1, 5, 3, 2], dtype=torch.int32)
    bonus = torch.full((bs,), -7, dtype=torch.int64)
    cases["fill_bonus_tokens"] = _case(
        "fill_bonus_tokens_cpu",
        [tokens, lens, bonus, stride],
        [2],
        lambda a: fill_bonus_tokens[(bs,)](*a),
    )
    accept_index = torch.tensor([0, 1, -1, -1, 4, -1, -1, -1, 8, 9, 10, 11], dtype=torch.int64)
    out_loc = torch.randperm(900, generator=g)[:12].to(torch.int64)
    acc_out = torch.full((int((accept_index != -1).sum()),), -7, dtype=torch.int64)
    cases["fill_accept_out_cache_loc"] = _case(
        "fill_accept_out_cache_loc_cpu",
        [accept_index, out_loc, acc_out],
        [2],
        lambda a: fill_accept_out_cache_loc[(12,)](*a, 16),
    )
    return cases


def draft_tree(
    g: torch.Generator, bs: int, topk: int, steps: int, num_verify: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(parent_list, top_scores_index, draft_tokens) as EAGLE's multi-step draft and
    ``eagle_utils.organize_draft_results`` make them, from random draft distributions."""
    from sglang.srt.speculative.eagle_utils import organize_draft_results

    score_list, token_list, parents_list = [], [], []
    p = torch.rand((bs, topk), generator=g).sort(dim=1, descending=True).values
    tok = torch.randint(0, 5, (bs, topk), generator=g)  # a tiny vocabulary: real matches
    score_list.append(p.unsqueeze(1))
    token_list.append(tok)
    parents_list.append(torch.arange(-1, topk).expand(bs, topk + 1))
    scores = p
    for i in range(1, steps):
        child_p = torch.rand((bs, topk, topk), generator=g)
        expand = scores.unsqueeze(2) * child_p
        top_p, top_i = torch.topk(expand.flatten(1), topk, dim=-1)
        scores = top_p
        score_list.append(expand)
        token_list.append(torch.randint(0, 5, (bs, topk * topk), generator=g))
        parents_list.append(top_i + (topk * topk * (i - 1) + topk))
    return organize_draft_results(score_list, token_list, parents_list, num_verify)


def trees(g: torch.Generator) -> dict[str, Case]:
    from sglang.kernels.ops.speculative.spec_tree import (
        sgl_build_tree_kernel_triton,
        verify_tree_greedy_triton,
    )

    cases: dict[str, Case] = {}
    for topk, steps, num_verify in ((1, 3, 4), (2, 3, 5), (4, 3, 8)):
        bs = 3
        parent_list, selected, draft = draft_tree(g, bs, topk, steps, num_verify)
        seq = torch.tensor([7, 12, 3], dtype=torch.int64)
        for mode, mask_len in (
            (0, num_verify * (int(seq.sum()) + num_verify * bs)),
            (1, num_verify * num_verify * bs),
        ):
            mask = torch.ones(mask_len, dtype=torch.bool)
            positions = torch.full((bs * num_verify,), -7, dtype=torch.int64)
            r_index = torch.full((bs, num_verify), -7, dtype=torch.int64)
            r_next = torch.full((bs, num_verify), -1, dtype=torch.int64)
            r_sib = torch.full((bs, num_verify), -1, dtype=torch.int64)
            args = [
                parent_list,
                selected,
                seq,
                mask,
                positions,
                r_index,
                r_next,
                r_sib,
                topk,
                steps,
                num_verify,
                mode,
            ]
            case = _case(
                "build_tree_kernel_efficient_cpu",
                args,
                [3, 4, 5, 6, 7],
                lambda a: sgl_build_tree_kernel_triton(*a),
            )
            cases[f"build_tree_topk{topk}_mode{mode}"] = case
        r_index, r_next, r_sib = case["expected"][2:]
        bonus = torch.randint(0, 5, (bs, 1), generator=g)
        candidates = torch.cat([bonus, draft], dim=1)
        target = torch.randint(0, 5, (bs, num_verify), generator=g)
        # let the target agree with the draft along some path, so that tokens get accepted
        target[:, 0] = candidates[:, int(r_next[0, 0])] if int(r_next[0, 0]) >= 0 else 0
        predicts = torch.full((bs * num_verify,), -7, dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_num = torch.full((bs,), -7, dtype=torch.int32)
        args = [predicts, accept_index, accept_num, candidates, r_index, r_next, r_sib, target]
        cases[f"verify_tree_greedy_topk{topk}"] = _case(
            "verify_tree_greedy_cpu", args, [0, 1, 2], lambda a: verify_tree_greedy_triton(*a)
        )
    return cases


def main(out: str) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("SGLANG_USE_CPU_ENGINE"):
        print("run with TRITON_INTERPRET=1 and without SGLANG_USE_CPU_ENGINE", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(29)
    cases = {**pools(g), **accept(g), **trees(g)}
    torch.save(cases, out)
    print(f"{len(cases)} reference cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
