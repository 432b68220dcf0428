"""The scenes captioner of the RL experiment (experiments/scenes_world/policy.py) and the policy arms it
shares with the colour experiment (experiments/policy_arms.py): the CLIP image tower carried into the
LLaVA gives the CLIP's own features, the wrong-image control scores each caption against another scene,
and rejection-sampling fine-tuning keeps the caption the reward ranks first."""

from __future__ import annotations

import torch

from fixtures_llava import one_torch_thread  # noqa: F401 (autouse: one torch thread)


def test_the_clip_image_tower_carried_into_the_llava_gives_the_clips_features(tmp_path):
    import open_clip
    from scenes_world import policy
    from scenes_world.clips import SCENE_CLIP_CONFIG, scene_stream

    from capreward.testing.tiny_clip import build_tiny_clip, openai_state_dict

    clip = build_tiny_clip(3, SCENE_CLIP_CONFIG).eval()
    torch.save(openai_state_dict(clip), tmp_path / "clip.pt")
    model, processor = policy.build_policy(0, str(tmp_path / "clip.pt"))
    images = [r["image"] for r in scene_stream("held-out", 2)]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    reference = torch.stack([open_clip.image_transform(32, is_train=False)(im) for im in images])
    assert torch.allclose(pixels, reference, atol=1e-5)  # the LLaVA sees what the CLIP sees
    v = clip.visual
    with torch.no_grad():  # the CLIP's last-layer tokens, computed by open_clip's own modules
        x = v.conv1(reference).flatten(2).transpose(1, 2)
        x = torch.cat([v.class_embedding.expand(len(images), 1, -1), x], dim=1) + v.positional_embedding
        want = v.transformer(v.ln_pre(x))
        got = model.model.vision_tower(pixels, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(got, want, atol=1e-4)
    assert model.config.vision_feature_layer == -1
    # a policy built without a CLIP has its own seeded tower
    other, _ = policy.build_policy(0)
    assert not torch.equal(other.model.vision_tower.embeddings.patch_embedding.weight,
                           model.model.vision_tower.embeddings.patch_embedding.weight)


def test_wrong_image_scores_each_caption_against_the_next_scene_of_the_batch():
    from scenes_world.policy import WrongImage

    seen = {}

    def reward(prompts=None, completions=None, completion_ids=None, image=None, **kwargs):
        seen.update(image=image, kwargs=kwargs)
        return [float(len(c)) for c in completions]

    reward.components = (("x", None, 1.0),)
    wrong = WrongImage(reward)
    # two completions per scene, scenes 7, 3, 9 in batch order
    ids = [7, 7, 3, 3, 9, 9]
    images = ["im7", "im7", "im3", "im3", "im9", "im9"]
    assert wrong(prompts=["p"] * 6, completions=["a", "bb", "c", "dd", "e", "ff"], image=images, scene_id=ids) == [1, 2, 1, 2, 1, 2]
    assert seen["image"] == ["im3", "im3", "im9", "im9", "im7", "im7"] and seen["kwargs"]["scene_id"] == ids
    assert all(a != b for a, b in zip(seen["image"], images))  # never the captioned scene's own image
    assert wrong.components == reward.components and wrong.__name__ == "reward"


def test_best_of_n_distillation_keeps_the_top_caption_and_steps_on_it(monkeypatch):
    import policy_arms

    from capreward.testing.colour_task import PROMPT, WORDS, colour_rows
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=0))
    rows = colour_rows(4, 0)
    stepped = []
    real_step = policy_arms.Supervisor.step

    def step(self, images, captions):
        stepped.append(list(captions))
        return real_step(self, images, captions)

    monkeypatch.setattr(policy_arms.Supervisor, "step", step)
    scored = []

    def reward(prompts=None, completions=None, image=None, colour=None, **kwargs):
        scored.append(list(completions))
        assert len(image) == len(completions) == len(colour)
        return [None if i % 4 == 3 else float(len(c)) for i, c in enumerate(completions)]  # longest wins, None last

    before = {k: v.clone() for k, v in model.state_dict().items()}
    log = policy_arms.best_of_n_distillation(model, processor, PROMPT, rows, reward, steps=2, seed=0, k=4,
                                             images_per_step=3, max_new_tokens=4, columns=("colour",))
    assert len(scored) == len(stepped) == 2 and all(len(s) == 12 for s in scored)
    for flat, kept in zip(scored, stepped):
        # per image the longest of its first three samples (the fourth is unscored), first on ties
        want = [max(flat[i * 4:i * 4 + 3], key=len) for i in range(3)]
        assert kept == want
    assert len(log["reward"]) == len(log["kept"]) == len(log["loss"]) == 2
    assert all(k >= r for k, r in zip(log["kept"], log["reward"]))
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())  # it trained


def test_best_of_n_distillation_never_keeps_an_unscored_caption(monkeypatch):
    """An image whose captions are all unscored is left out of its step; a step with none scored is skipped."""
    import math

    import policy_arms

    from capreward.testing.colour_task import PROMPT, WORDS, colour_rows
    from capreward.testing import TinyLlavaSpec, build_tiny_llava

    model, processor = build_tiny_llava(TinyLlavaSpec(words=WORDS, seed=0))
    stepped = []
    monkeypatch.setattr(policy_arms.Supervisor, "step", lambda self, images, captions: stepped.append(len(captions)) or 0.5)
    calls = []

    def reward(prompts=None, completions=None, image=None, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # first step: the second image's four captions unscored
            return [None if 4 <= i < 8 else 1.0 for i in range(len(completions))]
        return [None] * len(completions)  # second step: nothing scored

    log = policy_arms.best_of_n_distillation(model, processor, PROMPT, colour_rows(4, 0), reward, steps=2, seed=0, k=4,
                                             images_per_step=3, max_new_tokens=4)
    assert stepped == [2]  # one step, on the two images with a scored caption
    assert log["kept_images"] == [2, 0] and log["loss"][0] == 0.5 and math.isnan(log["loss"][1])
    assert log["reward"][0] == 1.0 and math.isnan(log["reward"][1])
