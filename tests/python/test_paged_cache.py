"""flashtq.PagedTurboQuantCache: sequences in shared pages attend as each would in its own TurboQuantCache."""
import random

import pytest
import torch

import flashtq
from conftest import DEVICES
from reference import rel_err


def _twin_caches(device, preset, page_size, seed_value):
    pool = flashtq.PagedTurboQuantCache(1, 2, 64, num_pages=3 * 256 // page_size + 2, page_size=page_size,
                                        config=flashtq.TurboQuantConfig.preset(preset, 64), device=device,
                                        max_sequences=3)
    alone = [flashtq.TurboQuantCache(1, 2, 64, 256, config=flashtq.TurboQuantConfig.preset(preset, 64), device=device)
             for _ in range(2)]
    return pool, alone


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset,page_size", [("default", 64), ("seed", 16)])
def test_sequences_in_pages_attend_as_their_own_caches(device, preset, page_size, seed):
    rng = random.Random(seed)
    pool, alone = _twin_caches(device, preset, page_size, seed)
    pages = [pool.allocate_page() for _ in range(pool.num_pages)]
    rng.shuffle(pages)
    ids = [pool.add_sequence() for _ in range(2)]
    rows = [(torch.randn(1, 200, 2, 64, device=device), torch.randn(1, 200, 2, 64, device=device)) for _ in ids]
    lengths, targets = [0, 0], [150, 97]
    while lengths != targets:  # interleaved chunks, as a serving loop's prefill and decode steps
        for i, s in enumerate(ids):
            n = min(rng.randint(1, 40), targets[i] - lengths[i])
            if n == 0:
                continue
            while len(pool.pages_of(s)) * page_size < lengths[i] + n:
                pool.map_pages(s, [pages.pop()])
            k, v = rows[i][0][:, lengths[i]:lengths[i] + n], rows[i][1][:, lengths[i]:lengths[i] + n]
            pool.append(0, s, k, v)
            alone[i].append(0, k, v)
            lengths[i] += n
    assert [pool.length(0, s) for s in ids] == targets
    for n in (1, 4):
        q = torch.randn(2, n, 4, 64, device=device)
        out = torch.full(q.shape, float("nan"), device=device)  # poisoned
        pool.attend(0, ids, q, out=out)
        for i in range(2):
            want = alone[i].attend(0, q[i:i + 1])
            assert rel_err(out[i:i + 1], want) < (1e-6 if device == "cpu" else 1e-4), (n, i)


def test_forks_share_pages_until_copied_and_mapped_pages_are_not_freed(seed):
    pool = flashtq.PagedTurboQuantCache(1, 2, 64, num_pages=6, page_size=16, config="seed", max_sequences=2)
    a = pool.add_sequence()
    pool.map_pages(a, [pool.allocate_page(), pool.allocate_page()])
    k, v = torch.randn(1, 20, 2, 64), torch.randn(1, 20, 2, 64)
    pool.append(0, a, k, v)
    with pytest.raises(flashtq.FlashTQError) as e:
        pool.free_page(pool.pages_of(a)[0])
    assert e.value.argument == "pages" and "mapped by 1 sequence" in str(e.value)
    b = pool.fork(a)
    assert pool.pages_of(b) == pool.pages_of(a) and pool.length(0, b) == 20
    with pytest.raises(flashtq.FlashTQError) as e:
        pool.append(0, b, k[:, :1], v[:, :1])  # into page 1, which both map
    assert e.value.argument == "pages" and "copy_page" in str(e.value)
    pool.copy_page(b, 1, pool.allocate_page())
    assert pool.pages_of(b)[0] == pool.pages_of(a)[0] and pool.pages_of(b)[1] != pool.pages_of(a)[1]
    pool.append(0, b, k[:, :1], v[:, :1])
    q = torch.randn(2, 1, 4, 64)
    out = pool.attend(0, [a, b], q)
    assert not torch.equal(out[0], out[1])  # b's new row, and a's own
    with pytest.raises(flashtq.FlashTQError) as e:
        pool.add_sequence()
    assert e.value.argument == "sequence"
    with pytest.raises(flashtq.FlashTQError) as e:
        pool.attend(0, [a], q)  # two rows of q, one sequence
    assert e.value.argument == "q"
