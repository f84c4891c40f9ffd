"""Data parallelism with a mixture of experts is exact: two CPU ranks (--gpus=2, Gloo), each on its
half of every global micro-batch, equal one rank on the whole batch (test_data_parallel.py's
bounds: per-step loss within 1e-5, final weights within 2e-5, fp32), for a tiny Qwen3-MoE with its
experts per expert (as the Hub ships them) and packed 3-D (transformers 5's modules).

Two experts of layer 0 are steered by their router (below):
  * expert 0 receives no token in any step (the single-rank tests' dead expert);
  * expert 1 receives only the tokens of one rare id, which a single record of the data holds: in
    the step that draws that record, the rank holding its row routes tokens to expert 1 and the
    other rank routes none. The first emits that expert's gradient, the second zeros (what
    transformers' packed parameter gets, and what the engine emits for a per-expert tensor too);
    their sum is the whole batch's gradient, and in the other steps that expert's rows get a zero
    gradient on both ranks and AdamW decays them, as on one rank (test_moe.py checks one rank
    against transformers).
The load-balancing loss (output_router_logits) is exact too: it is a product of whole-micro-batch
router statistics (per expert, the top-k assignments and the summed probabilities, over every row
of every sparse layer), so each rank sums its rows' and the group all-reduces them between the
forward and the head; every rank then holds the global micro-batch's loss and its gradient per
row (transformers under DDP instead averages each rank's loss over its own rows: measured on this
model with coefficient 0.05, step 1's loss 2.1e-4 apart). With gradient accumulation the engine,
like transformers' Trainer, adds router_aux_loss_coef x the loss of each micro-batch (forward
call) over that micro-batch's rows, summed over the step's micro-batches; with ranks, a
micro-batch's rows are the union of the ranks' halves of it, so the sum is the one rank's."""

import json
import random

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pipeline_testlib import VOCAB, build_tokenizer, read_stats, run_train
from test_data_parallel import args, assert_close_runs

RARE = VOCAB - 1  # the one token id expert 1 of layer 0 is routed
DEAD, STEERED = 0, 1


def build_moe_model(out, *, packed: bool, aux: float):
    cfg = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                      norm_topk_prob=True, output_router_logits=aux > 0,
                                      router_aux_loss_coef=aux, max_position_embeddings=256,
                                      tie_word_embeddings=False, eos_token_id=0, bos_token_id=0,
                                      attention_dropout=0.0)
    torch.manual_seed(11)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        emb, gate = model.model.embed_tokens.weight, model.model.layers[0].mlp.gate.weight
        gate.mul_(5)  # top-k margins far above the two runs' rounding differences
        # Column 0: 0.3 for every token; column 1: 3.0 for RARE only. o_proj writes neither, so
        # after the norm column 0 dominates every token but RARE, where column 1 does.
        emb[:, 0], emb[:, 1] = 0.3, 0.0
        emb[RARE, 1] = 3.0
        model.model.layers[0].self_attn.o_proj.weight[:2, :] = 0
        gate[:, :2] = 0
        gate[DEAD, 0] = gate[STEERED, 0] = -2.0
        gate[STEERED, 1] = 2.0
    model.save_pretrained(out, safe_serialization=True)
    if packed:
        state = pack_experts(load_file(str(out / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    build_tokenizer(out / "tokenizer.json")
    return out


def pack_experts(state):
    """Per-expert mlp.experts.<e>.{gate,up,down}_proj.weight -> transformers 5's packed
    mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and mlp.experts.down_proj [E, H, I]."""
    out, experts = {}, {}
    for k, v in state.items():
        head, sep, tail = k.partition(".mlp.experts.")
        if not sep:
            out[k] = v
            continue
        e, part = tail.split(".")[:2]
        experts.setdefault(head, {}).setdefault(int(e), {})[part] = v
    for head, by_e in experts.items():
        es = [by_e[e] for e in sorted(by_e)]
        out[head + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in es])
        out[head + ".mlp.experts.down_proj"] = torch.stack([e["down_proj"] for e in es])
    return out


def write_data(path, n=48):
    """Token ids below RARE, except record 5, which holds RARE at four places."""
    rng = random.Random(3)
    with open(path, "w") as f:
        for i in range(n):
            ids = [rng.randrange(2, RARE) for _ in range(rng.randint(8, 30))]
            if i == 5:
                for p in (1, 3, 4, 6):
                    ids[p] = RARE
            f.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    return path


def rare_rows(batches):
    """(step, micro-batch, rows holding RARE, rows) of every micro-batch with a RARE token."""
    out = []
    for s, step in enumerate(batches, 1):
        for m, mb in enumerate(step):
            ids = torch.tensor(mb["input_ids"]).view(mb["batch"], mb["seq"])
            rows = [r for r in range(ids.shape[0]) if (ids[r] == RARE).any()]
            if rows:
                out.append((s, m, rows, ids.shape[0]))
    return out


def assert_routing(model_dir, mb, step):
    """transformers' router of layer 0 on that micro-batch (at the initial weights when it is step
    1): expert 1 in the top-k of exactly the RARE tokens, expert 0 of none."""
    assert step == 1, "the rare record's step is not the first: the weights have moved"
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor(mb["input_ids"]).view(mb["batch"], mb["seq"])
    pos = torch.tensor(mb["position_ids"]).view(mb["batch"], mb["seq"])
    with torch.no_grad():
        logits = ref(input_ids=ids, position_ids=pos, output_router_logits=True).router_logits[0]
    top = logits.topk(ref.config.num_experts_per_tok, -1).indices.view(*ids.shape, -1)
    assert torch.equal((top == STEERED).any(-1), ids == RARE)
    assert not (top == DEAD).any()


@pytest.mark.parametrize("packed", [False, True], ids=["per_expert", "packed"])
def test_moe_two_cpu_ranks_equal_one_rank_on_the_whole_batch(binary_dir, tmp_path, packed):
    model = build_moe_model(tmp_path / "model", packed=packed, aux=0.0)
    data = write_data(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4, extra=[f"--dump-batches={one}/batches.json"]))
    r = run_train(binary_dir, args(model, data, two, batch=2, extra=["--gpus=2"]))
    assert "data parallel: rank 0 of 2 (gloo" in r.stderr
    # The rare record sits in one row of one step's global micro-batch: one rank's half.
    seen = rare_rows(json.loads((one / "batches.json").read_text()))
    assert len(seen) == 1 and len(seen[0][2]) == 1 and seen[0][3] == 4, seen
    assert_routing(model, json.loads((one / "batches.json").read_text())[seen[0][0] - 1][seen[0][1]], seen[0][0])
    assert_close_runs(one, two)
    # Expert 1 trained in that step only; expert 0 never: both decayed by AdamW (they moved).
    w0, w2 = load_file(model / "model.safetensors"), load_file(two / "model.safetensors")
    for name, t in w2.items():
        if ".layers.0.mlp.experts." in name:
            moved = (t - w0[name]).abs()
            if packed:
                assert moved[DEAD].max() > 0 and moved[STEERED].max() > 0, name
            elif f".experts.{DEAD}." in name or f".experts.{STEERED}." in name:
                assert moved.max() > 0, name


def transformers_aux(model_dir, micro_batches):
    """transformers' router_aux_loss_coef x load_balancing_loss_func per micro-batch (float64, its
    eager experts loop; no attention mask, as the engine), and the same over each half of its rows
    averaged (what two ranks would each compute over their own rows)."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64,
                                                            attn_implementation="eager",
                                                            experts_implementation="eager")
    coef = ref.config.router_aux_loss_coef
    whole, halves = [], []
    with torch.no_grad():
        for mb in micro_batches:
            ids = torch.tensor(mb["input_ids"]).view(mb["batch"], mb["seq"])
            pos = torch.tensor(mb["position_ids"]).view(mb["batch"], mb["seq"])

            def aux(r):
                return coef * ref(input_ids=ids[r], position_ids=pos[r], output_router_logits=True).aux_loss.item()

            h = mb["batch"] // 2
            whole.append(aux(slice(None)))
            halves.append((aux(slice(0, h)) + aux(slice(h, None))) / 2)
    return whole, halves


@pytest.mark.parametrize("accum", [1, 2])
def test_moe_load_balancing_loss_with_two_ranks_equals_one_rank(binary_dir, tmp_path, accum):
    model = build_moe_model(tmp_path / "model", packed=False, aux=0.05)
    data = write_data(tmp_path / "data.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(binary_dir, args(model, data, one, batch=4, accum=accum,
                               extra=[f"--dump-batches={one}/batches.json"]))
    r = run_train(binary_dir, args(model, data, two, batch=2, accum=accum, extra=["--gpus=2"]))
    assert "data parallel: rank 0 of 2 (gloo" in r.stderr
    assert_close_runs(one, two)  # losses (the aux loss included) and final weights
    s1, s2 = read_stats(one / "stats.jsonl"), read_stats(two / "stats.jsonl")
    for x, y in zip(s1, s2):  # part of the loss: within its bound, and not zero
        assert x["aux_loss"] > 0 and abs(x["aux_loss"] - y["aux_loss"]) <= 1e-5, (x["step"], x["aux_loss"], y["aux_loss"])
    # Step 1 (the checkpoint's weights) against transformers on the whole global micro-batches,
    # one aux loss per micro-batch (forward call), summed over the step's. The bound is the per-step
    # loss bound above (1e-5; the aux loss is part of the loss), here against float64.
    step1 = json.loads((one / "batches.json").read_text())[0]
    assert len(step1) == accum
    whole, halves = transformers_aux(model, step1)
    for ours in (s1[0]["aux_loss"], s2[0]["aux_loss"]):
        assert abs(ours - sum(whole)) <= 1e-5, (ours, whole)
    # Each rank's aux loss over its own rows (transformers under DDP) is not within it: this test
    # tells the two apart.
    assert max(abs(h - w) for h, w in zip(halves, whole)) > 10 * 1e-5, (halves, whole)
