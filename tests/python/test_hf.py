"""transformers integration: attn_implementation="flashtq" and flashtq.hf.TurboQuantCache on tiny models."""
import pytest
import torch

import flashtq
import flashtq.hf
from flashtq import _flashtq as ext
from reference import rel_err
from tiny_models import gemma3, llama


def generate(model, ids, impl, **kwargs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                              pad_token_id=0, **kwargs)


@pytest.mark.parametrize("build", [llama, gemma3], ids=["llama", "gemma3"])
def test_flashtq_generates_the_same_tokens_as_eager(build, seed):
    model = build(seed)
    ids = torch.randint(0, 256, (2, 20))  # longer than gemma3's sliding window of 8
    assert torch.equal(generate(model, ids, "flashtq"), generate(model, ids, "eager"))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        want = model(ids).logits
        model.set_attn_implementation("flashtq")
        got = model(ids).logits
    assert rel_err(got, want) <= 1e-5


def test_padded_batch_goes_through_a_materialised_mask(seed):
    model = llama(seed)
    ids = torch.randint(1, 256, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of the first row
    with torch.no_grad():
        model.set_attn_implementation("eager")
        want = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("flashtq")
        got = model(ids, attention_mask=mask).logits
    assert rel_err(got[0, 4:], want[0, 4:]) <= 1e-5 and rel_err(got[1], want[1]) <= 1e-5


def _capture_cpp_reference(model, layers: int, cache_config):
    """An attention function that attends each layer's full keys and values through a raw C++ cache of the
    binding (fresh per call): what the library computes from its packed words without flashtq.hf in between."""
    calls = []

    def attend(module, query, key, value, attention_mask, scaling=None, sliding_window=None, **kwargs):
        B, H, n, D = query.shape
        Hkv, T = key.shape[1], key.shape[2]
        outs = []
        for b in range(B):
            cpp = ext.TqKvCache(layers, Hkv, D, T, cache_config.key_bits, cache_config.value_bits, cache_config.seed,
                                "cpu")
            k = key[b:b + 1].transpose(1, 2).contiguous()
            v = value[b:b + 1].transpose(1, 2).contiguous()
            cpp.append(module.layer_idx, flashtq._tensors.view(k, "k"), flashtq._tensors.view(v, "v"), 0)
            q = (query[b:b + 1].transpose(1, 2) * (scaling * D ** 0.5)).contiguous()
            out = torch.empty(1, n, H, D)
            cpp.attend(module.layer_idx, flashtq._tensors.view(q, "q"), T - n, flashtq._tensors.view(out, "out"), 0)
            outs.append(out)
            calls.append((module.layer_idx, b, bytes(cpp.key_words(module.layer_idx)),
                          bytes(cpp.value_words(module.layer_idx))))
        return torch.cat(outs).to(query.dtype), None

    return attend, calls


@pytest.mark.parametrize("build", [llama, gemma3], ids=["llama", "gemma3"])
@pytest.mark.parametrize("config", ["seed", "k3v4"])
def test_turboquant_cache_gives_the_cpp_caches_logits(build, config, seed):
    model = build(seed, **({"sliding_window": 64} if build is gemma3 else {}))  # window wider than the prompt
    ids = torch.randint(0, 256, (2, 16))
    nxt = torch.randint(0, 256, (2, 1))
    cfg = flashtq.cache.resolve_config(config)
    layers = model.config.num_hidden_layers
    # Through flashtq.hf: prefill, then one decode step, all from the packed words.
    model.set_attn_implementation("flashtq")
    cache = flashtq.hf.TurboQuantCache(model.config, config, max_length=17)
    with torch.no_grad():
        got = [model(ids, past_key_values=cache).logits, model(nxt, past_key_values=cache).logits]
    # The same through raw C++ caches built from the full dense keys and values (DynamicCache keeps them).
    from transformers import AttentionInterface, DynamicCache

    attend, calls = _capture_cpp_reference(model, layers, cfg)
    AttentionInterface.register("cpp_tq_reference", attend)
    model.set_attn_implementation("cpp_tq_reference")
    dense = DynamicCache()
    with torch.no_grad():
        want = [model(ids, past_key_values=dense).logits, model(nxt, past_key_values=dense).logits]
    for g, w in zip(got, want):
        assert torch.equal(g, w), rel_err(g, w)
    # and the packed words are the same
    for layer, b, kw, vw in calls[-2 * layers:]:  # the decode step saw all 17 tokens
        assert kw == bytes(cache.packed.key_words(layer, b)), (layer, b)
        assert vw == bytes(cache.packed.value_words(layer, b)), (layer, b)


def test_turboquant_cache_generates_and_counts_bytes(seed):
    model = llama(seed)
    model.set_attn_implementation("flashtq")
    # Not 0, the pad token: generate() would mask a 0 in the prompt out as padding (it did for seed 692776406).
    ids = torch.randint(1, 256, (1, 10))
    cache = flashtq.hf.TurboQuantCache(model.config, "k3v4", max_length=32)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, past_key_values=cache, pad_token_id=0)
    assert out.shape == (1, 18) and cache.get_seq_length() == 17
    # 3 layers x 2 kv heads x (keys 32*3/32 + 1 + 1 words, values 32*4/32 + 1 words) x 4 bytes
    assert cache.bytes_per_token() == 3 * 2 * 4 * ((3 + 1 + 1) + (4 + 1))
    # Before anything is appended too, for a layout with exact tokens and block means (docs/turboquant_layout.md:
    # keys 3 + 1 words, values 3 + 1 words, means 2 * 32 / 16 and 2 * 32 / 32 bytes, per layer and kv head).
    fresh = flashtq.hf.TurboQuantCache(model.config, "m3v3ns4w32kg16vg32", max_length=64)
    assert fresh.bytes_per_token() == 3 * 2 * (4 * ((3 + 1) + (3 + 1)) + 4 + 2)


def test_sliding_window_layers_through_the_packed_cache(seed):
    model = gemma3(seed, sliding_window=8)
    model.set_attn_implementation("flashtq")
    ids = torch.randint(0, 256, (1, 20))
    cache = flashtq.hf.TurboQuantCache(model.config, "seed", max_length=32)
    with torch.no_grad():
        logits = model(ids, past_key_values=cache).logits
    assert torch.isfinite(logits).all()


def test_cache_refuses_other_attention_implementations(seed):
    model = llama(seed)
    model.set_attn_implementation("eager")
    cache = flashtq.hf.TurboQuantCache(model.config, "seed", max_length=32)
    with pytest.raises(flashtq.FlashTQError) as e:
        with torch.no_grad():
            model(torch.randint(0, 256, (1, 4)), past_key_values=cache)
    assert e.value.argument == "attn_implementation"


@pytest.mark.parametrize("build", [llama, gemma3], ids=["llama", "gemma3"])
def test_exact_tokens_covering_the_sequence_give_exact_attention(build, seed):
    """Sink and recent tokens that cover every token make the packed cache's attention exact attention (over bf16
    copies), chunk after chunk; the same codes without them are measurably further off."""
    model = build(seed)
    ids = torch.randint(0, 256, (1, 20))
    model.set_attn_implementation("flashtq")
    with torch.no_grad():
        want = model(ids).logits
        exact = flashtq.hf.TurboQuantCache(model.config, flashtq.TurboQuantConfig(2, 2, qjl=False, sink_tokens=4,
                                                                                   recent_tokens=16), max_length=24)
        got = torch.cat([model(ids[:, i:i + 4], past_key_values=exact).logits for i in range(0, 20, 4)], 1)
        codes = flashtq.hf.TurboQuantCache(model.config, "m2v2", max_length=24)
        far = torch.cat([model(ids[:, i:i + 4], past_key_values=codes).logits for i in range(0, 20, 4)], 1)
    assert rel_err(got, want) <= 1e-2
    assert rel_err(far, want) > 2 * rel_err(got, want)


def test_outlier_channels_calibrate_on_the_prompt_or_on_given_keys(seed):
    from flashtq.hf.cache import calibration_keys

    def outliers(keys, head):  # the 16 channels of largest energy, as calibrate() chooses them
        energy = keys[0, head].double().pow(2).sum(0)
        return sorted(sorted(range(32), key=lambda c: (-float(energy[c]), c))[:16])

    def mask(cache, layer, head):  # the channels a layer's mask marks (after every other key word)
        word = int(cache.packed.key_words(layer)[-2 + head])
        return [c for c in range(32) if word >> c & 1]

    model = llama(seed)
    model.set_attn_implementation("flashtq")
    ids, other = torch.randint(1, 256, (1, 24)), torch.randint(1, 256, (1, 40))
    with torch.no_grad():
        exact = model(ids).logits
        # On the prompt: each layer's first keys (what update() receives) choose its outliers.
        cache = flashtq.hf.TurboQuantCache(model.config, "m3o16x4v3n", max_length=24)
        got = model(ids, past_key_values=cache).logits
        # Given: keys recorded from another text with exact attention choose them.
        keys = calibration_keys(model, other)
        given = flashtq.hf.TurboQuantCache(model.config, "m3o16x4v3n", max_length=24, calibration=keys)
        model(ids, past_key_values=given)
        prompt_keys = calibration_keys(model, ids)
    assert len(keys) == 3 and keys[0].shape == (1, 2, 40, 32)
    assert rel_err(got, exact) < 0.5
    for head in range(2):
        # layer 0's keys do not depend on attention, so the prompt's exact keys are the ones the cache saw
        assert mask(cache, 0, head) == outliers(prompt_keys[0], head)
        for layer in range(3):
            assert mask(given, layer, head) == outliers(keys[layer], head), (layer, head)
    with pytest.raises(flashtq.FlashTQError) as e:
        flashtq.hf.TurboQuantCache(model.config, "m3o16x4v3n", calibration=keys[:2])
    assert e.value.argument == "calibration"
