"""The one resolution of a job's configuration: raw ``[morph]`` tables + :class:`JobView` ->
frozen :class:`~titan_morph.config.settings.Settings`, every check in one pass."""

from __future__ import annotations

from typing import Any

from titan_morph.config.fields import Layout, parse_field, parse_rank_pairs
from titan_morph.config.rules import check_job, check_joined, check_morph, delay_limit_ms, dp_degree, microbatches
from titan_morph.config.schema import Morph
from titan_morph.config.settings import InjectSettings, JobView, MorphSettings, Settings, SyntheticSettings

__all__ = ["resolve", "resolve_morph"]


def _build(cls: type, parsed: dict[str, Any]) -> Any:
    nested = {"inject": InjectSettings, "synthetic": SyntheticSettings}
    return cls(**{k: _build(nested[k], v) if k in nested else v for k, v in parsed.items()})


def resolve_morph(
    morph: Morph, layout: Layout | None = None, world_size: int | None = None, split: tuple[int, ...] | None = None
) -> MorphSettings:
    """Parse and check ``[morph]`` for a pipeline ``layout`` (None or a part unknown: the checks that
    need it are skipped) and the layer ``split`` of this launch (None: the configured one); raises
    one :class:`ConfigError`."""
    layout = layout or Layout()
    pairs = parse_rank_pairs(morph.inject.rank_links)
    layers = morph.synthetic.layers if isinstance(morph.synthetic.layers, int) and morph.synthetic.layers > 0 else None
    layout = Layout(
        layout.stages,
        layout.delay_limit_ms,
        layout.stages_per_rank,
        pairs=len(pairs) or None,
        layers=layers,
        world=world_size,
    )
    parsed = parse_field("morph", morph, Morph, layout)
    settings: MorphSettings = _build(MorphSettings, {**parsed, "split": split})
    check_morph(settings, layout, world_size)
    return settings


def resolve(morph: Morph, job: JobView) -> Settings:
    """The one resolution of a job's configuration: TorchTitan's sections that titan_morph depends
    on (degrees, counts, ranks), then every ``[morph]`` option against the pipeline, then the rules
    that join the two. Raises one :class:`ConfigError` whose message starts with the key."""
    world = check_job(job)
    n = microbatches(job)
    limit = delay_limit_ms(job)
    stages = job.pipeline_parallel_degree if job.pipeline_parallel_degree > 1 else None
    parsed = resolve_morph(morph, Layout(stages, limit, job.stages_per_rank), world, job.split)
    settings = Settings(parsed, job, world, dp_degree(job), n, limit)
    check_joined(settings.morph, job, n, settings.dp_degree)
    return settings
