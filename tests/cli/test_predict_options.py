"""tftoolkit/cli/predict.py: predict's options, declared once as data, build its parser and fill its inputs."""

import dataclasses

from tftoolkit.cli import build_parser
from tftoolkit.cli import predict as cli_predict
from tftoolkit.planner import plan as planner, predict


def _fields(record):
    return {f.name for f in dataclasses.fields(record)}


def test_every_field_of_the_forecast_inputs_comes_from_an_option_or_is_said_in_the_command():
    options = cli_predict.options()
    scenario = {o.fills["scenario"] for o in options if "scenario" in o.fills}
    plan = {o.fills["plan"] for o in options if "plan" in o.fills}
    # What the commands set in the open: a default that depends on the path, counts from --model, a measured table.
    assert _fields(predict.Scenario) == scenario | {"inter_host", "nics_per_host"}
    assert _fields(planner.Plan) == plan | {"params", "forward_flops", "replica_counts", "allreduce_dtype",
                                           "allreduce_packs", "measured_busbw", "measured_from", "achieved"}
    assert len({o.dest for o in options}) == len(options)  # one declaration per option


def test_a_predict_command_line_becomes_the_scenario_it_names(monkeypatch):
    got = []
    monkeypatch.setattr(predict, "run", lambda run_dir, out, scenario: got.append(scenario) or {})
    monkeypatch.setattr(predict, "forecast_text", lambda result: "")
    args = build_parser("predict").parse_args(
        "predict runs/x --max-replicas 16 --gpus-per-host 4 --interconnect nvlink3,pcie4 --mode strong "
        "--allreduce-dtype bfloat16 --accumulate 2 --straggler 0.1 --host-cores 8".split())
    assert args.func(args) == 0
    assert got == [predict.Scenario(interconnects=("nvlink3", "pcie4"), inter_host="ib200", mode="strong",
                                    max_replicas=16, gpus_per_host=4, nics_per_host=1, allreduce_dtype="bfloat16",
                                    accumulate=2, straggler=0.1, host_cores=8)]
