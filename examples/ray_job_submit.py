"""Run a ``lab ... --name RUN`` command as a Ray job on a running Ray cluster, submitted again while it exits 75.

    python examples/ray_job_submit.py --address http://HEAD_IP:8265 -- \\
        lab specs/benchmark/cartpole.json ppo_cartpole train --name ppo-cartpole-1 --data-dir s3://my-bucket/lab

``ray job submit`` itself cannot drive this: it exits 1 when the job FAILED, whatever the entrypoint's exit code,
and 0 both when the job SUCCEEDED and when it was STOPPED (``ray job stop``). This script asks the Ray Jobs API for
the job's status and the entrypoint's own exit code (``driver_exit_code``) instead, and:

- SUCCEEDED (the lab exited 0): exits 0;
- FAILED with the lab's exit code 75 (interrupted, resumable): submits the same command again after ``--delay``
  seconds (the ``--name`` run resumes from its checkpoints), up to ``--attempts`` submissions, then exits 75;
- FAILED with exit code 1 (a session failed) or 2 (bad input): not submitted again, exits with that code;
- FAILED without an exit code of the lab (its process was killed, or the job never started): exits 1, not
  submitted again;
- STOPPED (someone ran ``ray job stop``): not submitted again, exits 75 (the run is resumable: run this again).

``ray job stop`` sends SIGTERM to the entrypoint and SIGKILL ``RAY_JOB_STOP_WAIT_TIME_S`` later (3 s by default in
Ray, too short for a final checkpoint); each submission here sets it to ``--stop-wait`` (default 60 s) through the
job's runtime environment. The data dir must be reachable from the cluster (s3://, gs:// or a shared disk).
Stopping this script does not stop the job (as with ``ray job submit``): use ``ray job stop``.
Exit codes of this script: those of the lab (0, 1, 2, 75).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time

EXIT_RESUMABLE = 75


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Options, then ``--`` and the lab command."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None, help="the Ray dashboard's address (default: RAY_ADDRESS)")
    parser.add_argument("--working-dir", default=None, help="uploaded to the cluster as the job's working dir")
    parser.add_argument("--attempts", type=int, default=20, help="most submissions (default 20)")
    parser.add_argument("--delay", type=float, default=30.0, help="seconds before a resubmission (default 30)")
    parser.add_argument("--stop-wait", type=int, default=60,
                        help="seconds `ray job stop` waits between SIGTERM and SIGKILL (default 60)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- lab SPEC_FILE SPEC_NAME MODE --name RUN ...")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the lab command after --")
    return args


async def print_logs(client, job_id: str) -> None:
    """Print the job's output as it comes, until the job ends (a lost log stream is reported, not fatal: the job
    runs on in the cluster and its status is still asked for)."""
    try:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)
    except Exception as exc:  # noqa: BLE001 - the dashboard's log stream dropped
        print(f"lost the log stream of job {job_id} ({exc}); waiting for its status", file=sys.stderr, flush=True)


def run_once(client, args: argparse.Namespace) -> tuple[str, int | None]:
    """Submit the command once and wait for it; returns (the job's final status name, the lab's exit code or
    None when it has none)."""
    runtime_env: dict = {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(args.stop_wait)}}
    if args.working_dir:
        runtime_env["working_dir"] = args.working_dir
    job_id = client.submit_job(entrypoint=shlex.join(args.command), runtime_env=runtime_env)
    print(f"submitted Ray job {job_id}: {shlex.join(args.command)}", flush=True)
    asyncio.run(print_logs(client, job_id))
    failures = 0
    while True:  # the log stream can end a moment before the status is final
        try:
            info = client.get_job_info(job_id)
        except Exception:  # noqa: BLE001 - the dashboard did not answer: ask again, give up after 5 minutes
            failures += 1
            if failures > 60:
                raise
            time.sleep(5)
            continue
        failures = 0
        if info.status.is_terminal():
            return info.status.name, info.driver_exit_code
        time.sleep(1)


def exit_code(status: str, driver_exit_code: int | None) -> int | None:
    """This script's exit code for a job that ended so; None: submit again."""
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        print("the job was stopped (ray job stop): not submitted again; the run is resumable, run this again",
              file=sys.stderr)
        return EXIT_RESUMABLE
    if driver_exit_code == EXIT_RESUMABLE:
        return None
    if driver_exit_code in (1, 2):
        return driver_exit_code
    print(f"the job failed without an exit code of the lab ({driver_exit_code}): not submitted again",
          file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Submit until the lab's exit code says to stop (module docstring); returns that code."""
    from ray.job_submission import JobSubmissionClient

    args = parse_args(sys.argv[1:] if argv is None else argv)
    client = JobSubmissionClient(args.address)
    for attempt in range(1, args.attempts + 1):
        status, driver_exit_code = run_once(client, args)
        code = exit_code(status, driver_exit_code)
        if code is not None:
            return code
        if attempt < args.attempts:
            print(f"the lab exited 75 (interrupted, resumable): submitting the same command again in {args.delay} s",
                  file=sys.stderr, flush=True)
            time.sleep(args.delay)
    print(f"still interrupted after {args.attempts} submissions", file=sys.stderr)
    return EXIT_RESUMABLE


if __name__ == "__main__":
    sys.exit(main())
