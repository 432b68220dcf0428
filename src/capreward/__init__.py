"""capreward: caption-quality metrics as fast, batched rewards and validation scores.

Scorers are imported lazily so that ``import capreward`` stays cheap and a missing optional
dependency only matters for the scorer that needs it.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "EMScore": "capreward.scorers.emscore",
    "EMScoreResult": "capreward.scorers.emscore",
    "MatchScores": "capreward.scorers.results",
    "CLIPScore": "capreward.scorers.clipscore",
    "CLIPScoreResult": "capreward.scorers.clipscore",
    "PACScore": "capreward.scorers.clipscore",
    "CLIPBackbone": "capreward.backbones.clip",
    "FLEUR": "capreward.scorers.fleur",
    "FLEURResult": "capreward.scorers.fleur",
    "RemoteFLEUR": "capreward.scorers.fleur_remote",
    "VisCE2": "capreward.scorers.visce2",
    "VisCE2Result": "capreward.scorers.visce2",
    "GVEval": "capreward.scorers.gveval",
    "GVEvalResult": "capreward.scorers.gveval",
    "Hallucination": "capreward.scorers.hallucination",
    "ClaimScorer": "capreward.scorers.claims",
    "QAUtility": "capreward.scorers.qa_utility",
    "HallucinationResult": "capreward.scorers.hallucination",
    "MediaError": "capreward.media.errors",
    "CaprewardError": "capreward.errors",
    "SampleError": "capreward.errors",
    "Scores": "capreward.scorers.contract",
    "Scorer": "capreward.scorers.contract",
}

#: The public names, each documented in the API reference (docs/api/). The scorers' result classes
#: (``EMScoreResult``, ...) and ``MatchScores`` still import from here; they are documented as what the
#: scorers return.
__all__ = sorted(["CLIPBackbone", "CLIPScore", "CaprewardError", "ClaimScorer", "EMScore", "FLEUR", "GVEval", "Hallucination",
                  "MediaError", "PACScore", "QAUtility", "RemoteFLEUR", "SampleError", "Scorer", "Scores", "VisCE2"])

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
