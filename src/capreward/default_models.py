"""The models capreward loads when none is named, by name (importing this module imports no model code,
so the command line shows them in its help before torch is imported)."""

#: The CLIP of EMScore, CLIP-S, PAC-S and the hallucination penalty (an open_clip ``name/tag``).
DEFAULT_CLIP = "ViT-B-32/openai"
#: The local LLaVA judge of FLEUR, VisCE² and G-VEval (a hub name).
DEFAULT_LLAVA = "llava-hf/llava-1.5-13b-hf"
