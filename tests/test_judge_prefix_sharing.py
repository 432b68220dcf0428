"""The local judge's shared prefix and device-side decoding (issue #44 item 2), on a tiny random LLaVA.

- Exactness: batched greedy decoding (the image prefix held once per image, each row's own tokens in
  its static buffer, decoding on the device) writes the tokens of a plain per-sample ``generate`` with
  the logits of every step within 1e-5, for equal GRPO groups, for uneven groups (rows gathered into
  image slots), without prefix sharing, with compaction and with any ``sync_every``.
- Memory: the cache holds each image's prefix once and each row's own columns only, computed from the
  tensors themselves and bounded against the copying design and against ``generate``.
- Host work: a decode step reads nothing back to the host (every host read raises inside a step), and
  the host reads of a whole ``greedy`` call do not grow with its number of steps.
- The attention implementation is switched for the judge's forwards only, and a CUDA-graph step that
  differs from the eager step is refused (the eager result carries on).
"""

from __future__ import annotations

import random

import pytest
import torch

from capreward.judges import LocalJudge
from capreward.judges.caller_text import render
from capreward.judges.images import mean_background, pad_to_square
from capreward.judges.prompts import fleur_prompt
from capreward.testing import TinyLlavaSpec, build_tiny_llava, fleur_task_image

CAPTIONS = ["a red ball", "a blue box on the wall", "the kite", "many red cars on a road"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def judge():
    # a random LLaVA whose answers run past a few steps (it rarely writes the end token early)
    return LocalJudge(build_tiny_llava(TinyLlavaSpec(seed=3, text_layers=2, max_positions=1024)))


@pytest.fixture(scope="module")
def images():
    return [fleur_task_image(c, random.Random(f"prefix-{c}"), size=(40, 28)) for c in ("red", "blue", "green")]


def prompts(judge, rows):
    parts = [judge.conversation_parts([(fleur_prompt(c), None)]) for c, _ in rows]
    return parts


def started(judge, images, rows, **kwargs):
    parts = prompts(judge, rows)
    features = judge.image_features(judge.preprocess(images))
    ids = judge.encode_prompts(parts, int(features.shape[1]))
    return parts, ids, judge.start(ids, features, [i for _, i in rows], **kwargs)


def reference(judge, parts, image, steps):
    """``generate(output_logits=True)`` of one prompt: (tokens before the end token, logits per step)."""
    processor = judge.processor
    square = pad_to_square(image, mean_background(processor.image_processor.image_mean))
    inputs = processor(images=square, text=render(parts), return_tensors="pt")
    with torch.inference_mode():
        out = judge.model.generate(**inputs, do_sample=False, max_new_tokens=steps, output_logits=True,
                                   return_dict_in_generate=True)
    new = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    cut = next((k for k, t in enumerate(new) if t in judge.eos_token_ids), len(new))
    return new[:cut], [step[0].float() for step in out.logits]


@pytest.fixture(scope="module")
def references(judge, images):
    cache = {}

    def get(caption, image_index, steps):
        key = (caption, image_index, steps)
        if key not in cache:
            cache[key] = reference(judge, prompts(judge, [(caption, image_index)])[0], images[image_index], steps)
        return cache[key]

    return get


def assert_like_generate(judge, out, rows, references, steps):
    for r, (caption, i) in enumerate(rows):
        tokens, logits = references(caption, i, steps)
        assert out.tokens[r] == tokens, f"row {r}"
        assert out.logits[r], f"row {r} kept no logits"
        for step, value in out.logits[r].items():
            torch.testing.assert_close(value, logits[step], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["groups", "uneven", "no-sharing", "sync-1", "compact-early"])
def test_batched_greedy_equals_per_sample_generate(judge, images, references, layout):
    rows = {
        "groups": [(c, i) for i in range(2) for c in CAPTIONS[:3]],  # equal groups in order: no gathers
        "uneven": [("the kite", 2), ("a red ball", 0), ("a blue box on the wall", 0), ("many red cars on a road", 1),
                   ("a red ball", 2), ("the kite", 0)],  # 3, 1, 2 rows per image, interleaved: slot gathers
        "no-sharing": [(c, i) for i in range(2) for c in CAPTIONS[:2]],
        "sync-1": [(c, 0) for c in CAPTIONS],
        "compact-early": [(c, i) for i in range(2) for c in CAPTIONS[:2]],
    }[layout]
    steps = 7
    _, _, state = started(judge, images, rows, share_prefix=layout != "no-sharing")
    if layout == "no-sharing":
        assert not state.cache.has_prefix
    elif layout == "uneven":
        assert not state.cache.slots.identity and state.cache.slots.group == 3
    else:
        assert state.cache.has_prefix and state.cache.slots.identity
    budgets = [steps] * len(rows)
    if layout == "compact-early":  # most rows stop after 2 tokens: the live ones are compacted
        budgets = [2, 2, 2, steps]
    out = judge.generate_from(state, budgets, keep_logits=True, sync_every=1 if layout in ("sync-1", "compact-early") else 3)
    if layout == "compact-early":
        for r, (caption, i) in enumerate(rows):
            tokens, logits = references(caption, i, steps)
            n = budgets[r]
            assert out.tokens[r] == tokens[:n]
            for step, value in out.logits[r].items():
                torch.testing.assert_close(value, logits[step], atol=1e-5, rtol=0)
        return
    assert_like_generate(judge, out, rows, references, steps)


def test_the_prefix_is_held_once_per_image_and_the_rows_hold_only_their_own_tokens(judge, images):
    rows = [(c, i) for i in range(2) for c in CAPTIONS]  # 2 images x 4 captions
    _, ids, state = started(judge, images, rows, reserve=8)
    text = judge.model.config.get_text_config()
    head_dim = text.hidden_size // text.num_attention_heads
    per_position = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * 4  # keys + values, fp32
    shared = min(len(p) for p in ids) - 1
    prefix_len = min(shared, next(k for k in range(len(ids[0])) if any(p[k] != ids[0][k] for p in ids)))
    assert state.cache.prefix_length == prefix_len
    suffix_len = max(len(p) for p in ids) - prefix_len
    sizes = judge.cache_bytes(state)
    assert sizes["prefix"] == 2 * prefix_len * per_position  # one prefix per image, not per row
    assert sizes["rows"] == len(rows) * state.cache.capacity * per_position
    assert state.cache.capacity == suffix_len + 8
    # against the copying design (the prefix copied into every row) and against generate (one row)
    copying = len(rows) * (prefix_len + state.cache.capacity) * per_position
    generate = (max(len(p) for p in ids) + 8) * per_position
    assert copying - sizes["total"] == (len(rows) - 2) * prefix_len * per_position  # N - U prefixes saved
    assert sizes["total"] < copying / 2
    assert sizes["total"] - generate <= (2 - 1) * prefix_len * per_position + len(rows) * state.cache.capacity * per_position
    # a fork copies the rows' own columns only: the prefix tensors are the same objects
    child = judge.select(state, [0, 0, 5], reserve=2)
    assert all(a.prefix_keys is b.prefix_keys for a, b in zip(child.cache.layers, state.cache.layers))
    assert judge.cache_bytes(child)["rows"] == 3 * (state.cache.length + 2) * per_position


class HostReadError(AssertionError):
    pass


HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero"}


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts every read of a tensor's value on the host (a torch function mode: nothing of torch is
    patched); raises one while ``forbid[0]`` is set."""

    def __init__(self, counter: dict, forbid: list[bool]):
        super().__init__()
        self.counter, self.forbid = counter, forbid

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        read = name in HOST_READS
        if name == "__getitem__" and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            read = any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in index)
        if read:
            if self.forbid[0]:
                raise HostReadError(f"Tensor.{name} inside a decode step")
            self.counter[name] = self.counter.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_a_decode_step_reads_nothing_back_and_host_reads_do_not_grow_with_the_steps(judge, images, monkeypatch):
    rows = [(c, i) for i in range(2) for c in CAPTIONS[:2]]
    forbid = [False]
    step_in_place = LocalJudge._step_in_place

    def guarded(self, *args, **kwargs):
        forbid[0] = True
        try:
            return step_in_place(self, *args, **kwargs)
        finally:
            forbid[0] = False

    monkeypatch.setattr(LocalJudge, "_step_in_place", guarded)
    reads = {}
    for steps in (3, 9):
        _, _, state = started(judge, images, rows)
        counter: dict = {}
        with HostReads(counter, forbid):
            out = judge.generate_from(state, steps, keep_logits=False, sync_every=100)
        assert max(len(t) for t in out.tokens) == steps  # it really decoded that many steps
        reads[steps] = sum(counter.values())
    assert reads[3] == reads[9] > 0, reads  # the mode sees host reads (the final ones), none more for more steps
    with HostReads({}, [True]), pytest.raises(HostReadError):  # and a read where it is forbidden raises
        bool(torch.ones(1) > 0)


def test_the_attention_implementation_is_switched_for_the_judges_forwards_only(judge, images):
    config = judge.model.config.get_text_config()
    before = config._attn_implementation
    _, _, state = started(judge, images, [("a red ball", 0), ("the kite", 1)])
    judge.greedy(state, 3)
    assert config._attn_implementation == before


def test_a_graph_step_that_differs_from_the_eager_step_is_refused(judge, images, references, monkeypatch):
    """The CUDA-graph path's self-check, on the CPU with a stand-in graph whose replay is wrong: the first
    replay is compared with the eager step on a copy of the state, graphs are turned off for the judge,
    and the eager copy carries on (the answers still equal generate's)."""
    from capreward.judges import decoding

    class WrongGraph:
        def __init__(self, judge, state):
            self.judge, self.state = judge, state

        def run(self, tokens):
            self.judge._step_in_place(self.state, tokens)
            self.state.logits.add_(1.0)  # a replay that computes something else

    def capture(judge, state, tokens):  # the step for these tokens eagerly (as on a side stream), then "captured"
        judge._step_in_place(state, tokens)
        return WrongGraph(judge, state)

    monkeypatch.setattr(decoding, "warm_and_capture", capture)
    fresh = LocalJudge((judge.model, judge.processor))
    rows = [(c, 0) for c in CAPTIONS[:3]]
    _, _, state = started(fresh, images, rows)
    out = decoding.decode_loop(fresh, state, [7] * 3, keep_logits=True, graphs=True)
    assert fresh._graphs_ok is False and out.graph_steps == 0
    assert_like_generate(fresh, out, rows, references, 7)
