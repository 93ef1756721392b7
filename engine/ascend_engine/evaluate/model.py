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
        self.truncated = 0  # rows cut from the left to the model's positions (as lm-evaluation-harness does)

    def _fit(self, row: list[int]) -> tuple[list[int], int]:
        """The row's last ``max_len`` tokens and how many were cut from its start."""
        cut = max(0, len(row) - self.max_len)
        if cut:
            self.truncated += 1
        return row[cut:], cut

    @property
    def _reporter(self) -> bool:
        return self.info.is_last_stage and self.info.tp_rank == 0 and self.info.dp_rank == 0

    def _logprobs(self, rows: list[list[int]], positions: list[list[int]]) -> list[torch.Tensor] | None:
        """Per row, log-softmax over the real vocabulary at the given positions ([len(positions[i]), vocab], fp32),
        on the last stage (None elsewhere). Only those positions are gathered over TP and normalised, so memory
        grows with the positions asked for, not with batch x length x vocabulary. Rows are right-padded; causal
        attention keeps padding from touching the real positions."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        width = max(len(r) for r in rows)
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
            logits = out[0]["logits"]  # [batch, seq, vocab / TP]
            row_index = torch.tensor([i for i, p in enumerate(positions) for _ in p], device=logits.device)
            pos_index = torch.tensor([q for p in positions for q in p], device=logits.device)
            picked = gather_from_tensor_model_parallel_region(logits[row_index, pos_index].contiguous())
            normalised = torch.log_softmax(picked[:, : self.vocab_size].float(), dim=-1)
            return list(normalised.split([len(p) for p in positions]))

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
        fitted = [self._fit(row) for row in rows]
        rows = [row for row, _ in fitted]
        starts = [max(1, start - cut) for start, (_, cut) in zip(starts, fitted)]
        logprobs = self._logprobs(rows, [list(range(start - 1, len(row) - 1)) for row, start in zip(rows, starts)])
        if logprobs is not None:
            for i, (row, start) in enumerate(zip(rows, starts)):
                targets = torch.tensor(row[start:], device=logprobs[i].device)
                result[i] = logprobs[i].gather(-1, targets.unsqueeze(-1)).double().sum().cpu()
        return self._share(result).tolist()

    def next_token_logprobs(self, rows: list[list[int]], candidates: list[list[int]]) -> list[list[float]]:
        """For each row, the log-probability of each candidate token right after it (one pass per batch)."""
        width = max(len(c) for c in candidates)
        result = torch.full((len(rows), width), float("-inf"), dtype=torch.float64)
        rows = [self._fit(row)[0] for row in rows]
        logprobs = self._logprobs(rows, [[len(row) - 1] for row in rows])
        if logprobs is not None:
            for i, cands in enumerate(candidates):
                result[i, : len(cands)] = logprobs[i][0, cands].double().cpu()
        shared = self._share(result)
        return [shared[i, : len(c)].tolist() for i, c in enumerate(candidates)]

    def greedy(self, prompt: list[int], max_new: int, stop_ids: set[int], done=None) -> list[int]:
        """Greedy continuation of ``prompt`` (new tokens only); stops at a ``stop_ids`` token, at ``max_new``, or
        when ``done(new_tokens)`` says so (the same answer on every rank). Past the model's positions it sees the
        last ``max_len`` tokens."""
        tokens = list(prompt)
        new: list[int] = []
        if len(tokens) > self.max_len:
            self.truncated += 1
        while len(new) < max_new:
            chosen = torch.zeros(1, dtype=torch.float64)
            window = tokens[-self.max_len:]
            logprobs = self._logprobs([window], [[len(window) - 1]])
            if logprobs is not None:
                chosen[0] = float(logprobs[0][0].argmax())
            token = int(self._share(chosen)[0])
            if token in stop_ids:
                break
            tokens.append(token)
            new.append(token)
            if done is not None and done(new):
                break
        return new
