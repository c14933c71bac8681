"""titan_morph's jobs for TorchTitan 0.3.0: one config function per shipped TOML of 0.2.2.

0.3.0 has no TOML: ``--module titan_morph.configs --config <fn>`` picks a function here, which
returns a ``MorphTrainer.Config`` (TorchTitan's ``Trainer.Config`` plus the ``morph`` field), and
``--section.key value`` overrides it, the ``--morph.*`` options included, with the same names as
the ``[morph]`` table of 0.2.2::

    TORCHTITAN=0.3.0 ./run_train.sh                                  # debug_cpu, 4 ranks
    TORCHTITAN=0.3.0 CONFIG=straggler_demo_cpu ./run_train.sh --training.steps 12

=====================  ===================================  ====================================
function               0.2.2 TOML                           job
=====================  ===================================  ====================================
``debug_cpu``          train_configs/debug_cpu.toml         llama3 debug model, PP=4, PipeMorph
``straggler_demo_cpu`` train_configs/straggler_demo_cpu.toml 60 ms on link 2-3, steps 6-15
``synthetic_cpu``      train_configs/synthetic_cpu.toml     synthetic testbed, F=B=W=10 ms
``adapt_cpu``          train_configs/adapt_cpu.toml         live adaptation, steps 5-14
``hybrid_cpu``         train_configs/hybrid_cpu.toml        DP x PP: PP=2 x FSDP=2
``partition_cpu``      train_configs/partition_cpu.toml     rank 3 twice as slow, partition auto
``tp_pp_cpu``          train_configs/tp_pp_cpu.toml         llama3 debug model, TP=2 x PP=2
=====================  ===================================  ====================================

The llama3 debug model is 0.3.0's own (flex attention, fused QKV, its initialisation), so its
losses differ from 0.2.2's; schedules and transports agree with each other within one release.
Importing this module loads TorchTitan (adapted to CPU first where CUDA is absent).
"""

from __future__ import annotations

from dataclasses import replace

from titan_morph.integration.titan03.cpu import adapt

adapt()  # before torchtitan loads (no-op with CUDA)

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.loss import CrossEntropyLoss  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan.components.validate import Validator  # noqa: E402
from torchtitan.config import CommConfig, CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # noqa: E402

from titan_morph.config.schema import Inject, Morph, Synthetic  # noqa: E402
from titan_morph.integration.data import DATASET_NAME, TOKENIZER_DIR  # noqa: E402
from titan_morph.integration.titan03.metrics import MorphMetrics  # noqa: E402
from titan_morph.integration.titan03.model_spec import morph_model_spec  # noqa: E402
from titan_morph.integration.titan03.synthetic import FLAVOR as SYNTHETIC  # noqa: E402
from titan_morph.integration.titan03.synthetic import VOCAB  # noqa: E402
from titan_morph.integration.titan03.trainer import MorphTrainer  # noqa: E402

__all__ = [
    "adapt_cpu",
    "debug_cpu",
    "hybrid_cpu",
    "partition_cpu",
    "straggler_demo_cpu",
    "synthetic_cpu",
    "tp_pp_cpu",
]

_SEED = 42


def _job(
    *,
    folder: str,
    flavor: str,
    local_batch_size: int,
    seq_len: int,
    steps: int,
    parallelism: ParallelismConfig,
    morph: Morph,
    lr_decay: bool = False,
) -> MorphTrainer.Config:
    """The settings every shipped job shares (CPU, float32, no checkpoint, no compile, no AC)."""
    spec = morph_model_spec("debugmodel")
    if flavor == SYNTHETIC:
        spec.flavor = SYNTHETIC  # the trainer sizes the model from morph.synthetic
    scheduler = (
        LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.1)
        if lr_decay
        else LRSchedulersContainer.Config(warmup_steps=2)
    )
    optimizer = default_adamw(lr=8e-4)
    optimizer.implementation = "foreach"
    return MorphTrainer.Config(
        model_spec=spec,
        hf_assets_path=str(TOKENIZER_DIR),
        dump_folder=f"./outputs/{folder}/{{run_id}}",
        tokenizer=HuggingFaceTokenizer.Config(),
        dataloader=HuggingFaceTextDataLoader.Config(dataset=DATASET_NAME),
        loss=CrossEntropyLoss.Config(global_vocab_size=VOCAB),
        optimizer=optimizer,
        lr_scheduler=scheduler,
        metrics=MorphMetrics.Config(
            log_freq=1, enable_tensorboard=True, save_tb_folder="tb", disable_color_printing=True
        ),
        training=TrainingConfig(
            local_batch_size=local_batch_size,
            seq_len=seq_len,
            max_norm=1.0,
            steps=steps,
            dtype="float32",
            disable_cuda_graphs=True,
        ),
        parallelism=parallelism,
        checkpoint=CheckpointManager.Config(enable=False, initial_load_model_only=False),
        activation_checkpoint=None,
        compile=CompileConfig(enable=False),
        comm=CommConfig(),
        validator=Validator.Config(enable=False),
        debug=DebugConfig(seed=_SEED, save_config_file="config.json"),
        morph=morph,
    )


def _pp(degree: int = 4, schedule: str = "PipeMorph", shard: int = 1, tp: int = 1) -> ParallelismConfig:
    return ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=shard,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=degree,
        pipeline_parallel_schedule=schedule,
        pipeline_parallel_microbatch_size=1,
    )


def _testbed() -> Synthetic:
    return Synthetic(enabled=True, fwd_ms=[10.0], bwd_ms=[10.0], wgt_ms=[10.0], hidden=64)


def debug_cpu() -> MorphTrainer.Config:
    """The default job: llama3 debug model, 4 pipeline stages over gloo on CPU, PipeMorph with the
    ``auto`` transport (a link detected slow moves to the delegates) and live re-planning."""
    return _job(
        folder="debug_cpu",
        flavor="debugmodel",
        local_batch_size=8,
        seq_len=128,
        steps=10,
        parallelism=_pp(),
        morph=Morph(memory_budget=0, transport="auto", monitor=True, adapt=True, detect_min_ms=10.0),
        lr_decay=True,
    )


def tp_pp_cpu() -> MorphTrainer.Config:
    """TP 2 x PP 2: the llama3 debug model, each of 2 stages on 2 tensor-parallel ranks (2 lanes per
    pipeline link, whose decisions are taken together), PipeMorph as in ``debug_cpu``."""
    config = debug_cpu()
    config.dump_folder = "./outputs/tp_pp_cpu/{run_id}"
    config.parallelism = _pp(2, tp=2)
    return config


def _synthetic_morph() -> Morph:
    """The ``morph`` options every synthetic job starts from; each job replaces some."""
    return Morph(memory_budget=7, transport="auto", link_queue_depth=2, detect_min_ms=10.0, synthetic=_testbed())


def _synthetic_job(
    folder: str, steps: int, morph: Morph, parallelism: ParallelismConfig | None = None
) -> MorphTrainer.Config:
    """A job on the synthetic testbed (N=24, sequence 16): the jobs differ only in folder, steps,
    parallelism and ``morph`` (:func:`_synthetic_morph` with some options replaced)."""
    return _job(
        folder=folder,
        flavor=SYNTHETIC,
        local_batch_size=24,
        seq_len=16,
        steps=steps,
        parallelism=parallelism or _pp(),
        morph=morph,
    )


def _straggler(start_step: int, end_step: int) -> Morph:
    """The synthetic jobs' ``morph`` with a 60 ms straggler on link 2-3 during the steps given,
    searched and re-planned (3 slow steps to detect, 5 fast ones to recover)."""
    return replace(
        _synthetic_morph(),
        search=True,
        detect_consecutive=3,
        recover_consecutive=5,
        inject=Inject(mode="static", delays_ms=[0.0, 0.0, 60.0], start_step=start_step, end_step=end_step),
    )


def straggler_demo_cpu() -> MorphTrainer.Config:
    """The straggler demo: synthetic testbed (N=24, F=B=W=10 ms), link 2-3 slow (60 ms per message)
    during steps 6-15: detection, re-plan, delegation, recovery, then the run summary."""
    return _synthetic_job("straggler_demo", 26, _straggler(6, 15))


def synthetic_cpu() -> MorphTrainer.Config:
    """The synthetic testbed: PP=4, N=24, F=B=W=10 ms per microbatch, the default transport."""
    return _synthetic_job("synthetic_cpu", 12, replace(_synthetic_morph(), transport="default"))


def adapt_cpu() -> MorphTrainer.Config:
    """Live adaptation: 60 ms on link 2-3 during steps 5-14 on the synthetic testbed."""
    return _synthetic_job("adapt_cpu", 24, _straggler(5, 14))


def hybrid_cpu() -> MorphTrainer.Config:
    """DP x PP: PP=2 x FSDP=2 on the synthetic testbed; a slow DP pair may move onto a pipeline link
    (orchestrator ``pp``), through a checkpoint and a relaunch."""
    morph = replace(_synthetic_morph(), memory_budget=4, orchestrator="pp")
    config = _synthetic_job("hybrid_cpu", 12, morph, _pp(2, shard=2))
    config.training.mixed_precision_param = "float32"
    config.checkpoint = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=1000, last_save_model_only=True, initial_load_model_only=False
    )
    return config


def partition_cpu() -> MorphTrainer.Config:
    """Compute stragglers and ``partition = "auto"``: the synthetic model with 16 layers of F = B = W
    = 2.5 ms, rank 3 twice as slow from step 4; the layers move off it through a checkpoint and a
    relaunch once the time the even split loses exceeds the relaunch cost."""
    layer = [2.5]
    morph = replace(
        _synthetic_morph(),
        transport="default",
        partition="auto",
        profile_steps=2,
        synthetic=Synthetic(enabled=True, layers=16, fwd_ms=layer, bwd_ms=layer, wgt_ms=layer, hidden=64),
        inject=Inject(mode="static", compute_factor=[1.0, 1.0, 1.0, 2.0], start_step=4),
    )
    config = _synthetic_job("partition_cpu", 140, morph)  # the ski rental pays a ~20 s relaunch back
    config.checkpoint = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=100000, keep_latest_k=2, initial_load_model_only=False
    )
    return config
