"""Run under torchrun with 2 processes: batched generation of one seeded tiny GPT at TP1 (x DP2), TP2 and PP2.

For every layout it writes, from global rank 0, the tokens, log-probs and response lengths of greedy and
sampled generation with and without the KV cache, each prompt generated alone, and (TP1 only) the decode loop
of captured graphs (run eagerly), the
log-softmax of a full forward over the generated sequences at the generated tokens and the top-two logit gap
before each uncached greedy token (where a near tie lets the paths part). The test compares.
"""
from __future__ import annotations

import json
import sys

import torch

from ascend_engine.config.train import ModelConfig, ParallelConfig
from ascend_engine.device import select_backend
from ascend_engine.parallel import destroy_parallel, init_parallel

MODEL = ModelConfig(numLayers=2, hiddenSize=64, numAttentionHeads=4, vocabSize=100, paddedVocabSize=128,
                    maxPositionEmbeddings=64)
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19]]
EOS = 3


def run_layout(backend, tp: int, pp: int) -> dict:
    from megatron.core import parallel_state

    from ascend_engine.generate.batched import generate_batch
    from ascend_engine.generate.tokens import Sampling
    from ascend_engine.models.gpt import build_gpt_model

    info = init_parallel(backend, tp, pp, seed=1)
    gpt = build_gpt_model(MODEL, ParallelConfig(tensorModelParallelSize=tp, pipelineModelParallelSize=pp), 64,
                          seed=7)
    gpt.eval()
    from ascend_engine.generate import lean_forward

    # the lean decode step takes TP1 at one stage only, and no model whose modules carry hooks (LoRA adapters)
    hook = gpt.decoder.layers[0].mlp.linear_fc1.register_forward_hook(lambda *_: None)
    out = {"lean step, hooked": lean_forward.fits(gpt)}
    hook.remove()
    out["lean step"] = lean_forward.fits(gpt)

    def gen(prompts, sampling, cache, max_new=10):
        g = generate_batch(gpt, prompts, max_new_tokens=max_new, eos_id=EOS, vocab_size=MODEL.vocabSize,
                           max_length=64, sampling=sampling, generator=torch.Generator().manual_seed(11),
                           use_cache=cache)
        return {"tokens": g.tokens.tolist(), "log_probs": g.log_probs.tolist(),
                "response_lengths": g.response_lengths, "responses": g.responses()}

    for name, sampling in (("greedy", Sampling()), ("sampled", Sampling(top_p=0.95, temperature=1.3))):
        for cache in (True, False):
            out[f"{name}/{'cache' if cache else 'nocache'}"] = gen(PROMPTS, sampling, cache)
    out["greedy/alone"] = [gen([p], Sampling(), True)["responses"][0] for p in PROMPTS]
    # an end-of-sequence token the model does emit: the third token of the second greedy response
    eos = out["greedy/cache"]["responses"][1][2]
    g = generate_batch(gpt, PROMPTS, max_new_tokens=10, eos_id=eos, vocab_size=MODEL.vocabSize, max_length=64,
                       use_cache=True)
    out["greedy/eos"] = {"eos": eos, "responses": g.responses(), "tokens": g.tokens.tolist()}

    def slotted(sampling, slots):  # rows end at different steps (the EOS above): with 2 slots, others take over
        ended = []
        g = generate_batch(gpt, PROMPTS, max_new_tokens=10, eos_id=eos, vocab_size=MODEL.vocabSize, max_length=64,
                           sampling=sampling, generator=torch.Generator().manual_seed(11), slots=slots,
                           done=ended.append)
        return {"responses": g.responses(), "ended": ended,
                "log_probs": [g.log_probs[i, p:p + n].tolist()
                              for i, (p, n) in enumerate(zip(g.prompt_lengths, g.response_lengths))]}

    for name, sampling in (("greedy", Sampling()), ("sampled", Sampling(top_p=0.95, temperature=1.3))):
        for slots in (None, 2):
            out[f"slots {slots}/{name}"] = slotted(sampling, slots)
    if tp == 1 and pp == 1:
        sampled = out["sampled/cache"]
        tokens = torch.tensor(sampled["tokens"])
        with torch.no_grad():
            logits = gpt(tokens, torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens), None)
        log_softmax = torch.log_softmax(logits[..., :MODEL.vocabSize].float(), dim=-1)
        # log p(tokens[:, t]) is read from the logits at t - 1
        full = torch.zeros_like(tokens, dtype=torch.float32)
        full[:, 1:] = log_softmax[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
        out["full_forward_log_probs"] = full.tolist()
        # the reference's (uncached greedy) top-two logit gap before each token: where it is under the
        # near-tie threshold, another layout's or path's rounding may pick the other token (tolerance parity)
        greedy = torch.tensor(out["greedy/nocache"]["tokens"])
        with torch.no_grad():
            logits = gpt(greedy, torch.arange(greedy.shape[1]).unsqueeze(0).expand_as(greedy), None)
        top2 = logits[..., :MODEL.vocabSize].float().topk(2, dim=-1).values
        out["logit_scale"] = logits[..., :MODEL.vocabSize].abs().max().item()  # what rounding is relative to
        gaps = torch.full(greedy.shape, float("inf"))
        gaps[:, 1:] = top2[:, :-1, 0] - top2[:, :-1, 1]
        out["greedy_gaps"] = gaps.tolist()
        # the decode loop a GPU takes with captured graphs (``ragged._replayed``: power-of-two slots, attention over
        # the whole cache), each "graph" run eagerly here: the arithmetic and the slots, not the capture
        from unittest import mock

        import ascend_engine.device

        with mock.patch.object(ascend_engine.device, "step_graphs", lambda device: lambda fn, *inputs: fn(*inputs)):
            for name, sampling in (("greedy", Sampling()), ("sampled", Sampling(top_p=0.95, temperature=1.3))):
                out[f"graph path/{name}"] = gen(PROMPTS, sampling, True)
            out["graph path/eos"] = generate_batch(gpt, PROMPTS, max_new_tokens=10, eos_id=eos,
                                                   vocab_size=MODEL.vocabSize, max_length=64).responses()
            out["graph path/slots 2"] = slotted(Sampling(), 2)["responses"]
        # learned absolute positions: each token's position id must follow it into the cache
        learned = build_gpt_model(MODEL.model_copy(update={"positionEmbeddingType": "learned_absolute"}),
                                  ParallelConfig(), 64, seed=7).eval()
        for cache in (True, False):
            g = generate_batch(learned, PROMPTS, max_new_tokens=10, eos_id=None, vocab_size=MODEL.vocabSize,
                               max_length=64, use_cache=cache)
            out[f"learned/{'cache' if cache else 'nocache'}"] = g.tokens.tolist()
    parallel_state.destroy_model_parallel()
    return out if info.rank == 0 else {}


def main() -> None:
    backend = select_backend("cpu")
    backend.apply()
    results = {}
    try:
        for tp, pp in ((1, 1), (2, 1), (1, 2)):
            results[f"tp{tp}pp{pp}"] = run_layout(backend, tp, pp)
    finally:
        destroy_parallel()
    if results["tp1pp1"]:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(main)
