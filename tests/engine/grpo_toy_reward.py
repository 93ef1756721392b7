"""A reward with a learnable rule for the GRPO tests, loaded by module path (``grpo_toy_reward:letter_share``).

The reference answer is one letter; the reward is the share of the response's letters that are that letter
(0 for a response without letters). A random tiny model scores a few percent, so groups have spread from the
first step, and the rule is learnable: emit tokens made of the reference letter.
"""


def letter_share(response: str, reference: str | None) -> float:
    letters = [c for c in response.lower() if c.isalpha()]
    target = (reference or "").strip().lower()
    return sum(c == target for c in letters) / len(letters) if letters and target else 0.0
