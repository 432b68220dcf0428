"""A synthetic scenes world with ground truth: images of 1-4 coloured shapes, a caption grammar for
true captions and hard negatives, and a judge that grades any caption against the scene.

A harder offline task than :mod:`capreward.testing.colour_task` (one colour per image): here a caption
must get the *count*, the *shapes*, the *colours* and which colour goes with which shape (the *binding*)
right, as in "two red circles and a blue cross". What this module holds (pure Python, numpy and PIL; no
model):

- the world: :class:`SceneObject` (shape, colour, cell of a 2x2 grid) and :class:`Scene`;
  :func:`random_scene` draws one (1-4 objects, one per cell, attributes often repeated so counts above
  one occur); :func:`render_scene` draws it as a small RGB image (dark noisy background, jittered size,
  position and colour);
- the grammar: a caption is a list of :class:`Mention` (count, colour, shape) written
  "two red circles, a blue square and a green cross" (:func:`write_caption`); :func:`true_caption` is the
  scene's description; :func:`hard_negative` changes exactly one slot of it (:data:`NEGATIVE_KINDS`:
  a count swap, an attribute-binding swap, a missing or an extra object, a colour or a shape swap);
- the judge: :func:`parse_caption` reads a caption back into mentions (words outside the grammar are
  ignored and listed), and :func:`judge` grades it against the scene's ground truth per slot (count,
  shape, colour, binding, exact), counting hallucinated and omitted objects, repeated mentions and
  colour-free mentions. The judge knows the generator's truth, so it is independent of every model.

Every function is deterministic for a given ``random.Random`` state.

Examples:
    >>> import random
    >>> from scenes_world.world import Scene, SceneObject, judge, hard_negative, true_caption
    >>> scene = Scene((SceneObject("circle", "red", 0), SceneObject("circle", "red", 1), SceneObject("cross", "blue", 3)))
    >>> true_caption(scene)
    'two red circles and a blue cross'
    >>> judge(scene, "a red circle and a blue cross").omitted
    1
    >>> hard_negative(scene, "binding", random.Random(0))
    'two blue circles and a red cross'
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from PIL import Image, ImageDraw

#: Colours of the world (name -> RGB): the four task colours of the colour CLIP.
SCENE_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 30, 35),
    "green": (35, 165, 50),
    "blue": (35, 70, 215),
    "yellow": (240, 215, 35),
}
#: Shapes of the world (singular -> plural); every form is one token of CLIP's BPE vocabulary.
SHAPES: dict[str, str] = {"circle": "circles", "square": "squares", "cross": "crosses"}
PLURALS: dict[str, str] = {p: s for s, p in SHAPES.items()}
#: Count words (1 is written "a"; "one" and digits are read too).
COUNT_WORDS: dict[int, str] = {1: "a", 2: "two", 3: "three", 4: "four"}
_READ_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                "1": 1, "2": 2, "3": 3, "4": 4, "5": 5, "6": 6}
#: Cells of the 2x2 grid, in reading order.
CELLS: tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right")
MAX_OBJECTS = len(CELLS)
#: The kinds of hard negative :func:`hard_negative` makes, each changing one slot of the true caption.
NEGATIVE_KINDS: tuple[str, ...] = ("count", "binding", "missing", "extra", "colour", "shape")


# ------------------------------------------------------------------------------------------ the world
@dataclass(frozen=True)
class SceneObject:
    """One object: its ``shape`` (a key of :data:`SHAPES`), ``colour`` (a key of
    :data:`SCENE_COLOURS`) and ``cell`` (0-3, an index of :data:`CELLS`)."""

    shape: str
    colour: str
    cell: int

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; expected one of {list(SHAPES)}")
        if self.colour not in SCENE_COLOURS:
            raise ValueError(f"unknown colour {self.colour!r}; expected one of {list(SCENE_COLOURS)}")
        if not 0 <= self.cell < MAX_OBJECTS:
            raise ValueError(f"cell must be in 0..{MAX_OBJECTS - 1}, got {self.cell!r}")


@dataclass(frozen=True)
class Scene:
    """A scene: 1-4 objects in distinct cells.

    Raises:
        ValueError: no object, more than :data:`MAX_OBJECTS`, or two objects in one cell.
    """

    objects: tuple[SceneObject, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.objects) <= MAX_OBJECTS:
            raise ValueError(f"a scene has 1-{MAX_OBJECTS} objects, got {len(self.objects)}")
        cells = [o.cell for o in self.objects]
        if len(set(cells)) != len(cells):
            raise ValueError(f"two objects share a cell: {cells}")

    def groups(self) -> Counter:
        """(colour, shape) -> number of objects."""
        return Counter((o.colour, o.shape) for o in self.objects)

    def colours(self) -> frozenset[str]:
        return frozenset(o.colour for o in self.objects)

    def shapes(self) -> frozenset[str]:
        return frozenset(o.shape for o in self.objects)

    def key(self) -> tuple:
        """What a caption can say about the scene (its groups, positions aside): equal keys, same true caption content."""
        return tuple(sorted(self.groups().items()))


def random_scene(rng: random.Random, n_objects: int | None = None, repeat: float = 0.4) -> Scene:
    """A scene of ``n_objects`` (default: uniform in 1-4) in random cells; each object after the first
    copies the colour and shape of an earlier one with probability ``repeat`` (so counts above one are
    common), else draws both uniformly."""
    n = rng.randint(1, MAX_OBJECTS) if n_objects is None else n_objects
    if not 1 <= n <= MAX_OBJECTS:
        raise ValueError(f"n_objects must be in 1..{MAX_OBJECTS}, got {n}")
    cells = rng.sample(range(MAX_OBJECTS), n)
    objects: list[SceneObject] = []
    for cell in cells:
        if objects and rng.random() < repeat:
            like = rng.choice(objects)
            objects.append(SceneObject(like.shape, like.colour, cell))
        else:
            objects.append(SceneObject(rng.choice(list(SHAPES)), rng.choice(list(SCENE_COLOURS)), cell))
    return Scene(tuple(sorted(objects, key=lambda o: o.cell)))


def render_scene(scene: Scene, rng: random.Random, size: int = 64) -> Image.Image:
    """The scene as a ``size`` x ``size`` RGB image: a dark background (grey 30-60) with Gaussian noise
    (sigma 8), each object drawn in its cell of the 2x2 grid at 60-80 % of the cell's side, its centre
    jittered within the cell and its colour shifted by up to +-20 per channel. Deterministic for ``rng``'s
    state."""
    if size < 16:
        raise ValueError(f"size must be at least 16, got {size}")
    bg = rng.randint(30, 60)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, 8.0, size=(size, size, 3))
    base = Image.fromarray(np.clip(bg + noise, 0, 255).astype(np.uint8), mode="RGB")
    draw = ImageDraw.Draw(base)
    half = size / 2
    for o in scene.objects:
        side = half * rng.uniform(0.6, 0.8)
        slack = (half - side) / 2
        cx = (o.cell % 2) * half + half / 2 + rng.uniform(-slack, slack)
        cy = (o.cell // 2) * half + half / 2 + rng.uniform(-slack, slack)
        colour = tuple(int(min(255, max(0, c + rng.randint(-20, 20)))) for c in SCENE_COLOURS[o.colour])
        r = side / 2
        if o.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        elif o.shape == "square":
            q = r * 0.85  # a square of the circle's area looks the same size
            draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=colour)
        else:  # cross: two bars two fifths of the side wide
            w = side / 5
            draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
            draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)
    return base


# ----------------------------------------------------------------------------------------- grammar
@dataclass(frozen=True)
class Mention:
    """One phrase of a caption: ``count`` objects of ``shape``, of ``colour`` (None: colour not said)."""

    count: int
    colour: str | None
    shape: str

    def text(self) -> str:
        noun = self.shape if self.count == 1 else SHAPES[self.shape]
        words = [COUNT_WORDS.get(self.count, str(self.count))]
        if self.colour is not None:
            words.append(self.colour)
        return " ".join([*words, noun])


def write_caption(mentions: Sequence[Mention]) -> str:
    """Mentions joined as English: "x", "x and y", "x, y and z"."""
    parts = [m.text() for m in mentions]
    if not parts:
        return ""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def true_mentions(scene: Scene, rng: random.Random | None = None) -> list[Mention]:
    """The scene's groups as mentions, in reading order of their first object (shuffled with ``rng``)."""
    order: dict[tuple[str, str], int] = {}
    for o in scene.objects:
        order[(o.colour, o.shape)] = order.get((o.colour, o.shape), 0) + 1
    mentions = [Mention(n, c, s) for (c, s), n in order.items()]
    if rng is not None:
        rng.shuffle(mentions)
    return mentions


def true_caption(scene: Scene, rng: random.Random | None = None) -> str:
    """The scene's description (groups in reading order, or shuffled with ``rng``)."""
    return write_caption(true_mentions(scene, rng))


def negative_mentions(scene: Scene, kind: str, rng: random.Random) -> list[Mention] | None:
    """The true mentions (shuffled) with exactly one slot changed, or None where ``kind`` cannot apply:

    - ``"count"``: one group's count replaced by another of 1-4 (shapes, colours and bindings unchanged);
    - ``"binding"``: the colours of two groups of different colours and shapes swapped, so that neither
      new pair is in the scene (needs two such groups);
    - ``"missing"``: one group left out (needs two groups);
    - ``"extra"``: one object of a (colour, shape) pair absent from the scene added;
    - ``"colour"``: one group's colour replaced by a colour absent from the scene;
    - ``"shape"``: one group's shape replaced by a shape absent from the scene.

    Raises:
        ValueError: for an unknown ``kind``.
    """
    if kind not in NEGATIVE_KINDS:
        raise ValueError(f"unknown negative kind {kind!r}; expected one of {NEGATIVE_KINDS}")
    mentions = true_mentions(scene, rng)
    pairs = {(m.colour, m.shape) for m in mentions}
    k = rng.randrange(len(mentions))
    m = mentions[k]
    if kind == "count":
        mentions[k] = Mention(rng.choice([c for c in COUNT_WORDS if c != m.count]), m.colour, m.shape)
    elif kind == "binding":
        options = [(i, j) for i in range(len(mentions)) for j in range(i + 1, len(mentions))
                   if mentions[i].colour != mentions[j].colour and mentions[i].shape != mentions[j].shape
                   and (mentions[j].colour, mentions[i].shape) not in pairs and (mentions[i].colour, mentions[j].shape) not in pairs]
        if not options:
            return None
        i, j = rng.choice(options)
        a, b = mentions[i], mentions[j]
        mentions[i], mentions[j] = Mention(a.count, b.colour, a.shape), Mention(b.count, a.colour, b.shape)
    elif kind == "missing":
        if len(mentions) < 2:
            return None
        del mentions[k]
    elif kind == "extra":
        absent = [(c, s) for c in SCENE_COLOURS for s in SHAPES if (c, s) not in pairs]
        c, s = rng.choice(absent)
        mentions.insert(rng.randint(0, len(mentions)), Mention(1, c, s))
    elif kind == "colour":
        absent = [c for c in SCENE_COLOURS if c not in scene.colours()]
        if not absent:
            return None
        mentions[k] = Mention(m.count, rng.choice(absent), m.shape)
    else:  # shape
        absent = [s for s in SHAPES if s not in scene.shapes()]
        if not absent:
            return None
        mentions[k] = Mention(m.count, m.colour, rng.choice(absent))
    return mentions


def hard_negative(scene: Scene, kind: str, rng: random.Random) -> str | None:
    """The caption of :func:`negative_mentions` (None where ``kind`` cannot apply to the scene)."""
    mentions = negative_mentions(scene, kind, rng)
    return None if mentions is None else write_caption(mentions)


# ------------------------------------------------------------------------------------------- judge
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ParsedCaption:
    """What :func:`parse_caption` read: the mentions, and the words outside the grammar (``unread``)."""

    mentions: tuple[Mention, ...]
    unread: tuple[str, ...] = ()


def parse_caption(caption: str) -> ParsedCaption:
    """Read a caption into mentions: an optional count word, an optional colour, then a shape word
    (singular or plural). A shape without a count is one object (singular) or two (plural); words outside
    the grammar ("photo", "depicts", "and") are skipped, and all but "and"/"of"/"the"/"photo"/"depicts"
    are listed as ``unread``; a count or colour not followed by a shape is dropped."""
    mentions: list[Mention] = []
    unread: list[str] = []
    count: int | None = None
    colour: str | None = None
    for word in _TOKEN.findall(caption.lower()):
        if word in SHAPES or word in PLURALS:
            shape = PLURALS.get(word, word)
            n = count if count is not None else (2 if word in PLURALS else 1)
            mentions.append(Mention(n, colour, shape))
            count, colour = None, None
        elif word in _READ_COUNTS:
            count, colour = _READ_COUNTS[word], None
        elif word in SCENE_COLOURS:
            colour = word
        elif word not in ("and", "of", "the", "photo", "depicts", "with"):
            unread.append(word)
    return ParsedCaption(tuple(mentions), tuple(unread))


@dataclass(frozen=True)
class Judgement:
    """The ground-truth grade of a caption of a scene.

    Slots (True when right): ``count`` (the number of objects the caption states is the scene's),
    ``shape`` (the set of shapes named is the scene's), ``colour`` (the set of colours named is the
    scene's and every mention names one), ``binding`` (the set of (colour, shape) pairs is the scene's,
    every mention naming a colour), ``exact`` (the pairs with their counts are the scene's).
    Objects: ``mentioned`` (stated), ``present`` (in the scene), ``hallucinated`` (stated but not
    matched by an object), ``omitted`` (in the scene but not matched by a stated one).
    Probes: ``mentions``, ``repeated`` (some (colour, shape) pair named in two mentions),
    ``colour_free`` (some mention names no colour), ``words``, ``unread`` (words outside the grammar).
    """

    count: bool
    shape: bool
    colour: bool
    binding: bool
    exact: bool
    mentioned: int
    present: int
    hallucinated: int
    omitted: int
    mentions: int
    repeated: bool
    colour_free: bool
    words: int
    unread: int = 0
    slots: tuple[str, ...] = field(default=("count", "shape", "colour", "binding", "exact"), repr=False)


def judge(scene: Scene, caption: str) -> Judgement:
    """Grade ``caption`` against ``scene`` (see :class:`Judgement`). Matching: a mention with a colour
    matches objects of its colour and shape, up to its count; then a colour-free mention matches the
    remaining objects of its shape. Objects stated beyond their matches are hallucinated; objects left
    unmatched are omitted. An empty or unreadable caption mentions nothing: every slot wrong, every
    object omitted."""
    parsed = parse_caption(caption)
    ms = parsed.mentions
    truth = scene.groups()
    remaining = Counter(truth)
    hallucinated = 0
    for m in ms:
        if m.colour is not None:
            got = min(m.count, remaining[(m.colour, m.shape)])
            remaining[(m.colour, m.shape)] -= got
            hallucinated += m.count - got
    for m in ms:
        if m.colour is None:
            left = m.count
            for pair in sorted(remaining):
                if pair[1] == m.shape and remaining[pair] > 0 and left > 0:
                    got = min(left, remaining[pair])
                    remaining[pair] -= got
                    left -= got
            hallucinated += left
    stated_pairs: Counter = Counter()
    for m in ms:
        stated_pairs[(m.colour, m.shape)] += m.count
    coloured = bool(ms) and all(m.colour is not None for m in ms)
    pair_names = [(m.colour, m.shape) for m in ms]
    mentioned = sum(m.count for m in ms)
    return Judgement(
        count=bool(ms) and mentioned == len(scene.objects),
        shape=bool(ms) and {m.shape for m in ms} == set(scene.shapes()),
        colour=coloured and {m.colour for m in ms} == set(scene.colours()),
        binding=coloured and set(pair_names) == set(truth),
        exact=coloured and stated_pairs == truth,
        mentioned=mentioned,
        present=len(scene.objects),
        hallucinated=hallucinated,
        omitted=sum(remaining.values()),
        mentions=len(ms),
        repeated=len(set(pair_names)) < len(pair_names),
        colour_free=any(m.colour is None for m in ms),
        words=len(_TOKEN.findall(caption.lower())),
        unread=len(parsed.unread),
    )


def scene_vocabulary() -> tuple[str, ...]:
    """Every word of the grammar: count words, colours, shapes (both numbers) and "and"."""
    return (*COUNT_WORDS.values(), *SCENE_COLOURS, *SHAPES, *PLURALS, "and")


# ----------------------------------------------------------------------------------- caption sampler
#: Default error rates of :func:`sample_caption`, per caption.
SAMPLER_ERRORS: dict[str, float] = {
    "count": 0.25, "binding": 0.15, "missing": 0.25, "extra": 0.3, "colour": 0.15, "shape": 0.15,
    "colour_free": 0.15, "repeat": 0.1, "list_all": 0.1,
}


def sample_caption(scene: Scene, rng: random.Random, errors: dict[str, float] | None = None) -> str:
    """A candidate caption from a noisy captioner of the grammar: the true mentions (shuffled), then each
    error of ``errors`` (default :data:`SAMPLER_ERRORS`) applied with its probability, in turn: the
    one-slot changes of :func:`negative_mentions` (an "extra" adds one to three absent objects), a
    mention's colour dropped (``colour_free``), a mention said twice (``repeat``), and ``list_all``: every
    object of the scene plus two to four absent ones (the "list everything" caption a bag-of-words
    reward likes). Deterministic for ``rng``'s state."""
    errors = SAMPLER_ERRORS if errors is None else errors
    mentions = true_mentions(scene, rng)
    if rng.random() < errors.get("list_all", 0.0):
        absent = [(c, s) for c in SCENE_COLOURS for s in SHAPES if (c, s) not in _pairs(mentions)]
        for c, s in rng.sample(absent, min(len(absent), rng.randint(2, 4))):
            mentions.insert(rng.randint(0, len(mentions)), Mention(1, c, s))
        return write_caption(mentions)
    for kind in ("count", "binding", "missing", "colour", "shape"):
        if rng.random() < errors.get(kind, 0.0):
            changed = _apply(mentions, scene, kind, rng)
            mentions = changed if changed is not None else mentions
    if rng.random() < errors.get("extra", 0.0):
        for _ in range(rng.randint(1, 3)):
            absent = [(c, s) for c in SCENE_COLOURS for s in SHAPES if (c, s) not in _pairs(mentions)]
            c, s = rng.choice(absent)
            mentions.insert(rng.randint(0, len(mentions)), Mention(1, c, s))
    if mentions and rng.random() < errors.get("colour_free", 0.0):
        k = rng.randrange(len(mentions))
        mentions[k] = Mention(mentions[k].count, None, mentions[k].shape)
    if mentions and rng.random() < errors.get("repeat", 0.0):
        mentions.append(rng.choice(mentions))
    return write_caption(mentions)


def _pairs(mentions: Sequence[Mention]) -> set[tuple[str | None, str]]:
    return {(m.colour, m.shape) for m in mentions}


def _apply(mentions: list[Mention], scene: Scene, kind: str, rng: random.Random) -> list[Mention] | None:
    """One slot change of :func:`negative_mentions` applied to an arbitrary mention list."""
    if not mentions:
        return None
    mentions = list(mentions)
    k = rng.randrange(len(mentions))
    m = mentions[k]
    if kind == "count":
        mentions[k] = Mention(rng.choice([c for c in COUNT_WORDS if c != m.count]), m.colour, m.shape)
    elif kind == "missing":
        if len(mentions) < 2:
            return None
        del mentions[k]
    elif kind == "colour":
        absent = [c for c in SCENE_COLOURS if c not in scene.colours()]
        if not absent or m.colour is None:
            return None
        mentions[k] = Mention(m.count, rng.choice(absent), m.shape)
    elif kind == "shape":
        absent = [s for s in SHAPES if s not in scene.shapes()]
        if not absent:
            return None
        mentions[k] = Mention(m.count, m.colour, rng.choice(absent))
    elif kind == "binding":
        options = [(i, j) for i in range(len(mentions)) for j in range(i + 1, len(mentions))
                   if mentions[i].colour != mentions[j].colour and mentions[i].shape != mentions[j].shape
                   and None not in (mentions[i].colour, mentions[j].colour)]
        if not options:
            return None
        i, j = rng.choice(options)
        a, b = mentions[i], mentions[j]
        mentions[i], mentions[j] = Mention(a.count, b.colour, a.shape), Mention(b.count, a.colour, b.shape)
    return mentions


def scene_rows(n: int, seed: int, size: int = 64) -> list[dict]:
    """``n`` scenes with their images: {"scene", "image", "caption"} (the true caption in reading order).
    Deterministic for ``seed``."""
    rng = random.Random(f"scenes-{seed}")
    out = []
    for _ in range(n):
        scene = random_scene(rng)
        out.append({"scene": scene, "image": render_scene(scene, rng, size), "caption": true_caption(scene)})
    return out


def mean_judgement(judgements: Iterable[Judgement]) -> dict[str, float]:
    """Rates over captions: each slot's accuracy, hallucination rate (hallucinated / mentioned objects,
    pooled), omission rate (omitted / present, pooled), the share of captions with any hallucinated
    object, and the probes (repeated share, objects and words per caption, colour-free share)."""
    js = list(judgements)
    if not js:
        raise ValueError("no judgements to average")
    n = len(js)
    mentioned = sum(j.mentioned for j in js)
    return {
        **{slot: sum(getattr(j, slot) for j in js) / n for slot in ("count", "shape", "colour", "binding", "exact")},
        "hallucination": sum(j.hallucinated for j in js) / max(1, mentioned),
        "omission": sum(j.omitted for j in js) / sum(j.present for j in js),
        "any_hallucination": sum(j.hallucinated > 0 for j in js) / n,
        "repeated": sum(j.repeated for j in js) / n,
        "objects": mentioned / n,
        "words": sum(j.words for j in js) / n,
        "colour_free": sum(j.colour_free for j in js) / n,
    }
