"""Scale-out scoring with a Ray Data actor pool: one model copy per actor (a GPU each when present).

Results stream back to the driver, which appends them to the same resumable results file as the
local engine, so an interrupted Ray job resumes the same way. The actors run in other processes: each
gets the driver's media limits (:func:`capreward.media.get_media_limits` when the job starts, e.g. from
``--max-pixels``) and caption budget (:func:`capreward.caption_budget.get_caption_budget`, e.g. from
``--max-caption-chars``), so a row refused locally is refused the same way on Ray.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from ..caption_budget import get_caption_budget, set_caption_budget
from ..media.limits import get_media_limits, set_media_limits
from .manifest import ManifestRow
from .results_file import ResultsWriter
from .runners import ManifestScorer, ScoreOptions


class ScoringActor:
    """Ray Data callable class: builds the scorers once per actor, scores batches of rows.

    ``limits``: the driver's :class:`~capreward.media.MediaLimits` as a dict, and ``budget`` its
    :class:`~capreward.caption_budget.CaptionBudget`, set in the actor's process (its own import-time
    limits come from its environment, which need not be the driver's)."""

    def __init__(self, options: dict, limits: dict | None = None, budget: dict | None = None):
        if limits is not None:
            set_media_limits(**limits)
        if budget is not None:
            set_caption_budget(**budget)
        self.scorer = ManifestScorer(ScoreOptions(**options))

    def __call__(self, batch: dict) -> dict:
        import json

        rows = [ManifestRow(**json.loads(s)) for s in batch["row"]]
        return {"result": [json.dumps(r) for r in self.scorer.score_rows(rows)]}


def run_ray(todo: list[ManifestRow], options: ScoreOptions, out: str | Path, num_actors: int = 2,
            progress: bool = True) -> int:
    """Score ``todo`` on ``num_actors`` Ray actors; returns the number of rows written."""
    import json

    from .._extras import require

    ray = require("ray", "ray", used_by="the Ray engine (--engine ray)")
    require("ray", "ray.data", used_by="the Ray engine (--engine ray)")

    if not todo:
        return 0
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    use_gpu = options.device.startswith("cuda")
    ds = ray.data.from_items([{"row": json.dumps(asdict(r))} for r in todo])
    scored = ds.map_batches(
        ScoringActor,
        fn_constructor_kwargs={"options": asdict(options), "limits": asdict(get_media_limits()),
                               "budget": asdict(get_caption_budget())},
        batch_size=options.batch_size,
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_gpus=1 if use_gpu else 0,
        num_cpus=1,
        batch_format="numpy",
    )
    written = 0
    with ResultsWriter(out) as writer, tqdm(total=len(todo), unit="row", file=sys.stderr, disable=not progress,
                                          desc="scoring (ray)") as bar:
        for batch in scored.iter_batches(batch_size=None, batch_format="numpy"):
            results = [json.loads(s) for s in batch["result"]]
            writer.write(results)
            written += len(results)
            bar.update(len(results))
    return written
