"""Training recipes shipped with the package (the ``recipes`` extra: ``pip install 'capreward[recipes]'``).

- :mod:`capreward.recipes.grpo_captioner`: GRPO fine-tuning of a VLM captioner with capreward rewards
  (TRL ``GRPOTrainer``, LoRA); ``python -m capreward.recipes.grpo_captioner --tiny --steps 4``. The
  GRPO part of ``capreward demo`` runs through it.
"""
