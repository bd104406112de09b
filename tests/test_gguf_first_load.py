"""A GGUF's first load (de-quantised now) gives the numbers of every later load (read from the de-quantised copy):
a study run first on a machine equals its re-runs."""

import numpy as np
import pytest

from dynheads import DynheadsError, load_model, sample_from_text, trace

pytestmark = pytest.mark.embedded

CONTEXT = " ".join(
    f"Line {i}: the code for item {i} is " + (f"[[{i * 7919 % 10007:05d}]]." if i == 21 else f"{i * 7919 % 10007:05d}.")
    for i in range(60)
)


def test_the_first_load_of_a_gguf_traces_like_the_cached_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    first = load_model()  # no de-quantised copy yet: written now
    try:
        sample = sample_from_text(first, CONTEXT, "What is the code for item 21?")
    except DynheadsError as error:  # pragma: no cover - a tokenizer change would make the span vanish
        pytest.fail(str(error))
    traced = trace(first, sample, max_new_tokens=8)
    again = trace(load_model(), sample, max_new_tokens=8)  # read from the copy
    np.testing.assert_array_equal(traced.tokens, again.tokens)
    np.testing.assert_array_equal(traced.hidden, again.hidden)
    for name, scores in traced.scores.items():
        np.testing.assert_array_equal(scores, again.scores[name], err_msg=name)
