"""``lstmablate sweep``: every run of a recipe, here or on Slurm."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..console import err, escape, out
from .options import DATA_DIR_HELP, DEVICE_HELP, out_dir_path


SLURM = "Slurm (--launcher slurm)"


def sweep(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="A recipe with `cells` and `seeds`, "
                                 "or a table spec (e.g. table1)."),
    list_only: bool = typer.Option(False, "--list", help="Print one `lstmablate train` command per "
                                   "missing or interrupted run (for any scheduler), run nothing."),
    out_dir: Path = typer.Option("runs", "--out", metavar="DIR", parser=out_dir_path,
                                 help="Root of the runs tree."),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="SECTION.KEY=VALUE",
                                             help="Override for every run (repeatable)."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N",
                                          help="torch CPU threads per run (default: the cores "
                                               "less the machine's load, at least 1, chosen once "
                                               "for every run and divided among the --jobs)."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help=DEVICE_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", metavar="N",
                             help="Runs at once (subprocesses, each logging beside its run)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", metavar="DIR", help=DATA_DIR_HELP),
    status: bool = typer.Option(False, "--status", help="Where each run stands (finished, running, "
                                "queued, interrupted, failed with its log's last lines, missing); "
                                "runs nothing."),
    reuse: Optional[list[str]] = typer.Option(
        None, "--reuse", metavar="DIR",
        help="A runs tree (another sweep's --out, experiments/results) whose finished runs may "
             "stand in for this sweep's: a run trained for another experiment with the same "
             "task, cell, seed, data, model, train and eval settings (its twin) is copied into "
             "the run folder instead of being trained again, with a twin.json naming it "
             "(repeatable). Before --list or a Slurm submission: what is left is what they show."),
    launcher: str = typer.Option("local", "--launcher", metavar="local|slurm",
                                 help="local: run here; slurm: submit one Slurm array job."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script, submit nothing.",
                                 rich_help_panel=SLURM),
    partition: Optional[str] = typer.Option(None, "--partition", rich_help_panel=SLURM,
                                            help="The partition (default: the cluster's)."),
    gpus: Optional[int] = typer.Option(None, "--gpus-per-job", metavar="N", rich_help_panel=SLURM,
                                       help="GPUs of each run (more than 1: torchrun on its node)."),
    cpus: Optional[int] = typer.Option(None, "--cpus-per-job", metavar="N", rich_help_panel=SLURM,
                                       help="CPUs of each run (its torch threads unless --threads)."),
    mem: Optional[str] = typer.Option(None, "--mem", metavar="SIZE", rich_help_panel=SLURM,
                                      help="Memory of each run, as sbatch reads it (16G)."),
    time_limit: Optional[str] = typer.Option(None, "--time", metavar="TIME", rich_help_panel=SLURM,
                                             help="Each job's limit (default 4:00:00); a run that "
                                                  "reaches it is requeued and continues."),
    account: Optional[str] = typer.Option(None, "--account", rich_help_panel=SLURM,
                                          help="The account charged."),
    qos: Optional[str] = typer.Option(None, "--qos", rich_help_panel=SLURM,
                                      help="The quality of service."),
    parallel: Optional[int] = typer.Option(None, "--array-parallelism", metavar="N",
                                           rich_help_panel=SLURM, help="Runs at once at most."),
    slurm_opt: Optional[list[str]] = typer.Option(None, "--slurm-opt", metavar="KEY=VALUE",
                                                  rich_help_panel=SLURM,
                                                  help="Another sbatch option (repeatable)."),
) -> None:
    """Run every (cell, seed) of a recipe that is not finished; resume interrupted ones.

    Running a sweep twice is harmless: finished runs are skipped.  With --launcher slurm the
    runs go to Slurm as one array job; defaults for its options can be kept in
    ~/.config/lstmablate/slurm.yaml (or $LSTMABLATE_SLURM_CONFIG).

    Examples:

    lstmablate sweep dyck-demo
    lstmablate sweep ptb-medium --device cuda --jobs 2
    lstmablate sweep table1 --list
    lstmablate sweep table1 --launcher slurm --device cuda --gpus-per-job 1 --time 12:00:00
    lstmablate sweep table1 --status
    lstmablate sweep simpler-recurrences-ptb-small --reuse runs   # a rate grid's runs stand in
    """
    from ..run import cluster
    from ..run.slurm_options import check_launcher, slurm_options
    from ..errors import UserError
    from ..run.sweep import check_jobs, eval_differs_note, plan_sweep, reuse_twins, run_sweep

    check_jobs(jobs)
    if reuse and (status or dry_run):
        raise UserError(f"--reuse copies runs, and {'--status' if status else '--dry-run'} "
                        "writes nothing: leave one of them out.")
    slurm = {"partition": partition, "gpus_per_job": gpus, "cpus_per_job": cpus, "mem": mem,
             "time": time_limit, "account": account, "qos": qos, "array_parallelism": parallel,
             "slurm_opts": slurm_opt}
    check_launcher(launcher, slurm, dry_run=dry_run, jobs=jobs, runs_nothing=list_only or status)
    # (checked before the sweep is planned: a bad option is refused at once)
    opts = slurm_options(slurm) if launcher == "slurm" and not (list_only or status) else None
    plan = plan_sweep(recipe, out_dir, overrides=set_ or [], threads=threads, device=device,
                      data_dir=data_dir, refuse_conflicts=not status)
    if status:
        cluster.print_status(cluster.sweep_status(plan), out, err)
        return
    if reuse:
        plan = reuse_twins(plan, reuse, err)
    note = eval_differs_note(plan)
    if note:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if list_only:
        missing = [item for item in plan if not item.finished]
        for item in missing:
            out.print(escape(item.command), soft_wrap=True)
        if not missing:
            err.print(f"every run of {escape(recipe)} is finished ({len(plan)} runs under "
                      f"{escape(out_dir)}); `lstmablate report {escape(out_dir)} --table "
                      f"{escape(recipe)}` prints its table.", soft_wrap=True)
        return
    if opts is not None:
        cluster.submit_sweep(plan, recipe, opts, dry_run=dry_run,
                             overrides=set_ or [], console=err, out=out)
        return
    run_sweep(plan, console=err, jobs=jobs)
