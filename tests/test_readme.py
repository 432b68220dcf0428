"""The README cannot drift from the code: every ```python block of README.md is executed, on the tiny
local models, and the set-up commands are exactly what CI runs.

How a block is run: the string replacements of :data:`SUBSTITUTIONS` (real model names, devices and
paths -> tiny local models and files) are applied, then the block is executed in a namespace holding
what the ``inputs`` fixture, :func:`policy_and_data` and :func:`judges` provide (the tiny models, and the
user's data a block refers to without defining it: captions, a video, images, a dataset).
New blocks run by default; a block that cannot run must be listed in :data:`NOT_RUN` with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, random_video, sample_clips, write_mp4

README = REPO / "README.md"

#: Real names in the README -> what the test runs instead (applied to every block, in this order).
SUBSTITUTIONS: list[tuple[str, str]] = [
    ('"ViT-B-32/openai"', "TINY_CLIP"),                      # a random tiny CLIP, OpenAI-format .pt
    ('device="cuda"', 'device="cpu"'),
    ('dtype="float16"', 'dtype="float32"'),
    ('"clip.mp4"', "VIDEO"),
    ('"dog.jpg"', "IMAGE"),
    ('"llava-hf/llava-1.5-13b-hf"', "TINY_FLEUR_JUDGE"),       # tiny_judge_dir(): trained on FLEUR's prompt
    ('"llava-hf/llava-1.5-7b-hf"', "TINY_POLICY_BASE"),        # the tiny LLaVA the recipe's --tiny policy starts from
    ('"runs/grpo"', "ADAPTER_DIR"),                            # what `grpo_captioner.py --tiny --steps 1` saved
    ('OpenAIJudge(base_url="http://localhost:8000/v1", model="Qwen/Qwen2-VL-7B-Instruct")',
     "LocalChatJudge(tiny_vlm_judge())"),                      # no server: the tiny VisCE²/G-VEval judge
    ('"nlpconnect/vit-gpt2-image-captioning"', "TINY_CAPTIONER"),  # the tiny ViT-GPT2, saved with save_pretrained
    ("model=policy,", "model=TINY_POLICY_BASE,"),              # TRL loads model and processor from the folder
    ("GRPOConfig(...)", 'GRPOConfig(output_dir=OUT, max_steps=1, per_device_train_batch_size=2, num_generations=2, '
                        'max_completion_length=4, use_cpu=True, report_to="none")'),
]

#: Blocks (identified by their first line) that are not executed, with the reason.
NOT_RUN: dict[str, str] = {}


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(section heading, code) of every ```python block, in order."""
    blocks, heading = [], ""
    for m in re.finditer(r"^(#+ [^\n]*)$|^```python\n(.*?)^```", text, flags=re.S | re.M):
        if m.group(1):
            heading = m.group(1).lstrip("# ").strip()
        else:
            blocks.append((heading, m.group(2)))
    return blocks


def substitute(code: str) -> str:
    for old, new in SUBSTITUTIONS:
        code = code.replace(old, new)
    return code


BLOCKS = python_blocks(README.read_text())
#: README sections whose blocks are slow (the slow examples moved to docs/: tests/test_docs_code.py SLOW_PAGES).
SLOW_SECTIONS: set[str] = set()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_clip_path):
    """The tiny models and the user data the README's blocks refer to."""
    from PIL import Image

    tmp = tmp_path_factory.mktemp("readme")
    clips = sample_clips()
    video = str(clips[0]) if clips else str(write_mp4(tmp / "clip.mp4", random_video(0)))
    image = tmp / "dog.png"
    Image.fromarray(random_video(1, frames=1)[0]).save(image)
    return {
        "TINY_CLIP": str(tiny_clip_path),
        "VIDEO": video,
        "IMAGE": str(image),
        "OUT": str(tmp / "out"),
        "video": video,
        "reference_corpus": ["a man is cooking", "a dog runs on the beach", "people dance on a stage"],
        "completions": ["a man cooks in a kitchen.", "a person is cooking food", "someone slices onions"],
        "_tmp": tmp,
    }


def policy_and_data(ns: dict, tmp: Path) -> None:
    """A saved tiny LLaVA (the --tiny recipe's starting point), the adapter the recipe trains on it in
    one step, a TRL dataset and a list of images."""
    import importlib

    from datasets import Dataset

    from capreward.testing import TinyLlavaSpec, build_tiny_llava
    from capreward.testing.trained_clip import colour_image

    from capreward.recipes import grpo_captioner as recipe
    base = tmp / "tiny_policy"
    if not base.is_dir():
        model, processor = build_tiny_llava(TinyLlavaSpec(words=recipe.TINY_WORDS, seed=0))
        model.save_pretrained(base)
        processor.save_pretrained(base)
    adapter = tmp / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        recipe.main(["--tiny", "--quiet", "--steps", "1", "--batch-size", "2", "--num-generations", "2",
                     "--max-completion-length", "4", "--rewards", "clip_s", "--out", str(adapter)])
    importlib.invalidate_caches()
    images = [colour_image(c) for c in ("red", "blue")]
    ns.update(
        TINY_POLICY_BASE=str(base), ADAPTER_DIR=str(adapter), images=images,
        ds=Dataset.from_list([{"prompt": [{"role": "user", "content": "Describe the video"}], "video": ns["VIDEO"]}] * 2),
    )


def judges(ns: dict) -> None:
    """The tiny judges and their inputs (images of the judges' colour task, a synthetic video)."""
    import random

    from capreward.testing import fleur_task_image, tiny_judge_dir
    from capreward.testing.tiny_vlm_judges import synthetic_video, tiny_vlm_judge

    rng = random.Random(0)
    ns.update(
        TINY_FLEUR_JUDGE=str(tiny_judge_dir()), tiny_vlm_judge=tiny_vlm_judge,
        captions=["a red square", "a blue square"], images=[fleur_task_image("red", rng), fleur_task_image("blue", rng)],
        videos=[synthetic_video("red"), synthetic_video("green")], refs=[["a red square"], ["a green square"]],
    )


def captioner(ns: dict, tmp: Path) -> None:
    """The tiny ViT-GPT2 captioner saved as a checkpoint directory, and images to caption."""
    from capreward.testing.tiny_captioner import build_tiny_captioner
    from capreward.testing.trained_clip import colour_image

    path = tmp / "tiny_captioner"
    if not (path / "config.json").is_file():
        for part in build_tiny_captioner(seed=0):
            part.save_pretrained(path)
    ns.update(TINY_CAPTIONER=str(path), images=[colour_image(c) for c in ("red", "blue")])


@pytest.mark.parametrize(
    "heading,code",
    [pytest.param(h, c, id=f"{i}-{h[:30]}", marks=[pytest.mark.slow] if h in SLOW_SECTIONS else [])
     for i, (h, c) in enumerate(BLOCKS)],
)
def test_readme_python_block_runs(heading, code, inputs):
    first = code.strip().splitlines()[0]
    if first in NOT_RUN:
        pytest.skip(NOT_RUN[first])
    run_block(code, inputs, f"README.md[{heading}]")


def run_block(code: str, inputs: dict, label: str) -> None:
    """Run one markdown python block the README's way (tests/test_docs_code.py runs the docs' blocks
    with it): the substitutions applied, in a namespace with the tiny models and what the block needs."""
    ns = {k: v for k, v in inputs.items() if not k.startswith("_")}
    if "TINY_POLICY_BASE" in substitute(code) or "ds" in re.findall(r"\b(ds)\b", code):
        policy_and_data(ns, inputs["_tmp"])
    if re.search(r"\b(FLEUR|VisCE2|GVEval)\b", code):
        judges(ns)
    if "TINY_CAPTIONER" in substitute(code):
        captioner(ns, inputs["_tmp"])
    exec(compile(substitute(code), label, "exec"), ns)


def test_every_not_run_entry_names_an_existing_block():
    firsts = {c.strip().splitlines()[0] for _, c in BLOCKS}
    assert set(NOT_RUN) <= firsts


def test_ci_runs_the_readme_commands_exactly_and_in_order():
    text = README.read_text()
    commands = re.findall(r"```bash\n(bash scripts/bootstrap\.sh.*?)\n```", text)
    assert commands[:2] == [
        "bash scripts/bootstrap.sh && .venv/bin/capreward demo",
        "bash scripts/bootstrap.sh --test && .venv/bin/python -m pytest -q -n 2",
    ]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("bash ")]
    assert ci == commands[:2]


def test_main_job_imports_only_core_and_demo_dependencies():
    """Every third-party distribution that the modules of ours the demo loads (capreward's, the GRPO
    recipe's included) import, at the top or inside functions, is a core dependency of pyproject.toml, in
    its `demo` extra, or required (transitively) by one: the demo must run on a plain `bootstrap.sh`
    install, which installs the `demo` extra. (Third-party packages' own optional imports are theirs to
    guard.)"""
    import subprocess
    import sys

    code = (
        "import sys, capreward.cli.demo as d, capreward.cli.main, capreward.testing.colour_task, capreward.testing.trained_clip;"
        "d.load_recipe(); import capreward.rewards, capreward.scorers.emscore, capreward.scorers.clipscore;"
        "print('\\n'.join(sorted(str(getattr(m, '__file__', '') or '') for m in list(sys.modules.values()))))"
    )
    files = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    ours = [Path(f) for f in files if f.endswith(".py") and (f.startswith(str(REPO / "src")) or f.startswith(str(REPO / "recipes")))]
    assert any(f.name == "grpo_captioner.py" for f in ours) and any(f.name == "demo.py" for f in ours)
    from test_packaging import CORE, OPTIONAL, _closure, providers, required_extras, third_party_imports

    core_and_demo = _closure(tuple(CORE + OPTIONAL["demo"]))
    missing = set()
    for f in ours:
        # an import behind require("<extra>", ...) is that extra's (the demo never reaches it; if it did, the
        # error would name the extra): the rest must come with core + demo
        gated = _closure(tuple(r for e in sorted(required_extras(f) - {"demo", "recipes"}) for r in OPTIONAL[e]))
        missing |= {m for m in third_party_imports(f) if not providers(m) & (core_and_demo | gated)}
    missing = sorted(missing)
    assert missing == [], f"imported by the demo's modules but neither core nor demo dependencies: {missing}"


# The builder table ("Try it without weights") moved to docs/quickstart.md with the test that checks it
# (tests/test_docs_code.py).


def test_every_markdown_file_the_readme_cites_is_in_the_repository():
    """Round 3: the README cited a DESIGN.md that the repository does not hold. The README is the landing
    page: its links into docs/ must reach pages of the repository too."""
    text = README.read_text(encoding="utf-8")
    cited = set(re.findall(r"(?<![\w/.])([\w./-]+\.md)\b", text)) - {"README.md"}
    missing = sorted(name for name in cited if not (REPO / name).exists())
    assert not missing, f"README.md cites files not in the repository: {missing}"


def test_the_readme_is_a_landing_page_of_at_most_200_lines():
    """Everything else lives in the docs site (docs/, tests/test_docs_build.py)."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_every_link_of_the_readme_into_the_docs_reaches_a_page_and_heading():
    """``docs/page.md#anchor`` links: the page exists and, with an anchor, has that heading."""
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[\w./-]+\.md)(?:#([\w-]+))?\)", text)
    assert links
    for page, anchor in links:
        assert (REPO / page).is_file(), page
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (REPO / page).read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w\s-]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{page} has no heading #{anchor}"


def test_the_readme_metrics_table_agrees_with_the_registry():
    """The landing page's table of metrics: one row per registered metric, in the registry's order, with
    the title, visuals, reference mode and range of its spec (the docs' metric pages are generated from
    the specs; this table is the README's copy, checked here)."""
    from capreward import registry

    table = re.search(r"^\| name \| metric \| visuals \| references \| range \|\n\|[- |]+\|\n((?:\|.*\|\n)+)",
                      README.read_text(encoding="utf-8"), flags=re.M)
    assert table, "README.md has no '| name | metric | visuals | references | range |' table"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.group(1).splitlines()]
    assert [r[0].strip("`") for r in rows] == list(registry.names())

    def bound(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    for (name, metric, visuals, references, value_range), spec in zip(rows, registry.specs()):
        assert metric.startswith(spec.title), (name, metric)
        assert visuals == ", ".join(spec.visuals) and references == spec.references, name
        assert value_range == f"[{bound(spec.value_range[0])}, {bound(spec.value_range[1])}]", name
