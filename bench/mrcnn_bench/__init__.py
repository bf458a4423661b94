"""Benchmark harness for the static Mask R-CNN: cases -> runner -> records -> store -> report -> gate.

Modules, each importing only those above it (no cycles):

    defaults                      what a command does by default and its --help says (stdlib only)
    timing                        the one clock and interleaving loop: every timed call (stdlib only)
    backends, stats, parity       devices and compile counters; the latency rule; detection parity
    cases                         Case, Workload, Variant, Row: what to run
    slowdown                      the harness-side slowdown hook (latency-gate tests)
    context                       Context: images, weights, training samples of a run
    pipelines                     Pipeline, and PIPELINES: one builder per compiler, by name
    execution, worker             a row in this process or in a bounded worker subprocess
    probes, profile, ceiling      kernel rates, FLOPs, machine state; stage timings; the FMA ceiling
    records, store, report        typed records and run files; tables, plots; dashboard
    journal                       the rounds of a run as they finish (SIGTERM, --resume)
    runner                        the interleaved run loop (RunOptions -> RunOutput)
    ab, compile_probe, gate       compare A B (CompareOptions); the merge gate (GateOptions)
    benchmark_db, inventory       records for PyTorch's benchmark database (v3); what `list` shows
    cli                           ``mrcnn-bench``: the only module that reads argv
    ruler, interleaved            the history across commits: a fixed torchvision ruler; one case timed against it
    fixed_accuracy, history       the fixed checkpoint's AP; one commit measured, each part in its own process
    npm_registry, offline_html    asv's published pages made to load with no network (npm-vendored scripts)
    asv_machine, aa_spread        asv's machine name; the A/A spread of one commit measured N times
    scratch_range                 the deterministic scratch commit range with its injected regressions
    changepoints, history_series, steps
                                  change points (Apache Otava, in its own environment: otava_bridge) of
                                  per-commit series from asv's results or a CSV; ``mrcnn-bench steps``
    asv_results_table, asv_regressions, screenshots
                                  the tools over asv's output: tables, flags, dashboard screenshots

Study logic that tests check lives here too, each study's script in ``bench/studies/`` a thin command
line over it: live_error_rates, stored_false_alarms, order_effect (the latency gate's error rates);
subnormal_steps (training steps with subnormals flushed or kept); padding_inputs (the photographs).

asv (``bench/asv_suite``, over :mod:`mrcnn_bench.history`) and pytest-benchmark
(``bench/pytest_suite``) are thin front ends over :mod:`mrcnn_bench.cases` and :mod:`mrcnn_bench.pipelines`.
"""
