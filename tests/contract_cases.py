"""Every built-in metric on its tiny offline model: the inputs and options the conformance tester
(tests/test_conformance.py) and the baseline recorder (tests/record_contract_baseline.py) share.

A case is a few captions (a right one, a wrong one, an empty one) with their images saved as files (so a
reward, a torchmetrics Metric and a ``capreward score`` job read the same bytes), references where the
metric reads them, and each metric's extra row inputs (QA utility's questions). The models load once per
process (:class:`Models`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The built-in metrics, in the registry's order.
BUILTIN = ("emscore", "clip_s", "pac_s", "fleur", "hallucination", "visce2", "gveval", "claims", "qa_utility")
CLIP_METRICS = ("emscore", "clip_s", "pac_s", "hallucination")


class Models:
    """The tiny models, each built (or read from the cache) on first use and kept."""

    @functools.cached_property
    def clip(self) -> str:
        from capreward.testing import trained_clip_path

        return str(trained_clip_path())

    @functools.cached_property
    def fleur_dir(self) -> str:
        from capreward.testing import FLEUR_RECIPE, tiny_judge_dir

        return str(tiny_judge_dir(FLEUR_RECIPE))

    @functools.cached_property
    def fleur(self) -> Any:
        import torch

        from capreward.judges import load_llava

        return load_llava(self.fleur_dir, dtype=torch.float32, device=torch.device("cpu"), local_files_only=True)

    @functools.cached_property
    def vlm(self) -> Any:
        from capreward.judges import LocalChatJudge
        from capreward.testing.tiny_vlm_judges import tiny_vlm_judge

        return LocalChatJudge(tiny_vlm_judge(), batch_size=8)

    @functools.cached_property
    def claim(self) -> Any:
        from capreward.judges import LocalChatJudge
        from capreward.testing.tiny_claim_judge import tiny_claim_judge

        return LocalChatJudge(tiny_claim_judge())

    @functools.cached_property
    def qa_dir(self) -> str:
        from capreward.testing.tiny_qa_judge import tiny_qa_judge_dir

        return str(tiny_qa_judge_dir())

    @functools.cached_property
    def qa(self) -> Any:
        from capreward.testing.tiny_qa_judge import qa_backend

        return qa_backend()

    def scorer_option(self, metric: str) -> dict[str, Any]:
        """The option that puts ``metric``'s scorer on its tiny model (``model=`` or ``backend=``)."""
        if metric in CLIP_METRICS:
            return {"model": self.clip}
        if metric == "fleur":
            return {"model": self.fleur}
        if metric in ("visce2", "gveval"):
            return {"backend": self.vlm}
        if metric == "claims":
            return {"backend": self.claim}
        if metric == "qa_utility":
            return {"backend": self.qa}
        raise KeyError(f"no tiny model for {metric}")


@dataclass
class Case:
    """Inputs for one metric: captions, one image path per caption, references (or None) and row inputs."""

    metric: str
    captions: list[str]
    images: list[str]
    references: list[list[str]] | None = None
    inputs: dict[str, list[Any]] = field(default_factory=dict)

    def columns(self) -> dict[str, list[Any]]:
        """The dataset columns a reward reads (TRL's keyword arguments)."""
        out: dict[str, list[Any]] = {"image": list(self.images), **{k: list(v) for k, v in self.inputs.items()}}
        if self.references is not None:
            out["references"] = [list(r) for r in self.references]
        return out

    def rows(self) -> list[dict[str, Any]]:
        """Manifest rows of ``capreward score``."""
        rows = []
        for i, (caption, image) in enumerate(zip(self.captions, self.images)):
            row: dict[str, Any] = {"id": f"r{i}", "caption": caption, "image": image}
            if self.references is not None:
                row["references"] = list(self.references[i])
            for key, values in self.inputs.items():
                row[key] = values[i]
            rows.append(row)
        return rows


def _save(image: Any, path: Path) -> str:
    image.save(path)
    return str(path)


def cases(metric: str, directory: Path, with_references: bool | None = None) -> Case:
    """The tiny case of ``metric`` with its images saved under ``directory``; ``with_references`` (None:
    the metric's usual case) adds or drops references."""
    from capreward.testing import colour_image, fleur_task_image

    directory.mkdir(parents=True, exist_ok=True)
    if metric in CLIP_METRICS:
        red = _save(colour_image("red", random.Random(0)), directory / "red.png")
        captions = ["a red image.", "a blue image.", "", "a red car on a red road."]
        refs = [["a red image."], ["a red picture."], ["a red image."], ["a red image.", "a green image."]]
        case = Case(metric, captions, [red] * 4, refs if metric != "hallucination" else None)
    elif metric == "fleur":
        red = _save(fleur_task_image("red", random.Random(0)), directory / "fleur_red.png")
        case = Case(metric, ["a red car", "a yellow box", ""], [red] * 3)
    elif metric in ("visce2", "gveval"):
        from capreward.testing.tiny_vlm_judges import probe_image

        blue = _save(probe_image(metric, "blue"), directory / f"{metric}_blue.png")
        green = _save(probe_image(metric, "green"), directory / f"{metric}_green.png")
        case = Case(metric, ["a blue kite", "a green ball", ""], [blue, green, blue])
    elif metric == "claims":
        from capreward.testing.tiny_claim_judge import claim_image

        image = _save(claim_image("red", "green", random.Random(0)), directory / "claims.png")
        case = Case(metric, ["the background is red.", "the background is blue.", ""], [image] * 3,
                    [["the background is red."]] * 3)
    elif metric == "qa_utility":
        from capreward.testing.tiny_qa_judge import colour_questions

        red = _save(colour_image("red", random.Random(0)), directory / "red.png")
        qs = colour_questions("red")
        case = Case(metric, ["a red ball.", "a photo", ""], [red] * 3, None, {"questions": [qs] * 3})
    else:
        raise KeyError(f"no tiny case for {metric}: add one")
    if with_references is False:
        case.references = None
    elif with_references and case.references is None:
        case.references = [[c or "a caption."] for c in case.captions]
    return case
