"""Append steps for the pool's tests, host and device alike: several sequences a step, with
row counts off block edges (0 included) and keys that exercise the global-scale rule."""

import numpy as np

CAP = 6.0 * 448.0  # a block with global scale g holds values up to CAP * g


def adversarial_keys(rng, n, d):
    """float32 (n, d): Gaussian rows whose magnitudes jump by up to 2**+-24 from row to row
    (blocks that grow, some groups re-quantized as they leave E4M3's exact range), rows of
    zeros and of -0.0, a row at exactly a power-of-two capacity, rows with one huge element."""
    x = rng.standard_normal((n, d)) * np.exp2(rng.integers(-24, 25, (n, 1)))
    # groups of one row spread over 2**-16 .. 1 of the row's largest: small E4M3 scales
    x *= np.exp2(rng.integers(-16, 1, (n, d // 16, 1))).repeat(16, -1).reshape(n, d)
    kind = rng.integers(0, 8, n)
    x[kind == 0] = 0.0
    x[kind == 1] = -0.0
    x[kind == 2, 0] = CAP * 2.0 ** rng.integers(-20, 20)
    x[kind == 3, rng.integers(0, d)] = 1e6
    return x.astype(np.float32)


def append_steps(rng, d, entries_per_block, seqs, steps):
    """``steps`` of (seqs, keys (n, d) float32, counts): a random subset of ``seqs`` in random
    order, each with 0 .. 2E + 3 rows."""
    for _ in range(steps):
        chosen = [seqs[i] for i in rng.permutation(len(seqs))[: rng.integers(1, len(seqs) + 1)]]
        counts = [int(c) for c in rng.integers(0, 2 * entries_per_block + 4, len(chosen))]
        yield chosen, adversarial_keys(rng, sum(counts), d), counts


def new_slots(pool, chosen, counts, lengths_before):
    """int64 physical slots (block * E + entry) of the keys an append_many of ``counts`` keys
    to ``chosen`` just wrote into ``pool``, in the keys' order."""
    E = pool.entries_per_block
    slots = []
    for seq, c in zip(chosen, counts):
        blocks = pool._blocks.get(seq, [])
        slots += [blocks[j // E] * E + j % E for j in range(lengths_before[seq], lengths_before[seq] + c)]
    return np.array(slots, dtype=np.int64)


def write_keys_steps(rng, d, entries_per_block, seqs, steps, num_blocks=400):
    """A host KeyPool filled by ``append_steps``, and for each step (keys, slots): the same
    writes addressed by physical slot, for ``indexer.write_keys`` into a second pool's
    arrays. Returns (pool, [(keys, slots), ...])."""
    from indexer import KeyPool  # noqa: PLC0415

    pool = KeyPool(num_blocks, entries_per_block=entries_per_block, head_dim=d)
    writes = []
    for chosen, keys, counts in append_steps(rng, d, entries_per_block, seqs, steps):
        before = {s: pool.length(s) for s in chosen}
        pool.append_many(chosen, keys, counts)
        writes.append((keys, new_slots(pool, chosen, counts, before)))
    return pool, writes


def empty_pool(P, E, D, xp=np):
    """A fresh pool's arrays (keys_fp4, key_scale, key_gscale) in array module ``xp``."""
    return (xp.zeros((P, E, D // 2), xp.uint8), xp.zeros((P, E, D // 16), xp.uint8), xp.ones(P, xp.float32))


def padded_call(rng, D, E, P):
    """Keys, slots and the same call without its padding: runs of 1..E keys into distinct
    blocks, with padding keys (slot -1, their values NaN, Inf or huge: never read) before,
    between and after the runs."""
    blocks = rng.permutation(P)[: int(rng.integers(1, P + 1))]
    keys, slots, kept = [], [], []
    for b in blocks:
        for _ in range(int(rng.integers(0, 3))):  # padding before the run
            keys.append(np.full(D, rng.choice([np.nan, np.inf, 3e38]), np.float32))
            slots.append(-1)
        first = int(rng.integers(0, E))
        for e in range(first, first + int(rng.integers(1, E - first + 1))):
            kept.append(len(keys))
            keys.append(rng.standard_normal(D).astype(np.float32) * np.float32(2.0 ** rng.integers(-8, 9)))
            slots.append(int(b) * E + e)
    keys.append(np.full(D, np.nan, np.float32))  # a padded batch's tail
    slots.append(-1)
    keys, slots = np.array(keys), np.array(slots, np.int64)
    return keys, slots, keys[kept], slots[kept]
