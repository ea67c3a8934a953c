"""A host ``KeyPool`` under random churn, as a serving engine's pool lives: appends of every
size (block edges, empty ones), batched appends, frees and the reuse of freed blocks, full
pools, save and load, in orders hypothesis draws (its stateful testing, shrunk to the
shortest failing sequence of steps). After every step the pool is checked against a model
that keeps each sequence's appends as they came:

* each sequence's length, and its decoded keys bit for bit those of a fresh pool given only
  that sequence's appends in the same chunks (a block's bytes depend on its own history
  alone: a freed block reused holds nothing of its past);
* the blocks: distinct between sequences, as many as the lengths need, the rest free;
* free blocks zeroed with global scale 1, and a last block's entries past the length zero;
* a full pool refuses an append (PoolFullError) and changes nothing, nor does a refused
  batch or a free of an unknown id.
"""

import tempfile
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import settings, strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402
from tests.pool_steps import adversarial_keys  # noqa: E402

from indexer import KeyPool, arrays  # noqa: E402
from tests.gpu import requires_gpu  # noqa: E402
from indexer.pool import PoolFullError  # noqa: E402

P, E, D = 10, 4, 32
SEQS = ("a", "b", 3, 7)
seq_ids = st.sampled_from(SEQS)


def _keys(seed, n):
    """float32 (n, D) keys of every kind the global-scale rule meets (tests/pool_steps.py)."""
    return adversarial_keys(np.random.default_rng(seed), n, D)


def _blocks_for(n):
    return -(-n // E)


def _arrays(pool):
    """Host copies of the pool's three arrays (a GPU pool's read back)."""
    return [np.array(arrays.to_numpy(a)) for a in (pool.keys_fp4, pool.key_scale, pool.key_gscale)]


class PoolChurn(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = KeyPool(P, entries_per_block=E, head_dim=D)
        self.chunks = {}  # seq -> the key arrays appended to it, in order (the model)
        self.folder = tempfile.TemporaryDirectory()

    def teardown(self):
        self.folder.cleanup()

    def _length(self, seq):
        return sum(len(c) for c in self.chunks.get(seq, ()))

    def _blocks_free(self):
        return P - sum(_blocks_for(self._length(s)) for s in self.chunks)

    def _unchanged(self, call, error):
        """``call`` raises ``error`` and leaves the pool's arrays and bookkeeping as they were."""
        before = _arrays(self.pool), self.pool.free_blocks, {s: self.pool.length(s) for s in SEQS}
        with pytest.raises(error):
            call()
        after = _arrays(self.pool), self.pool.free_blocks, {s: self.pool.length(s) for s in SEQS}
        for a, b in zip(before[0], after[0]):
            np.testing.assert_array_equal(a, b)
        assert before[1:] == after[1:]

    @rule(seq=seq_ids, n=st.integers(0, 2 * E + 1), seed=st.integers(0, 2**32 - 1))
    def append(self, seq, n, seed):
        keys = _keys(seed, n)
        length = self._length(seq)
        if _blocks_for(length + n) - _blocks_for(length) > self._blocks_free():
            self._unchanged(lambda: self.pool.append(seq, keys), PoolFullError)
            return
        assert self.pool.append(seq, keys) == length + n
        if n:  # (an empty append makes no sequence)
            self.chunks.setdefault(seq, []).append(keys)

    @rule(batch=st.lists(seq_ids, min_size=1, max_size=4, unique=True),
          counts=st.lists(st.integers(0, E + 1), min_size=4, max_size=4), seed=st.integers(0, 2**32 - 1))
    def append_many(self, batch, counts, seed):
        counts = counts[: len(batch)]
        keys = _keys(seed, sum(counts))
        need = sum(_blocks_for(self._length(s) + c) - _blocks_for(self._length(s)) for s, c in zip(batch, counts))
        if need > self._blocks_free():  # all or nothing
            self._unchanged(lambda: self.pool.append_many(batch, keys, counts), PoolFullError)
            return
        lengths = self.pool.append_many(batch, keys, counts)
        start = 0
        for seq, c, got in zip(batch, counts, lengths):
            if c:
                self.chunks.setdefault(seq, []).append(keys[start:start + c])
            start += c
            assert int(got) == self._length(seq)

    @rule(batch=st.lists(seq_ids, min_size=2, max_size=4))
    def append_many_refused(self, batch):
        """A repeated id or counts that do not add up to the keys: refused, nothing written."""
        if len(set(batch)) == len(batch):
            keys = _keys(0, len(batch) + 1)  # one row too many for one a sequence
            self._unchanged(lambda: self.pool.append_many(batch, keys), ValueError)
        else:
            self._unchanged(lambda: self.pool.append_many(batch, _keys(0, len(batch))), ValueError)

    @rule(seq=seq_ids)
    def free(self, seq):
        if seq not in self.chunks:
            self._unchanged(lambda: self.pool.free(seq), ValueError)
            return
        self.pool.free(seq)
        del self.chunks[seq]

    @precondition(lambda self: self.chunks)
    @rule(fmt=st.sampled_from([".npz", ".safetensors"]))
    def save_and_load(self, fmt):
        if fmt == ".safetensors":
            pytest.importorskip("safetensors")
        path = Path(self.folder.name) / f"pool{fmt}"
        self.pool.save(path)
        loaded = KeyPool.load(path)
        for a, b in zip(_arrays(self.pool), _arrays(loaded)):
            np.testing.assert_array_equal(a, b)
        self.pool = loaded  # the churn goes on on the loaded pool (its free list's order kept)

    @invariant()
    def lengths_and_blocks_match_the_model(self):
        pool = self.pool
        assert sorted(map(str, pool.sequences)) == sorted(map(str, self.chunks))
        assert pool.free_blocks == self._blocks_free()
        seen = set()
        for seq in self.chunks:
            n = self._length(seq)
            assert pool.length(seq) == n
            row = pool.block_table([seq])[0]
            blocks = [int(b) for b in row if b >= 0]
            assert len(blocks) == _blocks_for(n) and all(0 <= b < P for b in blocks)
            assert not seen & set(blocks)
            seen |= set(blocks)
        free = sorted(set(range(P)) - seen)
        assert len(free) == pool.free_blocks
        # free blocks hold nothing of their past: zero codes and scales, global scale 1
        assert not pool.keys_fp4[free].any() and not pool.key_scale[free].any()
        assert np.all(pool.key_gscale[free] == 1.0)

    @invariant()
    def each_sequence_decodes_as_if_alone(self):
        for seq, chunks in self.chunks.items():
            alone = KeyPool(P, entries_per_block=E, head_dim=D)
            for c in chunks:
                alone.append(seq, c)
            got, want = self.pool.keys(seq), alone.keys(seq)
            assert got.tobytes() == want.tobytes(), seq
            # the last block's entries past the length: zero bytes (an append at entry 0
            # starts a block afresh; later appends fill it in order)
            n = self._length(seq)
            last = int(self.pool.block_table([seq])[0][_blocks_for(n) - 1])
            assert not self.pool.keys_fp4[last, n - (_blocks_for(n) - 1) * E:].any()
            assert not self.pool.key_scale[last, n - (_blocks_for(n) - 1) * E:].any()


PoolChurn.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_pool_under_churn = PoolChurn.TestCase


class DevicePoolChurn(PoolChurn):
    """The same churn on a GPU pool (its writes by ``kernels/key_write.cu``), beside a host
    pool given the same calls: after every step their arrays are equal byte for byte (the
    host pool is the one the model above checks)."""

    def __init__(self):
        super().__init__()
        self.host = self.pool
        self.pool = KeyPool(P, entries_per_block=E, head_dim=D, device="cuda")

    def _mirror(self, name, *args, **kwargs):
        """Call ``name`` on the host pool too; what the GPU pool did, it must do."""
        return getattr(self.host, name)(*args, **kwargs)

    @rule(seq=seq_ids, n=st.integers(0, 2 * E + 1), seed=st.integers(0, 2**32 - 1))
    def append(self, seq, n, seed):
        full = _blocks_for(self._length(seq) + n) - _blocks_for(self._length(seq)) > self._blocks_free()
        super().append(seq, n, seed)
        if not full:
            self._mirror("append", seq, _keys(seed, n))

    @rule(batch=st.lists(seq_ids, min_size=1, max_size=4, unique=True),
          counts=st.lists(st.integers(0, E + 1), min_size=4, max_size=4), seed=st.integers(0, 2**32 - 1))
    def append_many(self, batch, counts, seed):
        counts = counts[: len(batch)]
        need = sum(_blocks_for(self._length(s) + c) - _blocks_for(self._length(s)) for s, c in zip(batch, counts))
        full = need > self._blocks_free()
        super().append_many(batch, counts, seed)
        if not full:
            self._mirror("append_many", batch, _keys(seed, sum(counts)), counts)

    @rule(seq=seq_ids)
    def free(self, seq):
        known = seq in self.chunks
        super().free(seq)
        if known:
            self._mirror("free", seq)

    @precondition(lambda self: self.chunks)
    @rule(fmt=st.sampled_from([".npz"]))
    def save_and_load(self, fmt):
        path = Path(self.folder.name) / f"pool{fmt}"
        self.pool.save(path)
        self.pool = KeyPool.load(path, device="cuda")

    @invariant()
    def lengths_and_blocks_match_the_model(self):
        pool, self.pool = self.pool, self.host  # the model's checks on the host pool (NumPy arrays)
        try:
            super().lengths_and_blocks_match_the_model()
            super().each_sequence_decodes_as_if_alone()
        finally:
            self.pool = pool
        for a, b in zip(_arrays(pool), _arrays(self.host)):
            assert a.tobytes() == b.tobytes()
        assert pool.free_blocks == self.host.free_blocks and pool.sequences == self.host.sequences
        assert arrays.to_numpy(pool.block_table(SEQS)).tolist() == self.host.block_table(SEQS).tolist()

    @invariant()
    def each_sequence_decodes_as_if_alone(self):
        pass  # checked on the host mirror above, whose arrays the GPU pool's equal


DevicePoolChurn.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
test_gpu_pool_under_churn = pytest.mark.gpu(requires_gpu(DevicePoolChurn.TestCase))
