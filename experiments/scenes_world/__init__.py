"""The scenes world: a synthetic captioning task with ground truth, for the scenes experiments (not part of
the capreward wheel).

- :mod:`scenes_world.world`: images of 1-4 coloured shapes, the caption grammar, hard negatives and the
  ground-truth judge (pure Python, numpy and PIL);
- :mod:`scenes_world.clips`: tiny CLIPs trained on the world (reward model A, held-out model B, negative
  controls), cached under ``$CAPREWARD_CACHE``;
- :mod:`scenes_world.evaluation`: the rewards built on them, ranking accuracy and best-of-n;
- :mod:`scenes_world.policy`: a tiny LLaVA captioner of the world, its supervised start and held-out grading.

The scripts of ``experiments/`` import it as ``scenes_world`` (their folder is on ``sys.path`` when run as
``python experiments/<script>.py``); the tests put ``experiments/`` on the path (``tests/conftest.py``).
"""
