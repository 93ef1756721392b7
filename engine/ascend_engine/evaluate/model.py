"""Forward passes for evaluation on any TP/PP layout: batched log-likelihoods and greedy continuation.

Every method is collective over the torchrun world. Logits exist on the last pipeline stage, split over the
vocabulary by TP; they are gathered there, reduced to the few numbers asked for, and those numbers are shared
with every rank (a sum over ranks where only the last stage's first TP rank contributes).
"""
from __future__ import annotations

import torch


class InferenceModel:
    def __init__(self, gpt, vocab_size: int, max_len: int, info, device):
        self.gpt, self.vocab_size, self.max_len, self.info, self.device = gpt, vocab_size, max_len, info, device

    @property
    def _reporter(self) -> bool:
        return self.info.is_last_stage and self.info.tp_rank == 0 and self.info.dp_rank == 0

    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor | None:
        """Log-softmax over the real vocabulary, [batch, seq, vocab] fp32, on the last stage (None elsewhere).
        Rows are right-padded; causal attention keeps padding from touching the real positions."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        width = max(len(r) for r in rows)
        if width > self.max_len:
            raise ValueError(f"a prompt of {width} tokens is longer than the model's {self.max_len} positions")
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        ids = ids.to(self.device)
        device = self.device

        def forward_step(data_iterator, module):
            tokens = next(data_iterator)
            positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
            logits = module(tokens, positions, None)
            return logits, lambda out: (out.new_zeros(()), {"logits": out.detach()})

        with torch.no_grad():
            out = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([ids]), model=[self.gpt], num_microbatches=1,
                seq_length=width, micro_batch_size=len(rows), forward_only=True)
            if not self.info.is_last_stage:
                return None
            logits = gather_from_tensor_model_parallel_region(out[0]["logits"])[..., : self.vocab_size]
            return torch.log_softmax(logits.float(), dim=-1)

    def _share(self, values: torch.Tensor) -> torch.Tensor:
        """The reporter's ``values`` on every rank."""
        if not self._reporter:
            values = torch.zeros_like(values)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            values = values.to(self.device)
            torch.distributed.all_reduce(values)
        return values.cpu()

    def continuation_logprobs(self, rows: list[list[int]], starts: list[int]) -> list[float]:
        """For each row, the summed log-probability of its tokens from ``starts[i]`` on, given those before."""
        result = torch.zeros(len(rows), dtype=torch.float64)
        logprobs = self._logprobs(rows)
        if logprobs is not None:
            for i, (row, start) in enumerate(zip(rows, starts)):
                targets = torch.tensor(row[start:], device=logprobs.device)
                picked = logprobs[i, start - 1: len(row) - 1].gather(-1, targets.unsqueeze(-1))
                result[i] = picked.double().sum().cpu()
        return self._share(result).tolist()

    def next_token_logprobs(self, rows: list[list[int]], candidates: list[list[int]]) -> list[list[float]]:
        """For each row, the log-probability of each candidate token right after it (one pass per batch)."""
        width = max(len(c) for c in candidates)
        result = torch.full((len(rows), width), float("-inf"), dtype=torch.float64)
        logprobs = self._logprobs(rows)
        if logprobs is not None:
            for i, (row, cands) in enumerate(zip(rows, candidates)):
                result[i, : len(cands)] = logprobs[i, len(row) - 1, cands].double().cpu()
        shared = self._share(result)
        return [shared[i, : len(c)].tolist() for i, c in enumerate(candidates)]

    def greedy(self, prompt: list[int], max_new: int, stop_ids: set[int], done=None) -> list[int]:
        """Greedy continuation of ``prompt`` (new tokens only); stops at a ``stop_ids`` token, at ``max_new``,
        at the model's length, or when ``done(new_tokens)`` says so (the same answer on every rank)."""
        tokens = list(prompt)
        new: list[int] = []
        while len(new) < max_new and len(tokens) < self.max_len:
            chosen = torch.zeros(1, dtype=torch.float64)
            logprobs = self._logprobs([tokens])
            if logprobs is not None:
                chosen[0] = float(logprobs[0, -1].argmax())
            token = int(self._share(chosen)[0])
            if token in stop_ids:
                break
            tokens.append(token)
            new.append(token)
            if done is not None and done(new):
                break
        return new
