"""Packing samples into fixed-length sequences (MindSpeed-LLM's ``--pack`` / ``--neat-pack``).

Samples are grouped greedily: each sequence takes the longest remaining sample that still fits, until none
does. The capacity is ``seq_length - 1`` (one slot kept for padding, as MindSpeed-LLM does), every sequence
is padded to exactly ``seq_length``. Neat packing numbers the samples 1..k in the attention mask (0 marks
padding) so attention stays inside each sample; plain packing puts 1 everywhere.
"""
from __future__ import annotations

import bisect

IGNORE_INDEX = -100


def greedy_groups(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped so each group's total is <= capacity; ties go to the earlier sample."""
    if any(n > capacity for n in lengths):
        raise ValueError(f"a sample is longer than the packing capacity {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], -i))
    sizes = [lengths[i] for i in order]
    groups = []
    while order:
        group, room = [], capacity
        while True:
            pos = bisect.bisect_right(sizes, room) - 1
            if pos < 0:
                break
            room -= sizes.pop(pos)
            group.append(order.pop(pos))
        groups.append(group)
    return groups


def pack(samples: list[tuple[list[int], list[int]]], seq_length: int, pad_id: int, neat: bool):
    """(input_ids, labels) samples -> (input_ids, attention_mask, labels) sequences of exactly seq_length."""
    out = []
    for group in greedy_groups([len(ids) for ids, _ in samples], seq_length - 1):
        ids, mask, labels = [], [], []
        for number, i in enumerate(group, start=1):
            ids += samples[i][0]
            labels += samples[i][1]
            mask += [number if neat else 1] * len(samples[i][0])
        pad = seq_length - len(ids)
        ids += [pad_id] * pad
        labels += [IGNORE_INDEX] * pad
        mask += [0 if neat else 1] * pad
        out.append((ids, mask, labels))
    return out
