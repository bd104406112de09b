"""dynheads: which attention heads retrieve from the context at each generated token, and what that means.

Public API (the CLI is a thin layer over it)::

    lm = dynheads.load_model()                      # embedded SmolLM2-135M-Instruct GGUF, or any HF model
    sample = dynheads.niah.make_sample(lm.tokenizer, context_tokens=1000, depth=0.5, seed=0)
    trace = dynheads.trace(lm, sample, max_new_tokens=48)
    trace.copy_scores    # [step, layer, head] bool, Eq. 1
"""

from dynheads.decoding import trace
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel, load_model
from dynheads.tasks import niah
from dynheads.trace import Trace

__version__ = "0.1.0"
__all__ = ["DynheadsError", "LoadedModel", "Trace", "load_model", "niah", "trace"]
