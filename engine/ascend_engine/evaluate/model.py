"""Forward passes for evaluation on any TP/PP layout: batched log-likelihoods and greedy continuation.

Every method is collective over the model-parallel (TP x PP) group, so data-parallel replicas may answer
different questions. Logits exist on the last pipeline stage, split over the vocabulary by TP; they are gathered
there, reduced to the few numbers asked for, and those numbers are shared with every rank of the group (a sum
where only the last stage's first TP rank contributes).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def _read_only(gpt, pos_index: torch.Tensor, row_index: torch.Tensor):
    """While open, ``gpt`` (if this stage has the output layer) computes its last layer's MLP and the logits only
    for the hidden states at (``pos_index[k]``, ``row_index[k]``), and returns those logits as [1, k, vocab / TP].
    Nothing after the last layer's attention mixes positions, and every position's keys and values are computed
    before it, so the other positions' MLP and logits are work nobody reads (the output layer alone is a large
    share of the arithmetic at evaluation sizes). Where the last layer is not a dense megatron-core layer with
    its own MLP step, only the output layer is restricted. Yields whether any restriction applies: not with
    sequence parallelism, whose output layer gathers the sequence itself, nor with multi-token prediction, whose
    heads share the output layer."""
    layer = getattr(gpt, "output_layer", None) if getattr(gpt, "post_process", False) else None
    if layer is None or getattr(layer, "sequence_parallel", False) or getattr(gpt.config, "mtp_num_layers", None):
        yield False
        return
    layers = getattr(getattr(gpt, "decoder", None), "layers", None)
    last = layers[-1] if layers else None
    forward_mlp = getattr(type(last), "_forward_mlp", None)
    if forward_mlp is not None and getattr(last, "is_moe_layer", True) is False:

        def mlp_at_read_positions(hidden, *args, **kwargs):  # hidden: [seq, batch, hidden]
            return forward_mlp(last, hidden[pos_index, row_index].unsqueeze(1), *args, **kwargs)

        last._forward_mlp = mlp_at_read_positions
        try:
            yield True
        finally:
            del last._forward_mlp
        return

    def select(_module, args, kwargs):
        hidden = args[0]  # [seq, batch, hidden]
        return (hidden[pos_index, row_index].unsqueeze(1), *args[1:]), kwargs

    handle = layer.register_forward_pre_hook(select, with_kwargs=True)
    try:
        yield True
    finally:
        handle.remove()


class InferenceModel:
    def __init__(self, gpt, vocab_size: int, max_len: int, info, device):
        from ..generate.ragged import direct_path_fits

        self.gpt, self.vocab_size, self.max_len, self.info, self.device = gpt, vocab_size, max_len, info, device
        self.truncated = 0  # rows cut from the left to the model's positions (as lm-evaluation-harness does)
        self.shares_prefixes = direct_path_fits(gpt)  # one stage whose attention reads a RaggedKVCache
        self._prefix: tuple[tuple[int, ...], object] | None = None  # the last prefix encoded, and its cache
        self._products = None  # the linears' packed products (``inference_linears``), made on first use
        self._lean = None  # ``LeanForward`` for scoring's forwards where the model fits it, made with the products

    @contextmanager
    def _direct(self):
        """``inference_mode`` with the linears' products in the device's kernels, packed once for the whole
        evaluation (its weights do not change)."""
        from ..generate import lean_forward
        from ..models.inference_linears import direct_linears, packed_products

        with torch.inference_mode():
            if self._products is None:
                self._products = packed_products(self.gpt, rows=512)
                if lean_forward.fits(self.gpt):
                    self._lean = lean_forward.LeanForward(self.gpt, self.max_len + 1, self._products)
            with direct_linears(self.gpt, self._products):
                yield

    def _fit(self, row: list[int], spare: int = 0) -> tuple[list[int], int]:
        """The row's last ``max_len + spare`` tokens and how many were cut from its start (``spare``: trailing
        tokens that are only targets, never read by the model)."""
        cut = max(0, len(row) - self.max_len - spare)
        if cut:
            self.truncated += 1
        return row[cut:], cut

    @property
    def _reporter(self) -> bool:
        return self.info.is_last_stage and self.info.tp_rank == 0

    def _logprobs(self, rows: list[list[int]], positions: list[list[int]]) -> list[torch.Tensor] | None:
        """Per row, log-softmax over the real vocabulary at the given positions ([len(positions[i]), vocab], fp32),
        on the last stage (None elsewhere). Rows are right-padded; causal attention keeps padding from touching the
        real positions. The output layer sees only the asked-for positions (``_read_only``): at evaluation sizes
        it is a large share of the arithmetic, and logits of every position would be batch x length x vocabulary
        floats nobody reads. At one stage and TP1 a dense model takes ``LeanForward`` instead of the schedule."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if self.shares_prefixes:  # one stage: the lean forward where the model fits it
            with self._direct():
                if self._lean is not None:
                    return self._lean_logprobs(rows, positions)
        width = max(len(r) for r in rows)
        ids = self._right_padded(rows)
        device = self.device
        row_index, pos_index = self._read_index(positions)

        def forward_step(data_iterator, module):
            tokens = next(data_iterator)
            positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
            logits = module(tokens, positions, None)
            return logits, lambda out: (out.new_zeros(()), {"logits": out.detach()})

        with torch.no_grad(), _read_only(self.gpt, pos_index, row_index) as selected:
            out = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([ids]), model=[self.gpt], num_microbatches=1,
                seq_length=width, micro_batch_size=len(rows), forward_only=True)
            if not self.info.is_last_stage:
                return None
            logits = out[0]["logits"]  # [1, positions, vocab / TP], or [batch, seq, vocab / TP] when not selected
            logits = logits[0] if selected else logits[row_index, pos_index]
            picked = gather_from_tensor_model_parallel_region(logits.contiguous())
            normalised = torch.log_softmax(picked[:, : self.vocab_size].float(), dim=-1)
            return list(normalised.split([len(p) for p in positions]))

    def _right_padded(self, rows: list[list[int]]) -> torch.Tensor:
        ids = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return ids.to(self.device)

    def _read_index(self, positions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, position) index tensors of the positions whose logits are read, row by row."""
        return (torch.tensor([i for i, p in enumerate(positions) for _ in p], device=self.device),
                torch.tensor([q for p in positions for q in p], device=self.device))

    def _lean_logprobs(self, rows: list[list[int]], positions: list[list[int]]) -> list[torch.Tensor]:
        """``_logprobs`` by ``LeanForward`` (one stage, TP1): the right-padded rows from position 0 under a causal
        mask, keeping no cache, logits only at the positions read."""
        from ..models.ragged_cache import RaggedKVCache

        ids = self._right_padded(rows)
        width = ids.shape[1]
        positions_of = torch.arange(width, device=self.device).expand(len(rows), width)
        mask = RaggedKVCache.causal_mask(0, width, self.device)
        logits = self._lean(ids, positions_of, mask, None, read=self._read_index(positions))
        normalised = torch.log_softmax(logits[:, : self.vocab_size].float(), dim=-1)
        return list(normalised.split([len(p) for p in positions]))

    def _prefix_cache(self, prefix: list[int], rows: int, width: int):
        """A ``RaggedKVCache`` whose slots 0..rows-1 hold ``prefix``'s keys and values, with room for ``width``
        more positions. The prefix is encoded once (one row) and copied to the other slots; the cache is kept
        for the next batch of the same prefix (a subject's questions) and remade when it is too small."""
        from ..models.ragged_cache import RaggedKVCache

        key = tuple(prefix)
        if self._prefix is not None:
            held, cache = self._prefix
            if held == key and cache.max_batch_size >= rows and cache.max_sequence_length >= len(prefix) + width:
                return cache
        cache = RaggedKVCache(rows, len(prefix) + width)
        cache.materialize_only_last_token_logits = False  # ``_read_only`` picks the positions read
        mask = cache.prefill(torch.zeros(1, dtype=torch.long, device=self.device), len(prefix))
        ids = torch.tensor([prefix], device=self.device)
        last = torch.tensor([len(prefix) - 1], device=self.device)
        if self._lean is not None:
            self._lean(ids, cache.positions, mask, cache, read=(torch.zeros_like(last), last))
        else:
            with _read_only(self.gpt, last, torch.zeros_like(last)):  # no logits of the prefix are read
                self.gpt(ids, cache.positions, None, inference_context=cache, runtime_gather_output=True)
        if rows > 1:
            cache.copy_rows(torch.zeros(rows - 1, dtype=torch.long, device=self.device),
                            torch.arange(1, rows, device=self.device), len(prefix))
        self._prefix = key, cache
        return cache

    def _prefixed_logprobs(self, prefix: list[int], rows: list[list[int]], positions: list[list[int]]):
        """``_logprobs`` of rows that continue ``prefix`` (positions counted within each row): the prefix's keys
        and values come from ``_prefix_cache`` and only the rows' own tokens are computed, right-padded, at
        positions after the prefix, by ``LeanForward`` where it fits (a dense model at TP1: no module calls, which
        a GPU's host otherwise spends most of a batch on), else by the model. Every rank of the (single-stage)
        group holds the result."""
        width = max(len(r) for r in rows)
        cache = self._prefix_cache(prefix, len(rows), width)
        ids = self._right_padded(rows)
        row_index, pos_index = self._read_index(positions)
        mask = cache.extend(len(rows), len(prefix), width, self.device)
        if self._lean is not None:
            logits = self._lean(ids, cache.positions, mask, cache, read=(row_index, pos_index))
        else:
            with _read_only(self.gpt, pos_index, row_index) as selected:
                logits = self.gpt(ids, cache.positions, None, inference_context=cache, runtime_gather_output=True)
            logits = logits[0] if selected else logits[row_index, pos_index]
        normalised = torch.log_softmax(logits[:, : self.vocab_size].float(), dim=-1)
        return list(normalised.split([len(p) for p in positions]))

    def _share(self, values: torch.Tensor) -> torch.Tensor:
        """The reporter's ``values`` on every rank of its model-parallel group."""
        if not self._reporter:
            values = torch.zeros_like(values)
        if self.info.tp * self.info.pp > 1:
            from megatron.core import parallel_state

            values = values.to(self.device)
            torch.distributed.all_reduce(values, group=parallel_state.get_model_parallel_group())
        return values.cpu()

    def _unshared(self, prefix: list[int], rows: list[list[int]], spare: int = 0) -> bool:
        """Whether rows after ``prefix`` go the plain way: no prefix, a pipeline, or a row too long to keep whole
        (it is cut from the left, prefix first)."""
        return not prefix or not self.shares_prefixes or len(prefix) + max(map(len, rows)) - spare > self.max_len

    def continuation_logprobs(self, rows: list[list[int]], starts: list[int], prefix: list[int] = ()) -> list[float]:
        """For each row, the summed log-probability of its tokens from ``starts[i]`` on, given those before.
        With a ``prefix`` every row continues it (``starts`` within the row, at least 1): its keys and values are
        computed once for all rows and batches that share it."""
        return self._continuation(rows, starts, prefix)[:, 0].tolist()

    def continuation_scores(self, rows: list[list[int]], starts: list[int],
                            prefix: list[int] = ()) -> list[tuple[float, bool]]:
        """``continuation_logprobs`` and, per row, whether each of those tokens is the most likely one (greedy
        decoding would write the continuation: lm-evaluation-harness's ``is_greedy``)."""
        return [(float(total), bool(greedy)) for total, greedy in self._continuation(rows, starts, prefix).tolist()]

    def _continuation(self, rows: list[list[int]], starts: list[int], prefix: list[int] = ()) -> torch.Tensor:
        """[rows, 2]: each row's summed log-probability from ``starts[i]`` on, and 1.0 where every one of those
        tokens is its position's argmax (on every rank of the model-parallel group)."""
        result = torch.zeros(len(rows), 2, dtype=torch.float64)
        # A row's last token is only a target: the model reads the others, so a row of max_len + 1 tokens fits
        # (lm-evaluation-harness's window: context and continuation's last max_len + 1 tokens).
        if self._unshared(prefix, rows, spare=1):
            rows, starts, prefix = [list(prefix) + row for row in rows], [len(prefix) + s for s in starts], ()
            fitted = [self._fit(row, spare=1) for row in rows]
            rows = [row for row, _ in fitted]
            starts = [max(1, start - cut) for start, (_, cut) in zip(starts, fitted)]
        positions = [list(range(start - 1, len(row) - 1)) for row, start in zip(rows, starts)]
        read = [row[:-1] if len(row) > 1 else row for row in rows]
        if prefix:
            with self._direct():
                logprobs = self._prefixed_logprobs(list(prefix), read, positions)
        else:
            logprobs = self._logprobs(read, positions)
        if logprobs is not None:  # one gather and one copy to the host for the whole batch, not one per row
            flat = torch.cat(logprobs)
            targets = torch.tensor([t for row, start in zip(rows, starts) for t in row[start:]], device=flat.device)
            owner = torch.tensor([i for i, (row, start) in enumerate(zip(rows, starts)) for _ in row[start:]],
                                 device=flat.device)
            picked = flat.gather(-1, targets.unsqueeze(-1)).squeeze(-1).double()
            sums = torch.zeros(len(rows), dtype=torch.float64, device=flat.device).index_add_(0, owner, picked)
            missed = torch.zeros(len(rows), dtype=torch.float64, device=flat.device).index_add_(
                0, owner, (flat.argmax(-1) != targets).double())
            result = torch.stack([sums, (missed == 0).double()], dim=1).cpu()
        return self._share(result)

    def next_token_logprobs(self, rows: list[list[int]], candidates: list[list[int]],
                            prefix: list[int] = ()) -> list[list[float]]:
        """For each row (after ``prefix``, as in ``continuation_logprobs``), the log-probability of each candidate
        token right after it (one pass per batch)."""
        width = max(len(c) for c in candidates)
        result = torch.full((len(rows), width), float("-inf"), dtype=torch.float64)
        if self._unshared(prefix, rows):
            rows, prefix = [self._fit(list(prefix) + row)[0] for row in rows], ()
        if prefix:
            with self._direct():
                logprobs = self._prefixed_logprobs(list(prefix), rows, [[len(row) - 1] for row in rows])
        else:
            logprobs = self._logprobs(rows, [[len(row) - 1] for row in rows])
        if logprobs is not None:  # one gather and one copy to the host for the whole batch
            flat = torch.cat(logprobs)  # [rows, vocabulary]: one position per row
            index = torch.tensor([c + [c[0]] * (width - len(c)) for c in candidates], device=flat.device)
            got = flat.gather(-1, index).double().cpu()
            present = torch.tensor([[j < len(c) for j in range(width)] for c in candidates])
            result = torch.where(present, got, result)
        shared = self._share(result)
        return [shared[i, : len(c)].tolist() for i, c in enumerate(candidates)]

    def generate(self, prompts: list[list[int]], max_new: int, eos_id: int | None, finished=None, *,
                 batch_size: int | None = None, done=None) -> list[list[int]]:
        """Greedy continuations of ``prompts`` (new tokens only, without the end-of-sequence token), with a KV
        cache, so the cost grows linearly in new tokens; at most ``batch_size`` rows decode at once, a finished
        row's slot going to the next prompt (``generate_batch``'s ``slots``). A row stops at ``eos_id``, at
        ``max_new`` or when ``finished(row, new_tokens)`` says so; ``done(row)`` is called as it does. A prompt
        that leaves less than ``max_new`` positions loses its beginning (as lm-evaluation-harness does); the same
        tokens result on every rank."""
        from ..generate.batched import generate_batch

        if not prompts:  # a data-parallel rank left without questions
            return []
        room = min(max_new, self.max_len - 1)
        fitted = []
        for prompt in prompts:
            cut = max(0, len(prompt) - (self.max_len - room))
            self.truncated += bool(cut)
            fitted.append(prompt[cut:])
        out = generate_batch(self.gpt, fitted, max_new_tokens=room, eos_id=eos_id, vocab_size=self.vocab_size,
                             max_length=self.max_len, finished=finished, slots=batch_size, done=done)
        return [r[:-1] if r and r[-1] == eos_id else r for r in out.responses()]
