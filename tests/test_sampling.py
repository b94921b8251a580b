import math

import numpy as np
import pytest

from crucible.engine.rng import derive_seed, mix64, random_bits, uniform
from crucible.engine.sampling import (SamplingParams, log_softmax, sample_row,
                                      top_candidates, top_logprobs)
from crucible.errors import RequestError


def draw(logits, seed=1, output=(), prompt=(0,), stop_ids=(), **kw):
    return sample_row(np.asarray(logits, dtype=np.float32), SamplingParams(**kw),
                      prompt=list(prompt), output=list(output), seed=seed, stop_ids=stop_ids)


# -- rng -----------------------------------------------------------------------------------
def test_rng_is_splitmix64():
    # Published first outputs of SplitMix64 seeded with 0 and with 1234567.
    assert random_bits(0, 0) == 0xE220A8397B1DCDAF
    assert random_bits(0, 1) == 0x6E789E6AA1B965F4
    assert random_bits(1234567, 0) == 6457827717110365317
    assert uniform(0, 0) == (0xE220A8397B1DCDAF >> 11) / 2**53


def test_rng_pure_and_in_range():
    vals = [uniform(42, n) for n in range(2000)]
    assert vals == [uniform(42, n) for n in range(2000)]
    assert all(0.0 <= v < 1.0 for v in vals)
    assert abs(np.mean(vals) - 0.5) < 0.03
    assert uniform(42, 0) != uniform(43, 0)
    assert uniform(-1, 3) == uniform(2**64 - 1, 3)  # seeds wrap to 64 bits
    assert derive_seed(0, 5) == random_bits(0, 5) and mix64(0) == 0
    with pytest.raises(ValueError):
        uniform(1, -1)


# -- params --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(max_tokens=0), dict(temperature=-0.1), dict(temperature=float("nan")),
    dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1),
    dict(repetition_penalty=0.0), dict(presence_penalty=3.0), dict(frequency_penalty=-2.5),
    dict(min_tokens=5, max_tokens=4), dict(stop=[""]), dict(stop_token_ids=[-1]),
    dict(logprobs=-1), dict(prompt_logprobs=21), dict(max_tokens=2.5), dict(seed="x"),
    dict(top_k=True),
])
def test_params_rejected(kw):
    with pytest.raises(RequestError, match="invalid SamplingParams"):
        SamplingParams(**kw)


def test_params_normalised_and_hashable():
    p = SamplingParams(stop="###", stop_token_ids=[3, 4])
    assert p.stop == ("###",) and p.stop_token_ids == (3, 4)
    hash(p)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


# -- greedy and ordering -------------------------------------------------------------------
def test_greedy_lowest_id_wins_ties():
    assert draw([0.0, 3.0, 1.0, 3.0], temperature=0).token_id == 1
    assert draw([5.0, 5.0, 5.0], temperature=0).token_id == 0


def test_top_candidates_ties_by_id():
    v = np.array([1.0, 2.0, 2.0, 0.5, 2.0, 1.0])
    assert top_candidates(v, 2).tolist() == [1, 2]
    assert top_candidates(v, 4).tolist() == [1, 2, 4, 0]
    assert top_candidates(v, 10).tolist() == [1, 2, 4, 0, 5, 3]


# -- random sampling -----------------------------------------------------------------------
LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, -2.0, 1.5])


def support(n=400, **kw):
    return {draw(LOGITS, seed=s, **kw).token_id for s in range(n)}


def test_seeded_sampling_is_reproducible_and_seed_sensitive():
    a = [draw(LOGITS, seed=7, output=[0] * n, temperature=1.0).token_id for n in range(64)]
    b = [draw(LOGITS, seed=7, output=[0] * n, temperature=1.0).token_id for n in range(64)]
    c = [draw(LOGITS, seed=8, output=[0] * n, temperature=1.0).token_id for n in range(64)]
    assert a == b and a != c


def test_top_k_top_p_min_p_restrict_support():
    assert support(temperature=1.0) == set(range(8))
    assert support(temperature=1.0, top_k=1) == {5}
    assert support(temperature=1.0, top_k=3) == {5, 0, 7}
    # probs sorted: 5 (.43), 0 (.16), 7 (.10), 1 (.06) ...: top_p .55 keeps the first two.
    assert support(temperature=1.0, top_p=0.55) == {5, 0}
    # min_p 0.3: keep tokens with prob >= 0.3 * p(5): exp(x - 3) >= .3  <=> x >= 1.796.
    assert support(temperature=1.0, min_p=0.3) == {5, 0}


def test_empirical_distribution_matches_softmax():
    n = 6000
    counts = np.bincount([draw(LOGITS, seed=s, temperature=0.8).token_id for s in range(n)],
                         minlength=8)
    p = np.exp(log_softmax(LOGITS / 0.8))
    assert np.all(np.abs(counts / n - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-3)


def test_penalties():
    x = [1.0, 1.0, 1.0, -1.0]
    # repetition: token 0 (in prompt) positive logit divided -> token 1 wins
    assert draw(x, prompt=[0], temperature=0, repetition_penalty=2.0).token_id == 1
    # negative logits are multiplied (more negative), so token 3 cannot come back up
    assert draw([-1.0, -1.5, -3.0, -1.2], prompt=[0], temperature=0,
                repetition_penalty=2.0).token_id == 3
    # presence / frequency act on output tokens only
    assert draw(x, output=[0, 1], temperature=0, presence_penalty=0.5).token_id == 2
    assert draw([1.0, 1.6, 0.0, 0.0], output=[1, 1], temperature=0,
                frequency_penalty=0.5).token_id == 0
    assert draw([1.0, 1.6, 0.0, 0.0], output=[1], temperature=0,
                frequency_penalty=0.5).token_id == 1


def test_min_tokens_masks_stop_ids():
    x = [0.0, 5.0, 1.0]
    assert draw(x, stop_ids={1}, temperature=0, min_tokens=2, max_tokens=4).token_id == 2
    assert draw(x, stop_ids={1}, output=[2, 2], temperature=0, min_tokens=2,
                max_tokens=4).token_id == 1


def test_logprobs_rank_order_and_sampled_token():
    r = draw(LOGITS, temperature=0, logprobs=3)
    lp = log_softmax(LOGITS)
    assert list(r.logprobs) == [5, 0, 7]
    assert r.logprobs[5] == pytest.approx(float(lp[5]), abs=0) and r.token_id == 5
    # a sampled token outside the top-N is added after them
    r = draw(LOGITS, temperature=0, logprobs=1, repetition_penalty=100.0, prompt=[5, 0])
    assert list(r.logprobs) == [5, r.token_id] and r.token_id == 7
    assert math.isclose(sum(math.exp(v) for v in lp), 1.0, rel_tol=1e-12)
    assert top_logprobs(lp, 0, 3) == {3: float(lp[3])}
    assert draw(LOGITS, temperature=0).logprobs is None


def test_sampler_history_copies_the_prompt_only_for_the_repetition_penalty():
    from crucible.engine.request import Request

    def request(**kw):
        r = Request("r", [5, 6, 7], SamplingParams(**kw), seed=1, arrival=0, eos_ids=(),
                    tokenizer=None)
        r.token_ids += [9, 9]  # two generated tokens
        return r

    assert request(repetition_penalty=1.3).sampler_history() == ([5, 6, 7], [9, 9])
    assert request().sampler_history() == ([], [9, 9])
    # Without the penalty the prompt cannot change a draw, so leaving it out changes nothing.
    logits = np.linspace(-2.0, 3.0, 12)
    params = SamplingParams(temperature=0.9, presence_penalty=0.5, seed=3)
    full = sample_row(logits, params, prompt=[5, 6, 7], output=[9, 9], seed=3, stop_ids=())
    assert sample_row(logits, params, prompt=[], output=[9, 9], seed=3, stop_ids=()) == full
