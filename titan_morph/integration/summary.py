"""The end-of-run summary of a titan_morph schedule's last stage
(:func:`titan_morph.runtime.summary.summary_lines`), simulated under the delays the job had."""

from __future__ import annotations

from titan_morph.comm.emulator import collectives
from titan_morph.config import Settings
from titan_morph.config.links import link_model
from titan_morph.integration.plans import cost_model
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.runtime.schedule import MorphSchedule
from titan_morph.runtime.summary import summary_lines

__all__ = ["job_links", "run_summary"]


def job_links(settings: Settings, schedule: MorphSchedule) -> LinkModel | None:
    """The injected delays the job had: this rank's transport's, except with TP and ``rank_links``,
    where each lane's pipeline sees its own host pairs: then each link's slowest lane (the step
    waits for it; lanes are the exchange's pp x tp group, stage-major, lanes innermost)."""
    inject, exchange = settings.morph.inject, schedule.exchange
    if not inject.rank_links or exchange is None or exchange.lanes == 1:
        return schedule.transport.links
    ranks = exchange.row_ranks
    rows = [collectives.hosts(ranks[lane :: exchange.lanes]) for lane in range(exchange.lanes)]
    return link_model(inject, len(rows[0]) - 1, hosts=rows)


def run_summary(settings: Settings, schedule: object) -> list[str]:
    """The end-of-run summary lines of a titan_morph schedule's last stage (else none): step time
    before / during / after the injected straggler (or the steps the monitor held a link slow), and
    ZB-H2 simulated under the same delays with the configured stage times, or the measured ones."""
    if not isinstance(schedule, MorphSchedule) or not schedule.is_last_stage or not schedule.history:
        return []
    schedule.settle_costs()  # the last step's straggler costs, if still due
    morph = settings.morph
    plan_model = schedule.plan.model
    stages = plan_model.stages
    times = morph.stage_times(stages) or (schedule.monitor.times.times() if schedule.monitor is not None else None)
    if times is None:
        return []
    model = cost_model(
        morph, stages, plan_model.microbatches, memory=False, times=times, stages_per_rank=plan_model.stages_per_rank
    )
    return summary_lines(
        schedule.history,
        model=model,
        links=job_links(settings, schedule),
        depth=morph.link_queue_depth,
        decisions=schedule.monitor.decisions if schedule.monitor is not None else 0,
        schedule=settings.job.schedule,
        replans=schedule.monitor.replans if schedule.monitor is not None else None,
    )
