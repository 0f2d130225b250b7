"""``traceml-ci log --mlflow | --wandb SUMMARY``: log a summary to MLflow or Weights & Biases."""

from __future__ import annotations

import argparse

from traceml_ci.errors import install_hint


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "log",
        help="log a summary to MLflow or Weights & Biases (metrics, diagnoses, the file)",
        description="Log a summary as flat metrics (traceml/step_time/dataloader_pct, ...), its "
        "diagnoses as tags (MLflow) or summary fields (W&B), and the file as an artifact. Needs "
        f"the mlflow or wandb extra: {install_hint('mlflow')} (or the same with wandb).",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--mlflow", action="store_true", help="log a new MLflow run")
    where.add_argument("--wandb", action="store_true", help="log a new W&B run")
    p.add_argument("summary", metavar="SUMMARY")
    p.add_argument("--tracking-uri", metavar="URI",
                   help="MLflow tracking URI (default: MLflow's own, e.g. MLFLOW_TRACKING_URI)")
    p.add_argument("--experiment", metavar="NAME", help="MLflow experiment name")
    p.add_argument("--project", metavar="P", help="W&B project (default: W&B's own)")
    p.add_argument("--run-name", metavar="NAME",
                   help="name of the new run (default: the summary's run name)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from traceml_ci.errors import UsageError
    from traceml_ci.gate import fmt

    if args.wandb and (args.tracking_uri or args.experiment):
        raise UsageError("log: --tracking-uri and --experiment are MLflow's; use --project")
    if args.mlflow and args.project:
        raise UsageError("log: --project is W&B's; use --experiment for MLflow")
    if args.mlflow:
        from traceml_ci.integrations import mlflow

        run_id = mlflow.log_summary(args.summary, tracking_uri=args.tracking_uri,
                                    experiment=args.experiment, run_name=args.run_name)
        sys.stdout.write(f"logged {fmt.plain(args.summary)} to MLflow run {fmt.plain(run_id)}\n")
    else:
        from traceml_ci.integrations import wandb

        run_id = wandb.log_summary(args.summary, project=args.project, run_name=args.run_name)
        sys.stdout.write(f"logged {fmt.plain(args.summary)} to W&B run {fmt.plain(run_id)}\n")
    return 0
