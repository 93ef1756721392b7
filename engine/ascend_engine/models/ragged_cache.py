"""A static KV cache whose rows stand at positions of their own (``CachedRotarySelfAttention`` reads it).

Megatron-core's ``StaticInferenceContext`` keeps one ``sequence_len_offset`` for the whole batch, so prompts of
different lengths must either be padded or walked through one position at a time until the longest is encoded.
Here every row carries its own positions: each prompt is encoded at its own length (no padding, no tail walked
token by token), and each decode step writes every row's new key at that row's next position, attending to the
cache up to the longest row under a mask that hides the positions a row has not reached. The buffers are
allocated once, zeroed (a masked position must hold a finite number: it is multiplied by a zero weight), and
written in place.
"""
from __future__ import annotations

import torch
from megatron.core.inference.contexts import StaticInferenceContext


class RaggedKVCache(StaticInferenceContext):
    def __init__(self, max_batch_size: int, max_sequence_length: int):
        super().__init__(max_batch_size, max_sequence_length)
        self.rows = self.positions = None
        self.kv_length = self.past = 0

    def prefill(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """The next forward encodes prompts of ``length`` tokens from position 0 into the cache slots ``rows``.
        Returns the causal mask [1, 1, length, length] for a forward that takes one (``LeanForward``)."""
        self.enable_prefill_mode()
        self.rows = rows
        self.positions = torch.arange(length, device=rows.device).unsqueeze(0).expand(len(rows), length)
        self.kv_length, self.past = length, 0
        return self.causal_mask(0, length, rows.device)

    def extend(self, rows: int, start: int, length: int, device) -> torch.Tensor:
        """The next forward feeds ``length`` tokens to each of slots 0..rows-1 at positions start.., on top of the
        ``start`` positions those slots hold already (a shared prompt prefix): causal attention over all
        ``start + length`` keys. Right-padded rows are fine: a real token sees only the real ones before it.
        Returns that mask, [1, 1, length, start + length], for a forward that takes one (``LeanForward``)."""
        self.enable_prefill_mode()
        self.rows = torch.arange(rows, device=device)
        self.positions = torch.arange(start, start + length, device=self.rows.device).unsqueeze(0).expand(
            rows, length)
        self.kv_length, self.past = start + length, start
        return self.causal_mask(start, length, device)

    @staticmethod
    def causal_mask(start: int, length: int, device) -> torch.Tensor:
        """[1, 1, length, start + length], True where a key lies after the query (queries at start..)."""
        keys = torch.arange(start + length, device=device)
        queries = torch.arange(start, start + length, device=device)
        return (keys.unsqueeze(0) > queries.unsqueeze(1)).view(1, 1, length, start + length)

    def decode(self, positions: torch.Tensor, kv_length: int | None = None) -> torch.Tensor:
        """The next forward feeds one token per row of slots 0..n-1, row i at ``positions[i]`` (``kv_length``:
        their maximum + 1, if the caller knows it without reading the device). Returns the attention mask to
        pass to the model: [n, 1, 1, keys], True where a key lies beyond the row's position."""
        self.enable_decode_mode()
        self.rows = torch.arange(len(positions), device=positions.device)
        self.positions = positions.unsqueeze(1)
        self.kv_length = int(positions.max()) + 1 if kv_length is None else kv_length
        keys = torch.arange(self.kv_length, device=positions.device)
        return (keys.unsqueeze(0) > positions.unsqueeze(1)).view(len(positions), 1, 1, self.kv_length)

    def memory(self, layer_number: int, key: torch.Tensor, value: torch.Tensor):
        """This layer's (key, value) buffers, made on first use, seen as megatron-core's
        [max_sequence_length, max_batch_size, groups, dim]. They are stored [batch, groups, sequence, dim], the
        layout attention reads them in: SDPA's [b, heads, keys, dim] view of a decode step's keys is then dense
        per row and head, instead of a strided gather of the whole cache at every step in every layer (same
        numbers, a fraction of the time on CPU)."""
        if layer_number not in self.key_value_memory_dict:
            self.key_value_memory_dict[layer_number] = tuple(
                torch.zeros(self.max_batch_size, t.shape[2], self.max_sequence_length, *t.shape[3:], dtype=t.dtype,
                            device=t.device).permute(2, 0, 1, 3) for t in (key, value))
        return self.key_value_memory_dict[layer_number]

    def copy_rows(self, sources: torch.Tensor, targets: torch.Tensor, length: int) -> None:
        """Slots ``targets`` take the first ``length`` positions of slots ``sources`` (a repeated prompt)."""
        for memory in self.key_value_memory_dict.values():
            for buffer in memory:
                buffer[:length, targets] = buffer[:length, sources]

    def keep_rows(self, keep: torch.Tensor, length: int) -> None:
        """Compact the slots to ``keep`` (ascending, their first ``length`` positions), so rows that finished
        stop costing compute."""
        for memory in self.key_value_memory_dict.values():
            for buffer in memory:
                buffer[:length, :len(keep)] = buffer[:length, keep]
