"""A measuring command's life in its run folder (`sweep`): the folder's lock, what `--resume`
skips, run.json's `status` (running, interrupted with the points left and the command that
resumes, complete) and the exit code of an interrupt (130 SIGINT, 143 SIGTERM). The rules are
`bench.runstate`'s; this module prints and exits.
"""
from __future__ import annotations

import datetime as _dt
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

import typer


def command_line() -> str:
    """This command as typed (program name 'moda-bench')."""
    return shlex.join(["moda-bench", *sys.argv[1:]])


def resume_command(run_dir: Path, run_dir_given: bool) -> str:
    """The command that continues this run: this one with --resume (and --out when it was defaulted)."""
    args = list(sys.argv[1:])
    if not run_dir_given:
        args += ["--out", str(run_dir)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["moda-bench", *args])


def take_lock(run_dir: Path, dist, console):
    """The run folder's lock (under torchrun, one per rank); exit 2 with one line naming the holder."""
    from moda_bench.bench import runstate
    name = runstate.LOCK_NAME if dist is None else f"{runstate.LOCK_NAME}.rank{dist.rank}"
    lock = runstate.RunLock(run_dir, command_line(), name=name,
                            warn=lambda text: console.print(f"[yellow]warning:[/] {text}", markup=True))
    try:
        return lock.acquire()
    except runstate.LockHeld as err:
        console.print(f"[red]error:[/] {err}", markup=True, highlight=False)
        raise typer.Exit(2)


class Lifecycle:
    """One run's resume plan, run.json status and interrupt handling (see the module docstring)."""

    def __init__(self, run_dir: Path, sweeps, spec, lock, console, *, resume: bool, run_dir_given: bool):
        self.run_dir, self.sweeps, self.spec, self.lock, self.console = Path(run_dir), list(sweeps), spec, lock, console
        self.resume, self.run_dir_given = resume, run_dir_given
        self.done: dict = {}
        self.resumes = 0

    def fail(self, text: str, code: int = 2):
        self.lock.release()
        self.console.print(f"[red]error:[/] {text}", highlight=False)
        raise typer.Exit(code)

    def plan(self, *, gpu_index, pooled: bool, dist, allow_commit_change: bool) -> list:
        """The sweeps with the points still to run (all of them without --resume)."""
        if not self.resume:
            return self.sweeps
        from moda_bench import schema
        from moda_bench.bench import runstate
        from moda_bench.bench import sweep as run
        index = dist.local_rank if dist is not None else gpu_index
        meta = schema.run_metadata(index)
        self.resumes = int(run.read_run_record(self.run_dir).get("resumes", 0) or 0) + 1
        try:
            if dist is not None:   # each rank continues its own shard; the merged CSV is only read
                todo, notes = self._plan_rank(dist, meta, allow_commit_change)
            else:
                todo, notes = run.resume_run(self.sweeps, self.spec, gpu=meta["gpu"], commit=meta["git_commit"],
                                             allow_commit_change=allow_commit_change, pooled=pooled)
        except (runstate.ResumeRefused, ValueError) as err:
            self.fail(str(err))
        for note in notes:
            self.console.print(f"resume: {note}", markup=False, highlight=False)
        if dist is None:
            self.done = {s.name: {runstate.point_key(p) for p in s.points} - {runstate.point_key(p) for p in t.points}
                         for s, t in zip(self.sweeps, todo)}
        total, left = sum(len(s.points) for s in self.sweeps), sum(len(s.points) for s in todo)
        self.console.print(f"resume: {total - left} of {total} point(s) done, {left} to run", highlight=False)
        return todo

    def _plan_rank(self, dist, meta, allow_commit_change):
        from moda_bench.bench import runstate
        from moda_bench.bench.pool.merge import shard_path
        pairs = runstate.expected_pairs(self.spec.providers, self.spec.timer_list())
        notes = []
        for s in self.sweeps:
            found = runstate.resume_sweep(shard_path(s.csv, "rank", dist.rank), s.name, pairs, gpu=meta["gpu"],
                                          commit=meta["git_commit"], allow_commit_change=allow_commit_change)
            _, merged, _, _ = runstate.scan_sweep(s.csv, s.name, pairs)
            self.done[s.name] = found.done | merged
            notes += found.notes
        return self.sweeps, notes

    def record(self) -> dict:
        """run.json fields of a run starting now."""
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        return {"status": "running", "command": command_line(), "resumes": self.resumes, "updated": now,
                "lock": self.lock.info}

    @contextmanager
    def running(self):
        """The run itself: SIGINT/SIGTERM keep the finished rows, mark run.json interrupted with what is
        left, print the resume command and exit 130/143; at the end run.json says complete."""
        from moda_bench.bench import runstate
        from moda_bench.bench import sweep as run
        try:
            with runstate.interrupts():
                yield
                now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
                run.update_run_record(self.run_dir, status="complete", updated=now,
                                      left=run.points_left(self.sweeps, self.spec))
        except KeyboardInterrupt as exc:
            code = runstate.exit_code_of(exc)
            left = run.points_left(self.sweeps, self.spec)
            again = resume_command(self.run_dir, self.run_dir_given)
            now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            fields = dict(status="interrupted", signal=str(exc) or "SIGINT", left=left, resume=again, updated=now)
            if (self.run_dir / run.RUN_RECORD).exists():
                run.update_run_record(self.run_dir, **fields)
            else:   # stopped before its record was written
                from moda_bench import results
                results.write_json_atomic(self.run_dir / run.RUN_RECORD, fields)
            self.lock.release()
            n = sum(left.values())
            self.console.print(f"[yellow]interrupted ({str(exc) or 'SIGINT'})[/]: finished rows kept in "
                               f"{self.run_dir}; {n} point(s) left; resume with:", highlight=False)
            self.console.print(again, markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(code) from None
        except BaseException:
            self.lock.release()
            raise
        self.lock.release()
