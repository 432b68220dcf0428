"""A penalty for caption words the visuals do not support, from EMScore's token→frame matching.

For each content token of the caption (see :func:`~capreward.metrics.token_support.content_mask`), EMScore's
fine-grained matching gives the cosine similarity of its CLIP token embedding to the best-matching
frame. Tokens below ``threshold`` are "unsupported"; the penalty is minus their (idf-)weighted
fraction, in [-1, 0]: 0 when every content word finds a matching frame, -1 when none does.

Calibration: per-token similarities depend on the CLIP model (and on frame sampling), so the threshold
should be set from data with :meth:`HallucinationPenalty.calibrate`: it takes captions known to be
correct for their visuals and sets the threshold to a low quantile (default 5%) of their content
tokens' similarities, i.e. about 5% of correct content words get flagged. The default threshold
(:data:`DEFAULT_THRESHOLD`) is only a starting point for OpenAI ViT-B/32-sized models, not a
measured value.

Behaviour on foils (one object word swapped, e.g. "a red image" -> "a blue image"): the swapped word
has no matching frame, so its similarity drops below the threshold and it is flagged. CLIP's text tower
is causal, so the tokens *after* the swap see it too and usually drop as well ("image" in "a blue
image" on a red clip): the penalty moves by the swapped word's share of the content weight or more.
CLIP's causal text tower also lets earlier words carry a later one: after "a red red red red red", the
token "blue" has seen five reds and matches a red frame. So each content word is also judged alone
(``context_free``, default on: the word encoded as a caption of its own) and its similarity is the lower
of the two, so a wrong word is flagged wherever it stands.

What is never content: function words (:data:`~capreward.metrics.token_support.STOP_WORDS`, or low idf) and
generic words that name the medium or nothing (:data:`~capreward.metrics.token_support.GENERIC_WORDS`:
"image", "picture", "photo", "something"), which no visual supports or contradicts. A caption with no
content word at all ("a", "image", "a picture.") says nothing the visual supports: it gets
``empty_penalty`` (default -0.5), between a caption whose words are all supported (0) and one whose
words are all wrong (-1), so a wrong attribute costs more than an absent one and a content-free caption
never earns what a supported one does.

A CLIP only knows the words it was trained on: with the random-weight tiny CLIP of the tests the
similarities carry no meaning; with :mod:`capreward.testing.trained_clip` (a tiny CLIP trained on
colour words) only colour words are meaningful. tests/test_hallucination.py measures the foil
behaviour with the latter on colour-tinted frames of the sample clips.
"""

from __future__ import annotations

from ..scorers.hallucination import DEFAULT_EMPTY_PENALTY, DEFAULT_IDF_THRESHOLD, DEFAULT_THRESHOLD  # noqa: F401
from .metric_reward import MetricReward


class HallucinationPenalty(MetricReward):
    """Reward in [-1, 0]: minus the weighted fraction of content tokens whose best frame similarity is
    below ``threshold``.

    Args:
        threshold: similarity below which a content token is unsupported (see `calibrate()`).
        idf_threshold: with ``idf`` given, tokens whose idf weight is at most this are function words
            (default ln 2); without idf, `STOP_WORDS` decides.
        stop_words: the function-word list used without idf.
        generic_words: words never counted as content (default
            `GENERIC_WORDS`: "image", "picture", "photo", ...).
        empty_penalty: the penalty of a caption without a content word, in [-1, 0] (default -0.5).
        context_free: also judge each content word encoded alone and keep the lower similarity, so words
            before it cannot carry a wrong word ("a red red red blue image"); costs one more text-encoder
            batch (the visuals' embeddings are cached). False: only the word in its caption.
        idf_weighting: weigh tokens by their idf weight (only with ``idf``); else every content token
            counts 1.

    The EMScore options (``model``, ``device``, ``idf``, ``frames``, ``backbone``, ...) and the column options
    of `CaptionReward` are keywords too (the signature lists them); references are not used. Its scorer
    is a `Hallucination`, whose methods read through the reward: ``calibrate(captions, visuals, kind,
    quantile)`` sets ``threshold`` from known-good captions, ``reports(captions, visuals, kind)`` and
    ``report_for(alignment, threshold)`` say which content words are flagged, ``alignments(...)``.

    Logs ``content_tokens`` and ``unsupported_tokens`` (batch means) as sub-scores.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import HallucinationPenalty
        >>> penalty = HallucinationPenalty(model=clip)
        >>> penalty(None, ["a red image.", "a blue image."], image=[red, red])
        [0.0, -1.0]
    """

    __name__ = "hallucination"
    metric = "hallucination"
