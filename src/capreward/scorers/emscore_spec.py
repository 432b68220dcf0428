"""EMScore's spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.emscore`."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..metrics.harmonic import HARMONIC_MEANS
from ..registry import Deviation, JobFlag, MetricSpec, Option, RewardPolicy, register

#: ``capreward score --harmonic-mean``: how the job forms EMScore's F and RefCLIP-S / RefPAC-S. Sign-safe by
#: default, as every reward: the written score stays in the documented range and ranks captions as the
#: rewards do; the released 2ab/(a+b) explodes and changes sign when its parts have opposite signs (a
#: wrong caption scored 3.24 against 0.985 for the right one). Recorded per results file.
HARMONIC_MEAN_FLAG = JobFlag(
    "harmonic_mean", ("--harmonic-mean",),
    "how EMScore's F and RefCLIP-S/RefPAC-S are formed: sign-safe (2ab/(a+b) when both parts are positive, else the "
    "smaller part: inside [-1, 1], as the rewards) or released (the papers' 2ab/(a+b), which leaves the range "
    "when the parts have opposite signs)", option="harmonic_mean", default="sign-safe", choices=HARMONIC_MEANS)

#: The components of each part (video, reference, combined), as :class:`~capreward.scorers.results.MatchScores`.
MATCH_FIELDS = ("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f")
#: How the CLIP metrics (CLIP-S, PAC-S, EMScore) read captions: the text encoder's batch, and a caption longer
#: than CLIP's context.
TEXT_OPTIONS = (
    Option("batch_size", 64, "captions per text-encoder batch"),
    Option("long_captions", "windows", "'windows' reads a long caption whole; 'truncate' cuts it to the context"),
)
#: Frames sampled per video by EMScore's matching (and the hallucination penalty, which reads it).
FRAMES_OPTION = Option("frames", 10, "frames sampled per video (None: all)")


def parts(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The parts scored: ``video`` with a visual (images are one-frame videos), ``reference`` with
    references, ``combined`` with both."""
    has_visual = config.get("visual", "video") is not None
    has_refs = bool(config.get("references"))
    return (("video",) if has_visual else ()) + (("reference",) if has_refs else ()) + (
        ("combined",) if has_visual and has_refs else ())


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``<part>/<component>`` for every part of :func:`parts` and every :data:`MATCH_FIELDS` component."""
    return tuple(f"{part}/{f}" for part in parts(config) for f in MATCH_FIELDS)


def main_part(config: Mapping[str, Any]) -> str:
    """The part the headline is read from: ``combined`` with a visual and references, else the one given."""
    return parts(config)[-1]


def value(config: Mapping[str, Any]) -> str:
    """A reward's value: the headline (the main part's ``full_f``), or the main part's ``field``."""
    chosen = config.get("field", "full_f")
    return "score" if chosen == "full_f" else f"{main_part(config)}/{chosen}"


def reward_check(options: Mapping[str, Any]) -> None:
    """``idf="batch"`` makes a sample's reward depend on the rest of its batch: refused."""
    if options.get("idf") == "batch":
        raise ValueError("idf='batch' makes a sample's reward depend on its batch; pass a corpus or dict")


def scores_references_alone(config: Mapping[str, Any]) -> bool:
    """EMScore_ref scores a caption against its references alone: a sample needs no visual."""
    return False


SPEC = register(MetricSpec(
    name="emscore",
    aliases=("em", "em_score"),
    title="EMScore",
    summary="Fine-grained (token to frame) and coarse CLIP matching of a caption with a video or image, "
            "and with references (EMScore_ref).",
    paper="Shi et al., EMScore: Evaluating Video Captioning via Coarse-Grained and Fine-Grained Embedding "
          "Matching, CVPR 2022",
    released_code="https://github.com/shiyaya/emscore",
    scorer="capreward.scorers.emscore:EMScore",
    sub_scores=sub_scores,
    value_range=(-1.0, 1.0),
    higher_is_better=True,
    visuals=("image", "video"),
    references="optional",
    shares="clip",
    uses_idf=True,
    backbone="clip",
    options=(
        Option("model", "ViT-B/32", "the CLIP (name/tag, OpenAI-format .pt, open_clip checkpoint, factory)"),
        Option("idf", False, "False (every token weight 1), a corpus of captions, a dict token id -> weight, "
                             "or 'batch' (the released default; makes a score depend on its batch)"),
        Option("idf_default", None, "the weight of ids a dict idf lacks"),
        FRAMES_OPTION,
        *TEXT_OPTIONS,
        Option("harmonic_mean", "released", "how F is formed: 'released' 2PR/(P+R) or 'sign-safe' "
                                            "(the rewards' default)"),
    ),
    deviations=(
        Deviation("no idf by default (the released EMScorer.score() computes idf over each batch, so a score "
                  "depends on its batch)", "idf='batch'"),
        Deviation("a caption longer than CLIP's context is read whole in windows (the released code crashes)",
                  "long_captions='truncate' (the paper's truncation, EOS kept)"),
        Deviation("padded positions never take part in a max (the released code multiplies them by 0, clamping "
                  "negative maxima to 0)", None),
        Deviation("the rewards form F sign-safely (in [-1, 1]); the scorer keeps 2PR/(P+R)",
                  "harmonic_mean='released'"),
    ),
    needs_visual=scores_references_alone,
    default_visual="video",
    position=0,
    job_flags=(HARMONIC_MEAN_FLAG,),
    writes_alignment=True,
    value=value,
    reward_policy=RewardPolicy(
        options=(
            Option("field", "full_f", "the component of the main part that is the reward", MATCH_FIELDS),
            Option("harmonic_mean", "sign-safe", "how every F is formed: 'sign-safe' (in [-1, 1]) or 'released'",
                   HARMONIC_MEANS),
        ),
        check=reward_check,
    ),
))
