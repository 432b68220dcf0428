"""Decoding on the device: the loop behind :meth:`LocalJudge.greedy` and :meth:`LocalJudge.generate_from`, and the
CUDA graph of one decode step.

Nothing in a decode step waits for the host: the next token is chosen on the device (argmax, ties to the
lowest id as ``generate(do_sample=False)``, or drawn from the device's generator), every row's choice,
log-probability and top alternatives are written into device buffers indexed by the row's place in the
caller's batch, and which rows are done (end-of-sequence token or budget) is a device mask. The host
looks at the state only every ``sync_every`` steps (are all rows done? may the finished rows be dropped?
which logits are to be kept?), and once at the end to read the tokens. Results do not depend on
``sync_every`` or on dropping finished rows: a done row is fed the padding token and its outputs are not
read.

:class:`DecodeGraph` captures one decode step (its cache has static shapes and a device-side cursor,
:mod:`capreward.judges.prefix_cache`) in a ``torch.cuda.CUDAGraph`` after one eager step on a side stream
(the warm-up), and replays it: one launch per step instead of the model's hundreds. The first replay of a
judge's first graph is checked against the eager step on a copy of the state; any failure (capture
refused, a different result) falls back to eager steps with a warning, so a graph never changes a score.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

import torch

if TYPE_CHECKING:
    from .local import DecodeState, LocalJudge

log = logging.getLogger(__name__)

#: Relative tolerance of the first graph's self-check (the replay against the eager step, same inputs).
GRAPH_CHECK_TOLERANCE = 1e-3
#: Decode steps a row's cache makes room for at a time.
RESERVE_STEPS = 64


@dataclass
class GreedyOutput:
    """Result of :meth:`LocalJudge.greedy` for N rows.

    ``tokens[n]`` are row n's generated ids up to, not including, the end-of-sequence token;
    ``finished[n]`` says whether it produced one within the step budget; ``logits[n]`` maps a step t of
    row n to the raw next-token logits (V,) float32 that chose its t-th token (every step, or the steps
    whose token is one of ``keep_tokens``; None if logits were not kept).
    """

    tokens: list[list[int]]
    finished: list[bool]
    logits: list[dict[int, torch.Tensor]] | None


@dataclass
class DecodeOutput(GreedyOutput):
    """Result of :meth:`LocalJudge.generate_from`: :class:`GreedyOutput` plus, when asked, each written token's
    log-probability under the model (``logprobs[n][t]``, before any temperature) and the ``top`` most
    likely tokens at each step (``top_ids[n][t]``, ``top_logprobs[n][t]``), aligned with ``tokens[n]``."""

    logprobs: list[list[float]] | None = None
    top_ids: list[list[list[int]]] | None = None
    top_logprobs: list[list[list[float]]] | None = None
    graph_steps: int = 0  # steps run as a CUDA graph replay
    syncs: int = 0  # times the host read the device state


class DecodeGraph:
    """One decode step of ``state`` captured as a CUDA graph (see the module docstring): :meth:`run`
    feeds ``tokens`` (N,) and leaves the next logits in ``state.logits``, the cache and positions moved
    on the device. Built by :meth:`capture`, which returns None when the step cannot be captured."""

    def __init__(self, judge: LocalJudge, state: DecodeState):
        self.judge, self.state = judge, state
        self.tokens = torch.zeros(state.batch_size, dtype=torch.long, device=state.logits.device)
        self.graph: Any = None

    def _body(self) -> None:
        self.judge._step_in_place(self.state, self.tokens, device_cursor=True)

    @classmethod
    def capture(cls, judge: LocalJudge, state: DecodeState) -> DecodeGraph | None:
        if state.logits.device.type != "cuda":
            return None
        self = cls(judge, state)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._body()
        except Exception as exc:  # noqa: BLE001 - an uncapturable model runs eagerly
            log.warning("the judge's decode step could not be captured as a CUDA graph (%s: %s); decoding eagerly",
                        type(exc).__name__, str(exc)[:300])
            judge._graphs_ok = False
            return None
        self.graph = graph
        return self

    def run(self, tokens: torch.Tensor) -> None:
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.state.cache.advance(1, device_side=False)  # the graph moved the cursor on the device


def warm_and_capture(judge: LocalJudge, state: DecodeState, tokens: torch.Tensor) -> DecodeGraph | None:
    """Run the step for ``tokens`` eagerly on a side stream (a real step, and the warm-up torch asks for before
    a capture: kernels chosen, workspaces allocated), then capture the step for the next tokens. Returns the
    graph, or None when it cannot be captured (the step has run either way)."""
    side = torch.cuda.Stream(device=state.logits.device)
    side.wait_stream(torch.cuda.current_stream(state.logits.device))
    with torch.cuda.stream(side):
        judge._step_in_place(state, tokens)
    torch.cuda.current_stream(state.logits.device).wait_stream(side)
    return DecodeGraph.capture(judge, state)


def checked_replay(judge: LocalJudge, graph: DecodeGraph, state: DecodeState,
                   tokens: torch.Tensor) -> tuple[DecodeGraph | None, DecodeState]:
    """The first replay of a judge's first graph, checked: the same step runs eagerly on a copy of the state
    and the logits must agree (to :data:`GRAPH_CHECK_TOLERANCE` of their scale); otherwise graphs are
    turned off for the judge and the eager copy carries on. Returns (the graph or None, the state after
    the step)."""
    copy = judge.select(state, list(range(state.batch_size)), reserve=state.cache.capacity - state.cache.length)
    judge._step_in_place(copy, tokens)
    graph.run(tokens)
    scale = float(copy.logits.abs().max().clamp(min=1.0))
    error = float((copy.logits - state.logits).abs().max())
    if not error <= GRAPH_CHECK_TOLERANCE * scale:
        log.warning("the judge's CUDA graph decode step differs from the eager step by %.3g (logit scale %.3g); "
                    "decoding eagerly", error, scale)
        judge._graphs_ok = False
        return None, copy
    judge._graphs_checked = True
    return graph, state


@torch.inference_mode()
def decode_loop(
    judge: LocalJudge,
    state: DecodeState,
    budgets: Sequence[int],
    *,
    keep_logits: bool = False,
    keep_tokens: Sequence[int] | None = None,
    temperatures: Sequence[float] | None = None,
    generator: torch.Generator | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    compact: float = 0.5,
    sync_every: int = 4,
    graphs: bool = False,
) -> DecodeOutput:
    """The device-side decode loop (module docstring); the arguments are :meth:`LocalJudge.generate_from`'s."""
    n = state.batch_size
    device = state.logits.device
    if len(budgets) != n:
        raise ValueError(f"{len(budgets)} token budgets for {n} rows")
    if min(budgets) < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {min(budgets)}")
    sync_every = max(1, int(sync_every))
    total = max(int(b) for b in budgets)
    pad = judge.pad_token_id
    eos = torch.tensor(sorted(judge.eos_token_ids), dtype=torch.long, device=device)
    budget = torch.tensor([int(b) for b in budgets], dtype=torch.long, device=device)
    owner = torch.arange(n, device=device)  # state row -> the caller's row
    owner_host = list(range(n))
    done = torch.zeros(n, dtype=torch.bool, device=device)
    written = torch.zeros(n, dtype=torch.long, device=device)  # tokens written (end of sequence excluded)
    chosen_all = torch.full((n, total), -1, dtype=torch.long, device=device)  # -1: the row was done
    chosen_logp: Any = torch.zeros((n, total), dtype=torch.float32, device=device) if logprobs else None
    k = int(top_logprobs)
    top_ids: Any = torch.zeros((n, total, k), dtype=torch.long, device=device) if k > 0 else None
    top_logp: Any = torch.zeros((n, total, k), dtype=torch.float32, device=device) if k > 0 else None
    sampled = None
    if temperatures is not None:
        temps = torch.tensor([float(t) for t in temperatures], dtype=torch.float32, device=device)
        if len(temperatures) != n:
            raise ValueError(f"{len(temperatures)} temperatures for {n} rows")
        if any(float(t) > 0 for t in temperatures):
            sampled = (temps > 0, temps.clamp(min=1e-6))
    keep_set = None if keep_tokens is None else {int(t) for t in keep_tokens}
    kept: list[dict[int, torch.Tensor]] | None = [{} for _ in range(n)] if keep_logits else None
    window: Any = None  # the logits of the steps since the last sync, when logits are kept
    window_start = 0
    graph: DecodeGraph | None = None
    graph_steps = syncs = 0
    # room for the steps ahead, up to RESERVE_STEPS at a time (a budget of the whole context must not
    # allocate it for every row); the buffers move only when that runs out (a graph is then captured again)
    state.cache.reserve(min(total, RESERVE_STEPS))

    def flush(upto: int) -> None:
        """Move the logits of steps [window_start, upto) that are to be kept out of the window buffer."""
        if kept is None or window is None or upto <= window_start:
            return
        steps = chosen_all[:, window_start:upto].tolist()
        place = {row: k for k, row in enumerate(owner_host)}
        for row, chosen in enumerate(steps):
            if row not in place:
                continue
            for j, token in enumerate(chosen):
                if token < 0 or (keep_set is not None and token not in keep_set):
                    continue
                logits = window[place[row], j]
                kept[row][window_start + j] = logits.clone() if keep_set is not None else logits

    step = 0
    while True:
        logits = state.logits
        if kept is not None and step == window_start:
            window = torch.empty((state.batch_size, sync_every, logits.shape[-1]), dtype=torch.float32, device=device)
        if kept is not None:
            window[:, step - window_start].copy_(logits)
        nxt = logits.argmax(dim=-1)
        logp: Any = torch.log_softmax(logits.float(), dim=-1) if (logprobs or k > 0) else None
        if sampled is not None:
            rows_sampled, temps_now = sampled[0].index_select(0, owner), sampled[1].index_select(0, owner)
            probs = torch.softmax(logits.float() / temps_now[:, None], dim=-1)
            drawn = torch.multinomial(probs, 1, generator=generator).view(-1)
            nxt = torch.where(rows_sampled, drawn, nxt)
        live = ~done
        chosen_all[:, step].index_copy_(0, owner, torch.where(live, nxt, -1))
        if chosen_logp is not None:
            chosen_logp[:, step].index_copy_(0, owner, logp.gather(1, nxt.view(-1, 1)).view(-1))
        if k > 0:
            values, ids = logp.topk(k, dim=-1)
            top_ids[:, step].index_copy_(0, owner, ids)
            top_logp[:, step].index_copy_(0, owner, values)
        is_eos = torch.isin(nxt, eos)
        written += (live & ~is_eos).long()
        done |= is_eos | (written >= budget.index_select(0, owner))
        step += 1
        if step >= total:
            break
        if step % sync_every == 0:
            syncs += 1
            flush(step)
            window_start = step
            left = int((~done).sum())
            if left == 0:
                break
            if left <= compact * state.batch_size and total - step > sync_every:
                live_rows = (~done).nonzero().view(-1)
                state = judge.select(state, live_rows.tolist(), reserve=total - step)
                owner, done, written, nxt = owner[live_rows], done[live_rows], written[live_rows], nxt[live_rows]
                owner_host = owner.tolist()
                graph = None
        tokens = torch.where(done, torch.full_like(nxt, pad), nxt)
        if state.cache.reserve(1, spare=min(total - step, RESERVE_STEPS)):
            graph = None
        if graph is not None and not judge._graphs_checked:
            graph, state = checked_replay(judge, graph, state, tokens)
            graph_steps += graph is not None
        elif graph is not None:
            graph.run(tokens)
            graph_steps += 1
        elif graphs and judge._graphs_ok and total - step >= 3:  # this step eagerly, the later ones replayed
            graph = warm_and_capture(judge, state, tokens)
        else:
            judge._step_in_place(state, tokens)
    flush(step)
    chosen_host = chosen_all.tolist()
    logp_host = chosen_logp.tolist() if chosen_logp is not None else None
    top_host = (top_ids.tolist(), top_logp.tolist()) if k > 0 else None
    eos_set = judge.eos_token_ids
    tokens_out, finished, logps, tops_i, tops_v = [], [], [], [], []
    for row in range(n):
        steps = [t for t in chosen_host[row] if t >= 0]
        end = next((j for j, t in enumerate(steps) if t in eos_set), None)
        written_steps = steps if end is None else steps[:end]
        tokens_out.append(written_steps)
        finished.append(end is not None)
        m = len(written_steps)
        if logp_host is not None:
            logps.append(logp_host[row][:m])
        if top_host is not None:
            tops_i.append(top_host[0][row][:m])
            tops_v.append(top_host[1][row][:m])
    return DecodeOutput(
        tokens=tokens_out, finished=finished, logits=kept,
        logprobs=logps if logp_host is not None else None,
        top_ids=tops_i if top_host is not None else None,
        top_logprobs=tops_v if top_host is not None else None,
        graph_steps=graph_steps, syncs=syncs,
    )
