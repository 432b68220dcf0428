"""GRPO fine-tuning of a VLM captioner with caption-quality rewards: the recipe lives in the package,
:mod:`capreward.recipes.grpo_captioner` (its docstring has the options and examples); this script runs it.

    python recipes/grpo_captioner.py --tiny --steps 4 --out runs/grpo-tiny
    python -m capreward.recipes.grpo_captioner --tiny --steps 4 --out runs/grpo-tiny    # the same

Needs the ``recipes`` extra (``pip install 'capreward[recipes]'``).
"""

import sys

from capreward.recipes.grpo_captioner import main

if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
