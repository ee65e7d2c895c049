"""The report: read sweep folders and run directories, build tidy frames and tables, draw the figures.

    from tftoolkit.experiments.report import figures, results, tables
    res = results.load(["runs/demo/scaling", "runs/demo/batch_lr"])
    tables.overview(res)                               # every sweep point: what varied, status, images/sec, ...
    tables.save_tables(res, "out")                     # runs.csv, points.csv (every column), scaling.csv
    figures.figure(res, "throughput", "out/figures")   # a Figure (also saved as PNG + SVG), or None

    results   reads the folders into ``Results``, and picks the runs each study compares (scaling, batch/LR)
    figures   one function per figure, each with its caption
    tables    the overview, points.csv, runs.csv, scaling.csv, what each point recorded
    sections  the report's sections shown in a notebook (IPython)
    header    its opening lines: what was measured, on which devices and machine, when, by which toolkit version

Only files are read (results.csv, summary.json, config.json, steps.csv, evals.csv, scaling.csv, allreduce.csv,
monitor.csv): no TensorFlow, so a report renders on a laptop from results copied off a GPU server.
"""
