"""Checkpoint layouts (engine/model.cc Load/Export): a Gemma3ForConditionalGeneration checkpoint
trains its language model and writes the vision tower and projector back unchanged, in
transformers 5's save_pretrained layout ("language_model.model.*") and in the module layout
("model.language_model.*"); config.json is copied byte for byte; the export loads and generates
in transformers.

Logits are compared with transformers' text-only forward of the same wrapper at
test_engine_parity.py's fp32 tolerances (the same arithmetic in another order)."""
import pytest
import torch
import transformers as T
from safetensors import safe_open
from safetensors.torch import save_file

from engine_testlib import make_batch, run_check, write_inputs

LOGIT_TOL = dict(atol=2e-5, rtol=1e-4)
TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=5, query_pre_attn_scalar=16,
            max_position_embeddings=64, layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=2.0)  # Gemma3ForConditionalGeneration does not apply it
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


def multimodal(tmp_path):
    torch.manual_seed(3)
    config = T.Gemma3Config(text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=95,
                            boi_token_index=93, eoi_token_index=94)
    model = T.Gemma3ForConditionalGeneration(config)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 and "language_model" in n:
                p.normal_(0, 0.3)  # (1 + w) norms: make them matter
    d = tmp_path / "gemma3"
    model.save_pretrained(d)
    return model, d


def tensors(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def step_and_export(tmp_path, d, model):
    ids, labels = make_batch(96, batch=2, seq=10, seed=7)
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    out = run_check(d, tmp_path / "in.safetensors", tmp_path / "out.safetensors", "--sgd-lr", "0.5",
                    "--export", tmp_path / "export")
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels)
    logits, loss = ref.logits, ref.loss
    torch.testing.assert_close(out["logits"], logits, **LOGIT_TOL)
    torch.testing.assert_close(out["loss"], loss, **LOGIT_TOL)
    return out


@pytest.mark.parametrize("layout", ["save_pretrained", "modules"])
def test_gemma3_multimodal_trains_its_text_half_and_passes_the_vision_tower_through(tmp_path, layout):
    model, d = multimodal(tmp_path)
    before = tensors(d / "model.safetensors")
    assert any(k.startswith("language_model.model.") for k in before), sorted(before)[:3]
    if layout == "modules":  # transformers 5's module names, as some conversions store them
        def module_name(k):
            if k.startswith("language_model.model."):
                return "model.language_model." + k[len("language_model.model."):]
            return "model." + k  # vision_tower.*, multi_modal_projector.*
        before = {module_name(k): v for k, v in before.items()}
        (d / "model.safetensors").unlink()
        save_file(before, str(d / "model.safetensors"), metadata={"format": "pt"})
    step_and_export(tmp_path, d, model)

    after = tensors(tmp_path / "export" / "model.safetensors")
    assert {k: (list(v.shape), v.dtype) for k, v in after.items()} == \
        {k: (list(v.shape), v.dtype) for k, v in before.items()}
    vision = [k for k in before if "vision_tower." in k or "multi_modal_projector." in k]
    assert vision
    for k in vision:
        assert torch.equal(after[k], before[k]), k
    changed = [k for k in before if k not in vision and not torch.equal(after[k], before[k])]
    assert len(changed) == len(before) - len(vision), "every language-model tensor took the SGD step"
    assert (tmp_path / "export" / "config.json").read_bytes() == (d / "config.json").read_bytes()

    # transformers loads the export (no key missing or left over) and generates from it.
    reloaded, info = T.Gemma3ForConditionalGeneration.from_pretrained(tmp_path / "export",
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    out = reloaded.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
