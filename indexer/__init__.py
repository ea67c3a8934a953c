"""indexer: the lightning indexer of DeepSeek-style sparse attention over NVFP4 keys.

    I[t, s] = sum_h w[t, h] * ReLU(q[t, h, :] . k[s, :]),  then the top-k entries per query.

Public surface: ``score_topk`` (NumPy reference or CUDA through CuPy), ``score_topk_ragged``
and ``causal_lens`` (queries grouped by sequence: prefill, multi-token decode), ``prepare``
(a call checked and planned once for arrays of fixed shapes, then run per layer), ``KeyPool``
(the paged NVFP4 key pool, and ``PoolFullError``), ``write_keys`` (keys quantized into an
engine's own pool arrays at physical slots, by the pool's rule; a CUDA graph can hold it),
``Workspace`` (preallocated device scratch memory for CUDA-graph
capture), ``nvfp4`` (the codec) and ``reference`` (the float64 specification).
``indexer.torch_ops`` (imported by name only: it needs PyTorch) registers the calls as
PyTorch operators for ``torch.compile``.
"""

from . import nvfp4, reference
from .ops import BACKENDS, PRECISIONS, score_topk, score_topk_ragged
from .prepared import PreparedCall, prepare
from .ragged import causal_lens
from .keywrite import write_keys
from .pool import KeyPool, PoolFullError
from .validate import MAX_HEAD_DIM, MAX_HEADS, MAX_ROW_ENTRIES, MAX_TOP_K
from .workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "score_topk",
    "score_topk_ragged",
    "causal_lens",
    "prepare",
    "PreparedCall",
    "KeyPool",
    "PoolFullError",
    "write_keys",
    "Workspace",
    "nvfp4",
    "reference",
    "BACKENDS",
    "PRECISIONS",
    "MAX_TOP_K",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_ROW_ENTRIES",
    "__version__",
]
