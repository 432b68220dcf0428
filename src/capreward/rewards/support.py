"""Moved to :mod:`capreward.metrics.token_support` (the pure math of which caption tokens are content and
which are unsupported); this module keeps the old import path working."""

from ..metrics.token_support import *  # noqa: F401,F403
from ..metrics.token_support import (GENERIC_WORDS, SPECIAL_TOKENS, STOP_WORDS, SupportReport, content_mask,  # noqa: F401
                                     conformal_threshold, support_report)
