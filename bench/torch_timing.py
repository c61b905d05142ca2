"""Timing shared by the PyTorch baselines: median milliseconds of CUDA-event-timed calls after a warm-up."""
import torch


_flush = None


def flush_l2():
    """Overwrites a buffer four times the L2 cache, so that the next call reads its inputs from memory."""
    global _flush
    if _flush is None:
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        _flush = torch.empty(4 * l2, dtype=torch.uint8, device="cuda")
    _flush.add_(1)


def median_ms(fn, repeats=20, cold=False):
    """With cold, each timed call comes after an L2 flush (outside the timed interval): decode rows."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if cold:
            flush_l2()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]
