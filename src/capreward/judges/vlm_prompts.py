"""Prompts of the VLM-judged metrics VisCE² and G-VEval, as their authors released them.

VisCE² (Maeda et al., "Vision Language Model-based Caption Evaluation Method Leveraging Visual Context
Extraction", 2024, arXiv:2402.17969; the paper's Table 4): the texts come from the released repository
``Silviase/VisCE2`` at its head (f08b2e1): ``prompts/visual_context.txt`` (stage 1, the visual context),
``prompts/visce_2.txt`` (stage 2, the rating) rendered by ``src/utils/prompter.py`` with
``src/utils/constants.py``'s ``desc_task`` ("On a precise scale from 0 to 100, rate whether the candidate
caption is appropriate for the given image.") and the substitutions ``[cand]`` -> ``"Candidate:\\n{caption}"``
and ``[context]`` -> ``"Visual Context:\\n{context}"``. That makes the rendered rating prompt say
"Candidate caption:\\nCandidate:\\n..." - the released behaviour, kept as is. The earlier complete prompt
(``prompts/visce.txt`` with commit 9533bc7's ``desc_task`` "Evaluate the given candidate caption based on
the following information." and ``"Context:\\n"`` label) is the named variant ``"visce"``
(:data:`VISCE2_RATING_VARIANTS`).

G-VEval (Tong et al., "G-VEval: A Versatile Metric for Evaluating Image and Video Captions Using
GPT-4o", 2024, appendix B): the texts are the released repository's ``ztangaj/gveval``
``evaluation/gveval/prompts/{img,vid,vid/accr}/{ref-free,ref-only,combined}.txt`` verbatim (typos such as
"integer scor" and trailing spaces included), with ``{{Reference}}`` and ``{{Caption}}`` filled in as
``scorer.py`` does. The release has ACCR prompts for video only; :func:`gveval_template` raises for
image ACCR rather than inventing a prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from .caller_text import fill_once

#: Bump when the VisCE² context prompt changes: it is part of the visual-context cache key.
VISCE2_PROMPT_VERSION = "visce2-release-1"

VISCE2_CONTEXT_PROMPT = """Analyze the uploaded image and provide a structured output focusing on the objects, their features, and the relationships between them. 
Select up to five of the most important elements. The output should be organized as follows:

List of Important Objects (up to five):

- Object 1: [Brief description]
- Object 2: [Brief description]
- (Continue as necessary, up to five objects)

Features (Specific characteristics and attributes of each object, such as color, shape, size, and texture):

- Features of Object 1: [Detailed description of features]
- Features of Object 2: [Detailed description of features]
- (Continue as necessary for each selected object)

Relationships (The way objects interact or are positioned relative to each other, without using specific object names or symbols):

- Description of a relationship: [General description]
- Another relationship: [General description]
- (Continue as necessary for each relevant relationship)

Focus on providing unique and detailed insights into the features and relationships of the selected objects up to five objects."""

#: ``desc_task`` of the released head's ``constants.py`` (leading and trailing newline included).
VISCE2_TASK = "\nOn a precise scale from 0 to 100, rate whether the candidate caption is appropriate for the given image.\n"

#: ``prompts/visce_2.txt``: ``[task]``, ``[cand]`` and ``[context]`` are filled by :func:`visce2_prompt`.
VISCE2_RATING_TEMPLATE = """[task]
Candidate caption:
[cand]

Use the image and following visual context to evaluate the candidate caption:
[context]

Your final rating must be a single digit between 0 and 100.

Appropriateness(0-100): How well the caption matches the image's content, atmosphere, and context.
A score of 0 indicates complete inappropriateness, while a score of 100 indicates perfect appropriateness."""

#: ``desc_task`` of commit 9533bc7's ``constants.py`` (used by the ``"visce"`` variant).
VISCE2_TASK_9533BC7 = "\nEvaluate the given candidate caption based on the following information.\n"

#: ``prompts/visce.txt``, with ``prompter.py``'s ``[0-100]`` and ``[suffix]`` substitutions applied.
VISCE2_RATING_TEMPLATE_9533BC7 = "[task]\n[cand]\n[context]\nAnswer on a scale of 0 to 100.\nAnswer:"

#: Rating-prompt variants: name -> (template, task sentence, context label). ``"visce_2"`` is the
#: released head's prompt (the default); ``"visce"`` the complete prompt of the earlier commit 9533bc7.
#: The names are the release's prompt ids (``prompts/{name}.txt``).
VISCE2_RATING_VARIANTS: dict[str, tuple[str, str, str]] = {
    "visce_2": (VISCE2_RATING_TEMPLATE, VISCE2_TASK, "Visual Context:"),
    "visce": (VISCE2_RATING_TEMPLATE_9533BC7, VISCE2_TASK_9533BC7, "Context:"),
}


def visce2_prompt(caption: str, context: str, variant: str = "visce_2") -> str:
    """The VisCE² rating message for ``caption`` given the image's visual ``context`` (stage-1 answer).

    ``variant``: ``"visce_2"`` (the released head's prompt, default) or ``"visce"`` (commit 9533bc7's).
    Raises ValueError for another name.
    """
    if variant not in VISCE2_RATING_VARIANTS:
        raise ValueError(f"VisCE² prompt variant must be one of {sorted(VISCE2_RATING_VARIANTS)}, got {variant!r}")
    template, task, label = VISCE2_RATING_VARIANTS[variant]
    # one pass over the template: a caption "[context]" is not replaced by the visual context
    return fill_once(template, {"[task]": task, "[cand]": f"Candidate:\n{caption}", "[context]": f"{label}\n{context}"})


#: The parts the released prompts share word for word: the templates below are the release's files,
#: assembled from these (``{{...}}`` is the release's placeholder syntax, kept literally).
_KEEP_REFERENCES = """Please make sure you read and understand these reference captions carefully. Please keep these references open while reviewing, and refer to them as needed."""

#: Response format of the image ref-free/ref-only and video ref-free prompts.
_SCORE_FORMAT = """Response Format:

You should first give detailed reason for your score, and ending with sentence like this:
The final score is ${{score}}$.

Note that the score should be an integer from 0 to 100, and should be wrapped in the dollar signs ($)."""

#: The same, as the image combined and video ref-only/combined prompts word it ("a detailed reason", "in
#: dollar signs").
_SCORE_FORMAT_EDITED = """Response Format:

You should first give a detailed reason for your score, ending with a sentence like this:
The final score is ${{score}}$.

Note that the score should be an integer from 0 to 100, and should be wrapped in dollar signs ($)."""

#: The ref-only prompts' criteria (the image prompt's line ends in a space, the video one's does not).
_REF_ONLY_CRITERIA = """Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the references. The generated caption should include the important information in the references. Annotators were instructed to penalize captions which contained redundancies and excess information."""


def _assess_and_assign(content: str) -> str:
    """The last two evaluation steps of the ref-free and ref-only prompts; ``content``: "visual" or "video"."""
    return f"""3. Assess how well the generated caption covers the main points of the {content} content, and how much irrelevant or redundant information it contains.
4. Assign an integer score from 0 to 100, please remember it."""


def _ref_only_steps(content: str) -> str:
    """The ref-only prompts' evaluation steps; ``content``: "visual" (image) or "video"."""
    return f"""1. Read the reference captions carefully.
2. Compare the generated caption to the reference captions and identify the main points of the {content} content.
{_assess_and_assign(content)}"""


#: The inputs of the video ref-only and combined prompts (ACCR included).
_VID_INPUTS = """Reference Captions:
{{Reference}}

Generated Caption:
{{Caption}}"""

_IMG_REF_FREE = f"""You will be given one sentence of visual caption generated from one image.

Your task is to rate the generated caption on one metric.

Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the image. The generated caption should accurately describe the important aspects of the image. Annotators were instructed to penalize captions which contained redundancies and excess information.

Evaluation Steps:

1. Carefully observe the image provided.
2. Identify the main points of the visual content in the image.
{_assess_and_assign("visual")}

Generated captions:
{{{{Caption}}}}

{_SCORE_FORMAT}"""

_IMG_REF_ONLY = f"""You will be given one sentence of visual caption generated from one image. 

Your task is to rate the generated caption on one metric

{_KEEP_REFERENCES} 

{_REF_ONLY_CRITERIA} 

Evaluation Steps:

{_ref_only_steps("visual")}

Reference captions:
{{{{Reference}}}}

Generated captions:
{{{{Caption}}}}

{_SCORE_FORMAT} """

_IMG_COMBINED = f"""You will be given one sentence of visual caption generated from one image.

Your task is to rate the generated caption on one metric.

{_KEEP_REFERENCES}

Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the references and the image. The generated caption should accurately describe the important aspects of the image while including the essential information from the references. Annotators were instructed to penalize captions which contained redundancies and excess information.

Evaluation Steps:

1. Carefully observe the provided image to understand its main content.
2. Read the reference captions carefully to identify the important information they highlight.
3. Compare the generated caption to both the reference captions and the visual content of the image.
4. Assess how well the generated caption covers the main points of the visual content and the reference captions, and how much irrelevant or redundant information it contains.
5. Assign an integer score from 0 to 100, considering both the alignment with the image and the inclusion of key points from the references. Please remember the score.

Reference captions:
{{{{Reference}}}}

Image is attached

Generated captions:
{{{{Caption}}}}

{_SCORE_FORMAT_EDITED}"""

_VID_REF_FREE = f"""You will be given one sentence of visual caption generated from a complete video. For evaluation purposes, you are provided with a single image that contains three concatenated frames from the video. These frames are meant to represent key moments from the video but do not encompass the entire content.

Your task is to rate the generated caption on one metric.

Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the video frames. The generated caption should accurately describe the important aspects of the video as represented by these key frames. Annotators were instructed to penalize captions which contained redundancies and excess information.

Evaluation Steps:

1. Carefully examine the provided image, noting that it includes three distinct frames labeled as Frame 1, Frame 2, and Frame 3.
2. Identify the main points of the visual content across these key frames.
{_assess_and_assign("visual")}

Generated Caption:
{{{{Caption}}}}

{_SCORE_FORMAT}"""

_VID_REF_ONLY = f"""You will be given a caption generated from a complete video. For evaluation purposes, you are provided with reference captions that describe specific frames or the overall video content.

Your task is to rate the generated caption on one metric.

{_KEEP_REFERENCES}

{_REF_ONLY_CRITERIA}

Evaluation Steps:

{_ref_only_steps("video")}

{_VID_INPUTS}

{_SCORE_FORMAT_EDITED}"""

_VID_COMBINED = f"""You will be given a caption generated from a complete video. For evaluation purposes, you are provided with a single image that combines three key frames from the video. Additionally, reference captions that describe these specific frames or the overall video content are also provided.

Your task is to rate the generated caption on one metric.

{_KEEP_REFERENCES}

Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the references and the video frames. The generated caption should accurately describe the important aspects of the image while including the essential information from the references. Annotators were instructed to penalize captions which contained redundancies and excess information.

Evaluation Steps:

1. Carefully examine the provided image, which includes three distinct frames labeled as Frame 1, Frame 2, and Frame 3, to understand the main content of the video.
2. Read the reference captions carefully to identify the important information they highlight about the video content.
3. Compare the generated caption to both the reference captions and the visual content of the key frames.
4. Assess how well the generated caption covers the main points of the video content as represented by the key frames and the reference captions, and how much irrelevant or redundant information it contains.
5. Assign an integer score from 0 to 100, considering both the alignment with the video content (as shown in the key frames) and the inclusion of key points from the references. Please remember the score.

Reference Captions:
{{{{Reference}}}}

Video Frames are attached.

Generated Caption:
{{{{Caption}}}}

{_SCORE_FORMAT_EDITED}"""

_ACCR_DIMENSIONS = """Evaluation Dimensions:

Accuracy: Does the caption correctly describe the entities and actions shown in the video without errors or hallucinations?
Completeness: Does the caption cover all significant events and aspects of the video, including dynamic actions and possible scene transitions?
Conciseness: Is the caption clear and succinct, avoiding unnecessary details and repetition?
Relevance: Is the caption pertinent to the video content, without including irrelevant information or questions?"""

_ACCR_ASSIGN = """Assign an integer scor from 0 to 100 for the caption based on the following dimensions:
    - Accuracy: Does the caption correctly describe the entities and actions shown in the video without errors or hallucinations?
    - Completeness: Does the caption cover all significant events and aspects of the video, including dynamic actions and possible scene transitions?
    - Conciseness: Is the caption clear and succinct, avoiding unnecessary details and repetition?
    - Relevance: Is the caption pertinent to the video content, without including irrelevant information or questions?"""

_ACCR_FORMAT = """You should first give detailed reason for your scores, and ending with sentence for each score like this:
..... The Accuracy score is α{{accuracy_score}}α.
..... The Completeness score is β{{completeness_score}}β.
..... The Conciseness score is ψ{{conciseness_score}}ψ.
..... The Relevance score is δ{{relevance_score}}δ.

Note that the score should be an integer from 0 to 100, and should be wrapped in the corresponding Greek alphabet.
Wrap Accuracy score in α
Wrap Completeness score in β
Wrap Conciseness score in ψ
Wrap Relevance score in δ """

_VID_ACCR_REF_FREE = f"""You will be given one sentence of visual caption generated from a complete video. For evaluation purposes, you are provided with a single image that contains three concatenated frames from the video. These frames are meant to represent key moments from the video but do not encompass the entire content.

Your task is to rate the generated caption on one metric.

Evaluation Criteria:

Score is from 0 to 100 - selection of important content from the video frames. The generated caption should accurately describe the important aspects of the video as represented by these key frames. Annotators were instructed to penalize captions which contained redundancies and excess information.

{_ACCR_DIMENSIONS}

Evaluation Steps: 
1. Carefully examine the provided image, noting that it includes three distinct frames labeled as Frame 1, Frame 2, and Frame 3.
2. Read the generated caption.
    1. Carefully read the generated caption that needs to be evaluated.
3. Compare the generated caption with the reference captions and assess how well it captures the essence of the video.
4. Assess how well the generated caption covers the main points of the visual content, and how much irrelevant or redundant information it contains.
5. Check for the inclusion of irrelevant details or the omission of significant elements.
6. {_ACCR_ASSIGN}

Generated Caption:
{{{{Caption}}}}

{_ACCR_FORMAT}"""

_VID_ACCR_REF_ONLY = f"""You will be given a caption generated for a short video segment.

Your task is to rate the generated caption based on its accuracy in capturing the essential content of the video as described in the reference captions.

Evaluation Criteria:

Score is from 0 to 100 - The generated caption should accurately reflect the content in the reference captions and appropriately describe the key actions or events visible in the video. Annotators should penalize captions that include irrelevant details or omit significant elements indicated in the reference captions and the video.

{_ACCR_DIMENSIONS}

Evaluation Steps: 
1. Examine the provided reference captions carefully.
    1. Read the full reference captions that describe the overall video content or specific actions.
    2. Review each reference caption thoroughly to understand what aspects of the video they highlight.
2. Read the generated caption.
    1. Carefully read the generated caption that needs to be evaluated.
3. Compare the generated caption with the reference captions and assess how well it captures the essence of the video.
4. Evaluate how accurately and completely the generated caption describes the events and entities shown in the video.
5. Check for the inclusion of irrelevant details or the omission of significant elements.
6. {_ACCR_ASSIGN}

{_VID_INPUTS}

{_ACCR_FORMAT}"""

_VID_ACCR_COMBINED = f"""You will be given one sentence of visual caption generated from a complete video. For evaluation purposes, you are provided with a single image that contains three concatenated frames from the video. These frames are meant to represent key moments from the video but do not encompass the entire content.

Your task is to rate the generated caption based on its accuracy in capturing the essential content of the video, as described by both the provided reference captions and the visual information encoded in selected frames from the video.

Evaluation Criteria:

Score is from 0 to 100 - The generated caption should accurately reflect the content as described in the reference captions and appropriately describe the key actions or events visible in the provided video frames. Annotators should penalize captions that include irrelevant details, omit significant elements indicated by the reference captions, or fail to accurately describe the visual content of the video.

{_ACCR_DIMENSIONS}

Evaluation Steps: 
1. Examine the Provided Reference Captions:
    1. Read the reference captions that describe the overall video content or specific actions thoroughly to understand the aspects of the video they highlight.
2. Analyze the Provided Video Frames:
    1. Carefully examine the provided frames, which represent key moments or transitions in the video. Understand the sequence and context of these frames as they relate to the entire video.
3. Read the Generated Caption:
    1. Carefully read the generated caption that needs to be evaluated.
4. Compare and Evaluate:
    1. Assess how well the generated caption captures the essence of the video by comparing it against the reference captions and the visual content of the frames.
    2. Evaluate the accuracy and completeness of the generated caption in describing the events and entities shown in the video and reflected in the reference captions.
    3. Check for the inclusion of irrelevant details or the omission of significant elements indicated by either the reference captions or the video frames.
5. {_ACCR_ASSIGN}

{_VID_INPUTS}

{_ACCR_FORMAT}"""

GVEVAL_MODES = ("ref-free", "ref-only", "combined")

#: (visual, mode, accr) -> template; visual is "img" or "vid" as in the release's ``select_prompt``.
GVEVAL_TEMPLATES: dict[tuple[str, str, bool], str] = {
    ("img", "ref-free", False): _IMG_REF_FREE,
    ("img", "ref-only", False): _IMG_REF_ONLY,
    ("img", "combined", False): _IMG_COMBINED,
    ("vid", "ref-free", False): _VID_REF_FREE,
    ("vid", "ref-only", False): _VID_REF_ONLY,
    ("vid", "combined", False): _VID_COMBINED,
    ("vid", "ref-free", True): _VID_ACCR_REF_FREE,
    ("vid", "ref-only", True): _VID_ACCR_REF_ONLY,
    ("vid", "combined", True): _VID_ACCR_COMBINED,
}


def gveval_template(visual: str, mode: str, accr: bool = False) -> str:
    """The released G-VEval prompt template for ``visual`` ("img" or "vid"), ``mode`` and ACCR or not.

    Raises ValueError for unknown values, and for image ACCR (the release has no such prompt).
    """
    if visual not in ("img", "vid"):
        raise ValueError(f"visual must be 'img' or 'vid', got {visual!r}")
    if mode not in GVEVAL_MODES:
        raise ValueError(f"mode must be one of {GVEVAL_MODES}, got {mode!r}")
    if accr and visual == "img":
        raise ValueError("G-VEval's released ACCR prompts are for video only; use videos=... or accr=False")
    return GVEVAL_TEMPLATES[(visual, mode, bool(accr))]


def gveval_references(references: Sequence[str]) -> str:
    """References as the released ``scorer.py`` joins them: ``"'" + "'; '".join(refs)``.

    Note the release opens every reference with a quote but does not close the last one
    (``"'a'; 'b"``); kept so that published numbers reproduce.
    """
    return "'" + "'; '".join(references)


def gveval_prompt(template: str, caption: str, references: Sequence[str] | None = None) -> str:
    """``template`` with ``{{Reference}}`` and ``{{Caption}}`` filled in, in one pass over the template (a
    reference holding "{{Caption}}" stays that text; the release's two ``str.replace`` calls would put
    the candidate there)."""
    refs = gveval_references(references) if references else ""
    return fill_once(template, {"{{Reference}}": refs, "{{Caption}}": caption})


def prompt_words() -> list[str]:
    """Every alphabetic word of the VisCE² and G-VEval prompts (for a tiny judge's vocabulary)."""
    import re

    texts = [VISCE2_CONTEXT_PROMPT, "Candidate Context Visual", *(t + task for t, task, _ in VISCE2_RATING_VARIANTS.values())]
    texts += list(GVEVAL_TEMPLATES.values())
    return list(dict.fromkeys(w for t in texts for w in re.findall(r"[A-Za-z']+", t)))
