"""capreward's fp32 is IEEE fp32 on CUDA: ``strict_fp32`` turns TF32 off for matmul and cuDNN during
capreward's encoder calls and restores the caller's settings after (the switches are plain flags, so this
shows on a machine without a GPU too)."""

from __future__ import annotations

import threading

import pytest
import torch

from capreward.devices import _tf32_switches, strict_fp32, strict_fp32_method


def switches() -> list:
    return [getattr(obj, attr) for obj, attr in _tf32_switches()]


@pytest.fixture()
def tf32_on():
    """The caller's settings: TF32 allowed for matmul and cuDNN (restored after the test)."""
    saved = switches()
    for obj, attr in _tf32_switches():
        setattr(obj, attr, "tf32" if attr == "fp32_precision" else True)
    yield switches()
    for (obj, attr), value in zip(_tf32_switches(), saved):
        setattr(obj, attr, value)


def test_cuda_block_turns_tf32_off_and_restores_the_callers_settings(tf32_on):
    strict = ["ieee", "ieee"] if _tf32_switches()[0][1] == "fp32_precision" else [False, False]
    with strict_fp32("cuda"):
        assert switches() == strict
        with strict_fp32("cuda:0"):  # nested: still strict, and the outer exit restores
            assert switches() == strict
        assert switches() == strict
    assert switches() == tf32_on
    with pytest.raises(RuntimeError):
        with strict_fp32("cuda"):
            raise RuntimeError("inside")
    assert switches() == tf32_on


def test_other_devices_leave_the_switches_alone(tf32_on):
    with strict_fp32("cpu"):
        assert switches() == tf32_on
    with strict_fp32(torch.device("meta")):
        assert switches() == tf32_on


def test_overlapping_blocks_of_two_threads_restore_once_the_last_exits(tf32_on):
    inside, release = threading.Event(), threading.Event()

    def other():
        with strict_fp32("cuda"):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with strict_fp32("cuda"):
        pass
    assert switches() != tf32_on  # the other thread's block is still open
    release.set()
    t.join()
    assert switches() == tf32_on


def test_backbone_encoders_run_inside_strict_fp32(tf32_on, tiny_backbone):
    """The CLIP encoders are wrapped: on a CUDA backbone they see TF32 off (the wrapper reads ``self.device``)."""
    from capreward.backbones import CLIPBackbone

    seen = []

    class Probe:
        device = torch.device("cuda")

        @strict_fp32_method
        def run(self):
            seen.append(switches())

    Probe().run()
    assert seen[0] != tf32_on and switches() == tf32_on
    for name in ("encode_pixels", "_text_tower", "_text_tower_packed"):
        assert getattr(CLIPBackbone, name).__wrapped__ is not None, name
    # on the CPU the wrapped encoders still compute the same embeddings
    batch = tiny_backbone.tokenize(["a dog"])
    assert tiny_backbone.encode_text(batch.ids, batch.lengths).pooled.shape[0] == 1
