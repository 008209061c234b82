"""Lossless verification on a small randomly initialised Llama (a real transformers model, float64 so
that tree- and chain-shaped forwards agree to the last bit that matters): greedy speculative output equals
plain greedy over many prompts and drafter settings, replay equals the real run, the KV cache keeps only
the accepted path, and speculative sampling reproduces the exact sampling distribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moelab.hd import HierarchyDrafter, NGramTable, PLDDrafter, build_tree, generate, replay_greedy  # noqa: E402
from moelab.hd.drafters import Draft, Drafter  # noqa: E402
from moelab.models.lm import LMSession, set_cpu_threads  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    prev = set_cpu_threads(1)  # tiny forwards: threads only add overhead on a shared CPU
    yield
    set_cpu_threads(prev)


def tiny_llama(vocab: int, seed: int, std: float = 0.5):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   initializer_range=std)
    return transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama(24, 0)


@pytest.fixture(scope="module")
def stores():
    rng = np.random.default_rng(1)
    return NGramTable.build([rng.integers(0, 24, 300)], length=4), NGramTable.build([rng.integers(0, 24, 3000)],
                                                                                       length=6)


def _drafter(kind, S, L, order, g, length):
    return PLDDrafter() if kind == "PLD" else HierarchyDrafter(S, L, order=order, max_candidates=g, length=length)


@settings(max_examples=15, deadline=None)
@given(prompt=st.lists(st.integers(0, 23), min_size=1, max_size=24), kind=st.sampled_from(["HD", "PLD"]),
       order=st.sampled_from(["WSL", "LSW", "W", "S", "L", "SL"]), g=st.integers(1, 8), length=st.integers(1, 6),
       n=st.integers(1, 30))
def test_greedy_speculative_equals_plain_greedy(model, stores, prompt, kind, order, g, length, n):
    S, L = stores
    plain = generate(model, prompt, None, max_new_tokens=n)
    spec = generate(model, prompt, _drafter(kind, S, L, order, g, length), max_new_tokens=n)
    assert spec.tokens == plain.tokens
    assert len(plain.steps) == len(plain.tokens)  # AR: one token per forward
    replay = replay_greedy(_drafter(kind, S, L, order, g, length), prompt, plain.tokens)
    assert replay.tokens == plain.tokens
    # same steps; the last step's accepted count differs only where the real run drafted past the limit
    assert len(replay.steps) == len(spec.steps)
    assert [len(s.accepted) for s in replay.steps][:-1] == [len(s.accepted) for s in spec.steps][:-1]


def test_drafts_are_accepted_and_counted(model, stores):
    S, L = stores
    d = HierarchyDrafter(S, L, order="WSL")
    res = generate(model, [1, 2, 3, 4, 5, 6, 7, 8], d, max_new_tokens=60)
    assert res.mean_accepted > 1.0  # this tiny model loops, so W drafts get accepted
    assert sum(c.accepted_tokens for c in d.counters.values()) == sum(len(s.accepted) for s in res.steps)
    assert max(s.tree_size for s in res.steps) > 2  # several candidates verified in one forward


def test_plain_greedy_matches_transformers_generate(model):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ours = generate(model, prompt, None, max_new_tokens=20).tokens
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
    assert ours == ref


def test_tree_forward_scores_each_branch_like_a_chain(model):
    ctx = [5, 6, 7, 8]
    tree = build_tree(9, [(1, 2, 3), (1, 4), (7, 7)], ["W", "S", "L"])
    s = LMSession(model)
    s.prefill(ctx)
    logits = s.forward_tree(tree.tokens, tree.parents)
    for path in ([0, 1, 2, 3], [0, 1, 4], [0, 5, 6]):
        c = LMSession(model)
        c.prefill(ctx)
        chain = c.forward_tree(tree.tokens[path], np.arange(-1, len(path) - 1))
        np.testing.assert_allclose(logits[path], chain, rtol=1e-9, atol=1e-9)
    # keep the path root -> 1 -> 4: the cache then equals a chain prefill of those tokens
    s.commit([0, 1, 4])
    ref = LMSession(model)
    ref.prefill([*ctx, 9, 1, 4])
    assert s.length == ref.length == len(ctx) + 3
    for a, b in zip(s.cache.layers, ref.cache.layers):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.values, b.values, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="parents"):
        s.forward_tree([1, 2], [0, 0])


class AllPairsDrafter(Drafter):
    """Test drafter: proposes every 2-token continuation over a tiny vocabulary (deterministic drafts)."""

    letters = "X"

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.cands = [tuple(p) for p in itertools.product(range(vocab), repeat=2)]

    def draft(self) -> Draft:
        return Draft(self.cands[::3], ["X"] * len(self.cands[::3]))


def test_speculative_sampling_matches_the_exact_distribution():
    """Chi-square goodness of fit of 3-token outputs against the exact sequence probabilities."""
    from scipy import stats

    vocab, temp, prompt, n_tok = 4, 1.3, [1, 2], 3
    m = tiny_llama(vocab, 3, std=0.3)
    exact = {}
    with torch.inference_mode():
        for seq in itertools.product(range(vocab), repeat=n_tok):
            ids = torch.tensor([prompt + list(seq)])
            logp = torch.log_softmax(m(ids).logits[0].double() / temp, -1)
            exact[seq] = float(np.exp(sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(seq))))
    rng = np.random.default_rng(0)
    counts = dict.fromkeys(exact, 0)
    n, multi = 1000, 0
    for _ in range(n):
        res = generate(m, prompt, AllPairsDrafter(vocab), max_new_tokens=n_tok, temperature=temp, seed=rng)
        counts[tuple(res.tokens)] += 1
        multi += len(res.steps) < n_tok
    assert multi > n // 10  # drafts were accepted often enough for the test to exercise acceptance
    obs = np.array([counts[s] for s in exact])
    exp = np.array([exact[s] for s in exact]) * n
    assert abs(exp.sum() - n) < 1e-6
    small = exp < 5  # pool rare sequences into one cell so the chi-square approximation holds
    obs = np.append(obs[~small], obs[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    stat = ((obs - exp) ** 2 / exp).sum()
    p_value = stats.chi2.sf(stat, df=len(exp) - 1)
    assert p_value > 1e-3, f"speculative sampling is off the exact distribution (p = {p_value:.2e})"


def test_sampling_without_drafts_is_plain_sampling(model):
    a = generate(model, [1, 2, 3], None, max_new_tokens=12, temperature=0.8, seed=5).tokens
    b = generate(model, [1, 2, 3], None, max_new_tokens=12, temperature=0.8, seed=5).tokens
    c = generate(model, [1, 2, 3], None, max_new_tokens=12, temperature=0.8, seed=6).tokens
    assert a == b and len(a) == 12 and a != c


def test_eos_stops_identically(model, stores):
    S, L = stores
    plain = generate(model, [1, 2, 3, 4], None, max_new_tokens=40)
    eos = plain.tokens[7]
    cut = plain.tokens[:plain.tokens.index(eos) + 1]
    assert generate(model, [1, 2, 3, 4], None, max_new_tokens=40, eos_token_id=eos).tokens == cut
    assert generate(model, [1, 2, 3, 4], HierarchyDrafter(S, L), max_new_tokens=40, eos_token_id=[eos]).tokens == cut


@pytest.mark.parametrize(("kw", "match"), [({"prompt_ids": []}, "prompt_ids"), ({"max_new_tokens": 0}, "max_new_tokens"),
                                           ({"temperature": -0.1}, "temperature"),
                                           ({"temperature": float("nan")}, "temperature")])
def test_bad_generation_inputs(model, kw, match):
    args = {"prompt_ids": [1, 2], "max_new_tokens": 4, "temperature": 0.0, **kw}
    with pytest.raises(ValueError, match=match):
        generate(model, args.pop("prompt_ids"), None, **args)
