"""[morph] partition, [morph.inject] compute_factor, [morph.synthetic] layers and rank_memory_gb:
parsed values, the compute model they build, and one clear error per bad value (before any rank)."""

from __future__ import annotations

import pytest

from tests.launch import DEFAULT_CONFIG, REPO
from titan_morph.config import ConfigError, Inject, Morph, Synthetic, resolve_morph
from titan_morph.config.fields import Layout
from titan_morph.config.links import compute_model, link_model
from titan_morph.config.model import ModelShape, check_split_memory, model_entries
from titan_morph.integration.titan022.jobconfig import load

PARTITION = REPO / "train_configs" / "partition_cpu.toml"


def _morph(**kw) -> Morph:
    inject, synthetic = kw.pop("inject", {}), kw.pop("synthetic", {})
    return Morph(inject=Inject(**inject), synthetic=Synthetic(**synthetic), **kw)


def test_compute_factor_per_rank_and_its_models():
    static = resolve_morph(_morph(inject={"mode": "static", "compute_factor": "1,1,1,2", "start_step": 4}), Layout(4))
    model = compute_model(static.inject, 4)
    assert model is not None and static.inject.compute_factor == (1.0, 1.0, 1.0, 2.0)
    assert model.factors(3) == (1.0,) * 4 and model.factors(4) == (1.0, 1.0, 1.0, 2.0)
    assert link_model(static.inject, 3) is None  # compute only: no link is emulated
    one = resolve_morph(_morph(inject={"mode": "random", "compute_factor": 3, "seed": 7}), Layout(4))
    rand = compute_model(one.inject, 4)
    assert rand is not None and all(1.0 <= f <= 3.0 for s in range(1, 20) for f in rand.factors(s))
    assert rand.factors(5) == compute_model(one.inject, 4).factors(5)  # the same draws on every rank
    assert compute_model(resolve_morph(_morph(), Layout(4)).inject, 4) is None


def test_compute_trace_sets_factors_and_emulates_no_link(tmp_path):
    trace = tmp_path / "compute.csv"
    trace.write_text("step,rank,compute_factor\n3,2,1.5\n6,2,1\n")
    settings = resolve_morph(_morph(inject={"mode": "trace", "trace_file": str(trace)}), Layout(4))
    model = compute_model(settings.inject, 4)
    assert model is not None and [model.factor(2, s) for s in (2, 3, 5, 6)] == [1.0, 1.5, 1.5, 1.0]
    assert link_model(settings.inject, 3) is None


def test_one_trace_file_drives_links_and_ranks(tmp_path):
    trace = tmp_path / "both.csv"
    trace.write_text("step,link,delay_ms,bandwidth_mbit,rank,compute_factor\n4,2,40,,,\n10,2,0,5,,\n7,,,,1,2\n")
    settings = resolve_morph(_morph(inject={"mode": "trace", "trace_file": str(trace)}), Layout(4))
    ranks = compute_model(settings.inject, 4)
    assert ranks is not None and [ranks.factor(1, s) for s in (6, 7)] == [1.0, 2.0]
    links = link_model(settings.inject, 3, message_bytes=64 * 1024)
    assert links is not None and links.delay_ms(2, "fwd", step=5) == 40.0 and links.delay_ms(2, "fwd", step=10) == 0.0
    assert links.transmit_ms(2, "fwd", step=10) > 100.0 > links.transmit_ms(2, "fwd", step=5)  # 64 KiB at 5 Mbit/s
    trace.write_text("step,link,delay_ms,rank,compute_factor\n4,7,40,,\n")
    with pytest.raises(ConfigError, match=r"morph\.inject\.trace_file.*out of range"):
        resolve_morph(_morph(inject={"mode": "trace", "trace_file": str(trace)}), Layout(4))


def test_synthetic_layers_are_timed_per_layer_and_summed_per_stage():
    morph = _morph(synthetic={"enabled": True, "layers": 6, "fwd_ms": "1,2,3,4,5,6", "bwd_ms": 2, "wgt_ms": 1})
    settings = resolve_morph(morph, Layout(3), split=(1, 2, 3))
    assert settings.stage_times(3) == ((1.0, 2.0, 1.0), (5.0, 4.0, 2.0), (15.0, 6.0, 3.0))
    even = resolve_morph(morph, Layout(3))
    assert even.stage_times(3) == ((3.0, 4.0, 2.0), (7.0, 4.0, 2.0), (11.0, 4.0, 2.0))


BAD = [
    ({"inject": {"mode": "static", "compute_factor": "1,0,1,1"}}, "morph.inject.compute_factor", "must be > 0"),
    ({"inject": {"mode": "static", "compute_factor": "1,-2,1,1"}}, "morph.inject.compute_factor", "must be > 0"),
    ({"inject": {"mode": "static", "compute_factor": "1,2"}}, "morph.inject.compute_factor", "needs 1 or 4 values"),
    ({"inject": {"compute_factor": 2}}, "morph.inject.compute_factor", "needs mode = static or random"),
    ({"inject": {"mode": "static", "compute_factor": 0.5}}, "morph.inject.compute_factor", "below 1"),
    ({"synthetic": {"layers": 3}}, "morph.synthetic.layers", ">= the pipeline's stages (4)"),
    ({"synthetic": {"layers": 8, "fwd_ms": "1,2,3"}}, "morph.synthetic.fwd_ms", "needs 1 or 8 values"),
    ({"partition": "sometimes"}, "morph.partition", "is not one of even, auto, manual"),
    ({"rank_memory_gb": "1,2"}, "morph.rank_memory_gb", "needs 1 or 4 values"),
    ({"repartition_after": -1.0}, "morph.repartition_after", ">= 0"),
]


@pytest.mark.parametrize(("kw", "key", "text"), BAD)
def test_bad_values_name_the_key(kw, key, text):
    with pytest.raises(ConfigError) as err:
        resolve_morph(_morph(**kw), Layout(4, 12_500))
    assert str(err.value).startswith(key + ":") and text in str(err.value), str(err.value)


JOB = [
    (("--morph.partition", "manual"), "morph.partition: 'manual' needs a split"),
    (("--morph.partition", "auto"), "needs [checkpoint] enable = true"),
    (
        ("--morph.partition", "auto", "--checkpoint.enable", "--parallelism.pipeline_parallel_schedule", "1F1B"),
        "one stage per rank",
    ),
    (("--parallelism.pipeline_parallel_last_stage_less_layers", "2"), "set morph.partition = manual"),
    (
        ("--morph.rank_memory_gb", "0.003"),
        "morph.rank_memory_gb: [0.003, 0.003, 0.003, 0.003] GB cannot hold the split [1, 2, 2, 1]",
    ),
]


@pytest.mark.parametrize(("args", "text"), JOB)
def test_job_level_partition_errors(args, text):
    with pytest.raises(ConfigError) as err:
        load(DEFAULT_CONFIG, list(args))
    assert text in str(err.value), str(err.value)


def test_manual_split_and_the_partition_config_pass():
    _, manual = load(
        DEFAULT_CONFIG, ["--morph.partition", "manual", "--parallelism.pipeline_parallel_first_stage_less_layers", "0"]
    )
    assert manual.job.split_options == ("pipeline_parallel_first_stage_less_layers",)
    _, auto = load(PARTITION)
    assert auto.morph.partition == "auto" and auto.morph.synthetic.layers == 16
    assert auto.morph.stage_times(4) == ((10.0, 10.0, 10.0),) * 4


def test_a_split_that_does_not_fit_memory_names_the_rank():
    shape = ModelShape(dim=256, layers=6, heads=16, kv_heads=16, ffn=768, vocab=2048, seq_len=128, microbatch=1)
    entries = model_entries(shape)
    per_layer = entries.bytes[1][0]
    assert per_layer == 16 * (256 * 4 * 256 + 3 * 256 * 768 + 2 * 256)
    check_split_memory(entries, (1, 2, 2, 1), [1.0], "PipeMorph", 8)
    with pytest.raises(ConfigError, match="rank 1 cannot hold layers layers.0..layers.4"):
        check_split_memory(entries, (0, 5, 1, 0), [0.07], "PipeMorph", 8)
