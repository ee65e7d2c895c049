"""Experiments: many runs, and what they show.

    notebook     the small helpers the notebooks call (parameters, smoke mode, working directory)
    scale        one training per replica count -> scaling.csv
    grid         a grid of configs in this process -> results.csv
    sweep/       a notebook over a parameter grid with papermill, one process per point (local or Slurm)
    report/      reads run and sweep folders (files only, no TensorFlow) -> figures and tables
    findings     what the results show, in sentences: the opening block of a report
    demo         the main job: data, the scaling and batch/LR sweeps, the report
"""
