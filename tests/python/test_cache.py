"""flashtq.TurboQuantCache: the library's packed cache from Python."""
import pytest
import torch

import flashtq
from reference import attention as oracle
from reference import rel_err


def test_every_named_config_attends_close_to_exact_at_high_bits(seed):
    k, v = torch.randn(1, 64, 2, 64), torch.randn(1, 64, 2, 64)
    q = torch.randn(1, 64, 4, 64)
    exact = oracle(q, k, v, causal=True)[0]
    errors = {}
    for name in flashtq.cache_configs():
        cache = flashtq.TurboQuantCache(1, 2, 64, 64, config=name)
        cache.append(0, k, v)
        out = torch.full(q.shape, float("nan"))  # poisoned: every element must be written
        cache.attend(0, q, 0, out=out)
        assert not out.isnan().any()
        errors[name] = rel_err(out, exact)
    assert errors["k3v4"] < errors["seed"] < 1.0 and errors["k1v2"] > errors["k3v4"]


def test_batched_sequences_keep_their_own_lengths(seed):
    cache = flashtq.TurboQuantCache(2, 1, 32, 16, config="seed", batch_size=2)
    k, v = torch.randn(2, 5, 1, 32), torch.randn(2, 5, 1, 32)
    cache.append(1, k, v)
    cache.append(1, k[:, :2], v[:, :2])
    assert [cache.length(1, b) for b in range(2)] == [7, 7] and cache.length(0) == 0
    out = cache.attend(1, torch.randn(2, 1, 2, 32))  # decode: the last appended position
    assert out.shape == (2, 1, 2, 32) and out.dtype == torch.float32
    single = flashtq.TurboQuantCache(2, 1, 32, 16, config="seed")
    single.append(1, k[1:], v[1:])
    assert (cache.key_words(1, 1)[: 5] == single.key_words(1)[:5]).all()


def test_save_and_load_keep_the_words(tmp_path, seed):
    cache = flashtq.TurboQuantCache(3, 2, 64, 32, config="k3v3")
    cache.append(2, torch.randn(1, 9, 2, 64), torch.randn(1, 9, 2, 64))
    cache.save(tmp_path / "c.ftq")
    again = flashtq.TurboQuantCache.load(tmp_path / "c.ftq")
    assert again.config.key_bits == 3 and again.length(2) == 9
    assert (again.key_words(2) == cache.key_words(2)).all() and (again.value_words(2) == cache.value_words(2)).all()
    q = torch.randn(1, 2, 4, 64)
    assert torch.equal(again.attend(2, q), cache.attend(2, q))


def test_bytes_per_token_is_the_layouts():
    cache = flashtq.TurboQuantCache(2, 4, 128, 8, config="seed")
    assert cache.bytes_per_token() == 2 * 4 * 88  # SPEC §2: 88 bytes per token per kv head at D = 128
    assert abs(cache.compression_vs_bf16() - 512 / 88) < 1e-9


def test_custom_scale_scales_the_queries(seed):
    cache = flashtq.TurboQuantCache(1, 1, 64, 8, config="seed")
    cache.append(0, torch.randn(1, 8, 1, 64), torch.randn(1, 8, 1, 64))
    q = torch.randn(1, 1, 2, 64)
    assert rel_err(cache.attend(0, q, scale=0.25), cache.attend(0, q * (0.25 * 8))) < 1e-6


@pytest.mark.parametrize("make, argument", [
    (lambda: flashtq.TurboQuantCache(1, 1, 48, 8), "head_dim"),
    (lambda: flashtq.TurboQuantCache(1, 1, 64, 8, config="k9v9"), "config"),
    (lambda: flashtq.TurboQuantCache(1, 1, 64, 8, device="tpu"), "device"),
    (lambda: flashtq.TurboQuantCache(0, 1, 64, 8), "layers"),
])
def test_bad_construction_names_the_argument(make, argument):
    with pytest.raises(flashtq.FlashTQError) as e:
        make()
    assert e.value.argument == argument, str(e.value)


def test_full_cache_is_rejected_and_left_unchanged():
    cache = flashtq.TurboQuantCache(1, 1, 32, 4, config="seed")
    cache.append(0, torch.randn(1, 3, 1, 32), torch.randn(1, 3, 1, 32))
    before = cache.key_words(0).copy()
    with pytest.raises(flashtq.FlashTQError):
        cache.append(0, torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32))
    assert (cache.key_words(0) == before).all() and cache.length(0) == 3
    with pytest.raises(flashtq.FlashTQError) as e:
        cache.attend(0, torch.randn(1, 1, 1, 32), start_pos=5)
    assert e.value.argument == "start_pos"


def test_exact_attention_is_asked_for_by_a_bool(seed):
    cache = flashtq.TurboQuantCache(1, 2, 64, 128, config="default")
    k, v, q = torch.randn(1, 40, 2, 64), torch.randn(1, 40, 2, 64), torch.randn(1, 20, 4, 64)
    cache.append(0, k, v)
    fast, exact = cache.attend(0, q), cache.attend(0, q, exact=True)
    assert rel_err(fast, exact) < 1e-2  # docs/spec.md §3: the fast paths within 1e-2 (on cpu both are f32)
    with pytest.raises(flashtq.FlashTQError) as e:
        cache.attend(0, q, exact=1)
    assert e.value.argument == "exact"


def test_softcap_and_sinks_reach_the_packed_attention(seed):
    cache = flashtq.TurboQuantCache(1, 2, 64, 128, config="default")
    k, v, q = torch.randn(1, 100, 2, 64), torch.randn(1, 100, 2, 64), torch.randn(1, 1, 4, 64)
    cache.append(0, k, v)
    plain = cache.attend(0, q)
    # A sink holds weight e^s / (Z + e^s) and no value: out = plain * Z / (Z + e^s) with Z the row's own
    # sum of weights, so two sink logits fix Z from the first and predict the second (SPEC §1.9).
    s1, s2 = torch.tensor([0.5, -1.0, 2.0, 0.0]), torch.tensor([1.5, 0.3, -2.0, 3.0])
    c1 = (cache.attend(0, q, sinks=s1) * plain).sum(-1) / (plain * plain).sum(-1)  # [1, 1, 4]
    z = c1 * s1.exp() / (1 - c1)
    predicted = plain * (z / (z + s2.exp())).unsqueeze(-1)
    assert rel_err(cache.attend(0, q, sinks=s2), predicted) < 1e-4
    assert torch.equal(cache.attend(0, q, sinks=torch.full((4,), float("-inf"))), plain)  # -inf: no sink
    # A cap far above every score changes nothing; a tiny one flattens every score to 0 (SPEC §1.8), as a
    # zero query does.
    assert rel_err(cache.attend(0, q, softcap=1e6), plain) < 1e-5
    assert rel_err(cache.attend(0, q, softcap=1e-4), cache.attend(0, torch.zeros_like(q))) < 1e-3
    for bad, argument in [(dict(softcap=-1.0), "softcap"), (dict(softcap="x"), "softcap"),
                          (dict(sinks=torch.zeros(3)), "sinks"), (dict(sinks=torch.tensor([0, 0, float("nan"), 0])), "sinks")]:
        with pytest.raises(flashtq.FlashTQError) as e:
            cache.attend(0, q, **bad)
        assert e.value.argument == argument


@pytest.mark.parametrize("device", [d for d in __import__("conftest").DEVICES if d != "cpu"] or ["cuda"])
def test_device_cache_matches_the_host_cache(device, seed):
    if not __import__("conftest")._cuda_backend_ready():
        pytest.skip(__import__("conftest").CUDA_REASON)
    k, v, q = torch.randn(2, 40, 2, 128), torch.randn(2, 40, 2, 128), torch.randn(2, 3, 8, 128)
    host = flashtq.TurboQuantCache(1, 2, 128, 64, config="seed", batch_size=2)
    gpu = flashtq.TurboQuantCache(1, 2, 128, 64, config="seed", device=device, batch_size=2)
    host.append(0, k, v)
    gpu.append(0, k.to(device), v.to(device))
    assert rel_err(gpu.attend(0, q.to(device)).cpu(), host.attend(0, q)) <= 1e-2  # SPEC §3 over one packed cache


def test_presets_names_and_the_default():
    assert flashtq.cache.DEFAULT_PRESET == "default" and list(flashtq.presets())[0] == "default"
    d64, d128 = flashtq.TurboQuantConfig.preset("default", head_dim=64), flashtq.TurboQuantConfig.preset("default")
    assert d64 == flashtq.TurboQuantConfig.preset("m3v3ns4w64kg64") and d128 == flashtq.TurboQuantConfig.preset(
        "m3o32x4v3ns4w64kg64vg64")
    assert (d128.key_bits, d128.value_bits, d128.qjl, d128.sink_tokens, d128.recent_tokens, d128.norm_correction,
            d128.key_outliers, d128.key_outlier_bits, d128.key_block, d128.value_block) == \
        (3, 3, False, 4, 64, True, 32, 4, 64, 64)
    assert flashtq.TurboQuantConfig.preset("seed") == flashtq.cache_configs()["seed"]
    spelt = flashtq.TurboQuantConfig.preset("m3v2s2w8")
    assert spelt == flashtq.TurboQuantConfig(3, 2, qjl=False, sink_tokens=2, recent_tokens=8) and spelt.name == "m3v2s2w8"
    assert flashtq.TurboQuantConfig.preset(d128.name) == d128
    cache = flashtq.TurboQuantCache(2, 1, 64, 128)  # the default preset at head_dim 64
    assert cache.config == d64
    assert cache.bytes_per_token() == 2 * 58 and cache.exact_bytes() == 2 * 17408  # docs/turboquant_layout.md
    assert abs(cache.compression_vs_bf16(4096) - 256 * 4096 / (58 * 4096 + 17408)) < 1e-12
    for bad, argument in [(lambda: flashtq.TurboQuantConfig.preset("lossless"), "config"),
                          (lambda: flashtq.TurboQuantCache(1, 1, 64, 16, config="default"), "recent_tokens"),
                          (lambda: flashtq.TurboQuantCache(1, 1, 64, 16, config="m3v2w99"), "recent_tokens"),
                          (lambda: flashtq.TurboQuantCache(1, 1, 64, 64, config="k3v3n"), "norm_correction")]:
        with pytest.raises(flashtq.FlashTQError) as e:
            bad()
        assert e.value.argument == argument


def test_recent_window_cache_takes_timesteps_in_order(seed):
    cache = flashtq.TurboQuantCache(1, 1, 64, 64, config="m4v3s2w8")
    k = torch.randn(1, 5, 1, 64)
    cache.append(0, k, k)
    with pytest.raises(flashtq.FlashTQError) as e:
        cache.append(0, k, k, start_pos=0)
    assert e.value.argument == "start_pos"
    out = cache.attend(0, torch.randn(1, 5, 2, 64))
    assert torch.isfinite(out).all() and cache.length(0) == 5


def test_block_means_by_name_follow_a_drifting_mean(seed):
    # Keys and values whose first 8 channels carry a large offset that turns slowly with the position (post-RoPE
    # keys look so): key and value block means must bring attention closer to exact attention than the same codes
    # without them; the cpu backend writes the oracle's words.
    T = 120
    turn = 0.01 * torch.arange(T, dtype=torch.float32)[None, :, None, None] + 6.28 * torch.rand(1, 1, 2, 8)
    k, v = torch.randn(1, T, 2, 64), torch.randn(1, T, 2, 64)
    k[..., :8] += 6 * torch.cos(turn)
    v[..., :8] += 6 * torch.sin(turn)
    q = torch.randn(1, T, 4, 64)
    exact = oracle(q, k, v, causal=True)[0]
    spelt = flashtq.TurboQuantConfig.preset("m3v3ns4w32kg16vg32")
    assert (spelt.key_block, spelt.value_block, spelt.recent_tokens, spelt.qjl) == (16, 32, 32, False)
    assert spelt.name == "m3v3ns4w32kg16vg32"
    errors = {}
    for name in ("m3v3ns4w32kg16vg32", "m3v3ns4w32"):
        caches = [flashtq.TurboQuantCache(1, 2, 64, 128, config=name, device=d) for d in ("cpu", "reference")]
        outs = []
        for start in range(0, T, 20):  # a recent window: each chunk's queries end the sequence
            for c in caches:
                c.append(0, k[:, start:start + 20], v[:, start:start + 20])
            out = torch.full((1, 20, 4, 64), float("nan"))
            caches[0].attend(0, q[:, start:start + 20], start, out=out)
            outs.append(out)
        assert (caches[0].key_words(0) == caches[1].key_words(0)).all()
        assert (caches[0].value_words(0) == caches[1].value_words(0)).all()
        errors[name] = rel_err(torch.cat(outs, 1), exact)
    assert errors["m3v3ns4w32kg16vg32"] < 0.8 * errors["m3v3ns4w32"], errors
    for bad, argument in (("m3v3ns4w32kg64", "key_block"), ("k3v3s4w32kg16", "key_block"),
                          ("m3v3ns4w32vg12", "value_block")):
        with pytest.raises(flashtq.FlashTQError) as e:
            flashtq.TurboQuantCache(1, 2, 64, 128, config=bad)
        assert e.value.argument == argument, bad


def test_outlier_channels_calibrate_then_attend(seed):
    # Keys whose channels 3, 9, 40 and 41 are loud: calibration must make them outliers (the mask in the key words),
    # and one more bit for the outliers must bring attention closer to exact attention than the plain layout.
    k, v = torch.randn(1, 48, 2, 64), torch.randn(1, 48, 2, 64)
    k[..., [3, 9, 40, 41]] *= 10
    q = torch.randn(1, 48, 4, 64)
    exact = oracle(q, k, v, causal=True)[0]
    spelt = flashtq.TurboQuantConfig.preset("m3o16x4v3n")
    assert (spelt.key_outliers, spelt.key_outlier_bits, spelt.qjl, spelt.norm_correction) == (16, 4, False, True)
    assert spelt.name == "m3o16x4v3n"
    errors = {}
    for name in ("m3o16x4v4n", "m3v4n"):
        cache = flashtq.TurboQuantCache(1, 2, 64, 64, config=name)
        cache.calibrate(0, k)
        cache.append(0, k, v)
        errors[name] = rel_err(cache.attend(0, q, 0), exact)
        if name == "m3o16x4v4n":
            mask = cache.key_words(0)[-4:]  # 2 heads x 2 words, after everything else
            for h in range(2):
                bits = int(mask[2 * h]) | int(mask[2 * h + 1]) << 32
                assert all(bits >> c & 1 for c in (3, 9, 40, 41)) and bin(bits).count("1") == 16
            reference = flashtq.TurboQuantCache(1, 2, 64, 64, config=name, device="reference")
            reference.calibrate(0, k)
            reference.append(0, k, v)
            assert (reference.key_words(0) == cache.key_words(0)).all()
            assert rel_err(reference.attend(0, q, 0), cache.attend(0, q, 0)) < 1e-6
    assert errors["m3o16x4v4n"] < 0.9 * errors["m3v4n"], errors
    with pytest.raises(flashtq.FlashTQError) as e:
        flashtq.TurboQuantCache(1, 2, 64, 64, config="m3o8x4v3")
    assert e.value.argument == "key_outliers"
    cache = flashtq.TurboQuantCache(1, 2, 64, 64, config="m3o16x4v3")
    cache.append(0, k, v)
    with pytest.raises(flashtq.FlashTQError) as e:
        cache.calibrate(0, k)
    assert e.value.argument == "layer"
