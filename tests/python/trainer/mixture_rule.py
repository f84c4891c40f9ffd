"""The documented rule of a weighted dataset mixture (text/mixture.h), reimplemented from its
description, and the Batcher's per-epoch permutation (text/batcher.h) it uses."""

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SALT = 0x6D69787475726521
DATASET_SALT = 0xD1B54A32D192ED03


def splitmix64(state: int) -> tuple[int, int]:
    """(new state, output)"""
    state = (state + GOLDEN) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    order = list(range(n))
    if not shuffle or n < 2:
        return order
    state = (seed ^ ((epoch * GOLDEN) & M64)) & M64
    for i in range(n - 1, 0, -1):
        state, x = splitmix64(state)
        j = x % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def mixture_epoch(sizes, weights, seed, epoch, stopping="first_exhausted", shuffle=True):
    """Epoch `epoch`'s document order, as indices into the datasets' concatenation."""
    k = len(sizes)
    offsets, total, cumulative, acc = [], 0, [], 0.0
    for n, w in zip(sizes, weights):
        offsets.append(total)
        total += n
        acc += w
        cumulative.append(acc)
    W = cumulative[-1]
    position, passes, exhausted, order = [0] * k, [0] * k, [False] * k, [None] * k
    state = (seed ^ SALT ^ ((epoch * GOLDEN) & M64)) & M64
    out = []
    while stopping != "all_exhausted" or len(out) < (1 << 26):
        if (all(exhausted) if stopping == "all_exhausted" else any(exhausted)):
            break
        state, x = splitmix64(state)
        t = (x >> 11) * 2.0 ** -53 * W
        i = next((d for d in range(k - 1) if t < cumulative[d]), k - 1)
        if position[i] == 0:
            seed_i = (seed ^ (((i + 1) * DATASET_SALT) & M64)) & M64
            order[i] = epoch_order(sizes[i], seed_i, ((epoch << 32) | passes[i]) & M64, shuffle)
        out.append(offsets[i] + order[i][position[i]])
        position[i] += 1
        if position[i] == sizes[i]:
            position[i] = 0
            passes[i] += 1
            exhausted[i] = True
    return out


if __name__ == "__main__":
    print(mixture_epoch([3, 2], [3.0, 1.0], 42, 0))
    print(mixture_epoch([3, 2], [3.0, 1.0], 42, 1))
    print(mixture_epoch([3, 2], [3.0, 1.0], 42, 0, "all_exhausted"))
    print(mixture_epoch([4, 3], [1.0, 1.0], 7, 0, "all_exhausted", shuffle=False))
