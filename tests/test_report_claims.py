"""The report's flag view of the claim reward: a results file written by a real ``capreward score --metrics
claims`` run on the tiny trained claim judge, rendered by ``capreward report``; every claim of a caption is
marked in the caption as verified or not, as the results file's probabilities and the scorer called
directly say."""

from __future__ import annotations

import json
import random
from html.parser import HTMLParser

import pytest
from PIL import Image

from capreward.judges import LocalChatJudge
from capreward.report.claims_view import claim_verdicts, claims_section, marked_caption
from capreward.scorers.claims import ClaimScorer
from capreward.testing.tiny_claim_judge import claim_image, tiny_claim_judge, tiny_claim_judge_dir
import cli_process

CAPTIONS = ["the background is red. there is a green patch.", "the background is red. a blue ball.",
            "a photo. the background is red."]


def cli(*args):
    return cli_process.run(args, timeout=900)


class Marks(HTMLParser):
    """Per sample (``data-id``): its ``data-flagged`` and the (class, text) of every ``<mark>``."""

    def __init__(self):
        super().__init__()
        self.samples: dict[str, dict] = {}
        self.current: str | None = None
        self.mark: list | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "sample" in (a.get("class") or "").split():
            self.current = a["data-id"]
            self.samples[self.current] = {"flagged": a["data-flagged"], "marks": []}
        elif tag == "mark" and self.current is not None:
            self.mark = [a["class"], ""]

    def handle_data(self, data):
        if self.mark is not None:
            self.mark[1] += data

    def handle_endtag(self, tag):
        if tag == "mark" and self.mark is not None:
            self.samples[self.current]["marks"].append(tuple(self.mark))
            self.mark = None


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    d = tmp_path_factory.mktemp("report-claims")
    claim_image("red", "green", random.Random("report-claims")).save(d / "im.png")
    (d / "m.jsonl").write_text("".join(json.dumps({"id": f"s{i}", "caption": c, "image": str(d / "im.png")}) + "\n"
                                       for i, c in enumerate(CAPTIONS)))
    proc = cli("score", d / "m.jsonl", "--metrics", "claims", "--judge-model", tiny_claim_judge_dir(),
               "--out", d / "scores.jsonl", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


def test_the_page_marks_each_claim_as_the_results_and_the_scorer_say(scored):
    rows = [json.loads(line) for line in (scored / "scores.jsonl").read_text().splitlines()]
    page = scored / "r.html"
    proc = cli("report", scored / "scores.jsonl", "--out", page, "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    parser = Marks()
    parser.feed(page.read_text())
    image = Image.open(scored / "im.png").convert("RGB")
    direct = ClaimScorer(LocalChatJudge(tiny_claim_judge())).score(CAPTIONS, images=[image] * 3)
    for row, claims in zip(rows, direct.claims):
        shown = parser.samples[row["id"]]
        expected = [(f"claim {'verified' if c.p >= 0.5 else 'unverified'}", row["caption"][c.start:c.end]) for c in claims]
        assert shown["marks"] == expected
        assert [v["p"] for v in row["claims/claims"]] == pytest.approx([c.p for c in claims], abs=1e-6)
        assert shown["flagged"] == str(int(any(c.p < 0.5 for c in claims)))
    # the tiny judge verifies the true claims and refutes the hallucinated ball
    assert parser.samples["s0"]["marks"] == [("claim verified", "the background is red"),
                                             ("claim verified", "there is a green patch")]
    assert parser.samples["s1"]["marks"][1] == ("claim unverified", "a blue ball") and parser.samples["s1"]["flagged"] == "1"


def test_spans_that_miss_are_found_in_the_caption_and_text_is_escaped():
    row = {"caption": "a <b>red</b> ball. a cat.",
           "claims/claims": [{"text": "a cat", "start": 0, "end": 5, "p": 0.1},  # span points elsewhere
                             {"text": "a <b>red</b> ball", "start": 0, "end": 17, "p": 0.9},
                             {"text": "a dog", "start": -1, "end": -1, "p": None}]}
    shown = claim_verdicts(row)
    assert [(c.start, c.end, c.verdict) for c in shown] == [(19, 24, "not verified"), (0, 17, "verified"),
                                                           (-1, -1, "no verdict")]
    html = marked_caption(row["caption"], shown)
    assert "<b>" not in html and "&lt;b&gt;red&lt;/b&gt;" in html
    assert html.index('class="claim verified"') < html.index('class="claim unverified"')
    assert "(not in the caption)" in claims_section(row)


@pytest.mark.parametrize("value, message", [
    ("x", "not a list of claims"),
    ([{"text": "a", "start": "0", "end": 1, "p": 0.5}], r"claims/claims\[0\].start' is not an integer"),
    ([{"text": "a", "start": 0, "end": 1, "p": 1.5}], "not a probability"),
])
def test_the_report_refuses_malformed_verdicts_naming_the_line(tmp_path, value, message):
    scores = tmp_path / "s.jsonl"
    scores.write_text(json.dumps({"id": "a", "caption": "a", "claims": 0.5, "claims/claims": value}) + "\n")
    result = cli("report", scores, "--out", tmp_path / "r.html", "--no-progress")
    assert result.returncode != 0
    assert "s.jsonl:1" in result.stderr and __import__("re").search(message, result.stderr), result.stderr


class CountingText(str):
    """The caption's lowered text, counting the searches made in it."""

    calls = 0

    def find(self, *args):
        CountingText.calls += 1
        return super().find(*args)


def searches(claims: list[dict], caption: str) -> tuple[int, list]:
    from capreward.report.claims_view import _Spans

    spans = _Spans(caption)
    spans.lower = CountingText(spans.lower)
    CountingText.calls = 0
    found = [spans.locate(c["text"], c["start"], c["end"]) for c in claims]
    return CountingText.calls, found


@pytest.mark.parametrize("n", [400, 1600])
def test_the_claims_view_searches_the_caption_a_bounded_number_of_times_per_claim(n):
    """Issue 43 item 5: 800 claims took 85 s (every claim scanned the whole caption once per earlier
    claim). Stale spans of one repeated claim, and of distinct claims in caption order, now cost a
    bounded number of searches per claim, and each span found is its claim's text, none overlapping."""
    repeated = ". ".join(["A red ball"] * n) + "."
    rows = [(repeated, [{"text": "a red ball", "start": -1, "end": -1, "p": 0.9}] * n)]
    parts = [f"object {k} is red" for k in range(n)]
    rows.append((". ".join(parts) + ".", [{"text": p, "start": 5, "end": 3, "p": 0.2} for p in parts]))
    for caption, claims in rows:
        calls, found = searches(claims, caption)
        assert calls <= 2 * n + 2, calls
        assert all(caption[s:e].lower() == c["text"].lower() for (s, e), c in zip(found, claims))
        ends = sorted(found)
        assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no two spans overlap
    # one more copy than the caption holds: found nowhere free, at the cost of one more search
    calls, found = searches([{"text": "a red ball", "start": -1, "end": -1, "p": 0.9}] * (n + 1), repeated)
    assert found[-1] == (-1, -1) and calls <= 2 * n + 4
