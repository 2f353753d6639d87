"""One module per results.json section: TITLE and render(section) -> list[Block]. Torch-free:
a report renders from results.json alone, on a machine without the measuring stack."""

from __future__ import annotations

from types import ModuleType

from dlscope.report.sections import (
    anatomy,
    batches,
    checkpoint,
    ckpt_anatomy,
    dataset,
    distributed,
    doctor,
    environment,
    gpu,
    graph,
    hang,
    iotrace,
    merge,
    model,
    ops,
    phases,
    pipeline,
    profile,
    ranks,
    run,
    rundiff,
    scaling,
    steps,
    sweep,
    top10,
    train,
)

SECTIONS: dict[str, ModuleType] = {
    module.__name__.rsplit(".", 1)[1]: module
    for module in (
        environment,
        dataset,
        model,
        train,
        ranks,
        profile,
        sweep,
        checkpoint,
        ckpt_anatomy,
        ops,
        graph,
        pipeline,
        run,
        steps,
        anatomy,
        gpu,
        batches,
        top10,
        phases,
        distributed,
        scaling,
        iotrace,
        hang,
        merge,
        doctor,
        rundiff,
    )
}
