"""The preemptible-capacity recipes in examples/: each parses (YAML loads, shell scripts pass ``bash -n``) and
the lab command in it parses with the lab's own argument parser as a ``--name`` run."""

import shlex
import subprocess
from pathlib import Path

import yaml

from orchestrator.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def lab_args(command: str):
    """The lab's parsed arguments of a shell command line ``lab SPEC_FILE SPEC_NAME MODE ...``."""
    words = shlex.split(command.replace("\\\n", " "))
    assert words[0] == "lab", command
    args = build_parser().parse_args([w.replace('"$SLURM_JOB_ID"', "1").replace("$SLURM_JOB_ID", "1")
                                      for w in words[1:]])
    assert (args.spec_name, args.mode) == ("ppo_cartpole", "train") and args.name
    assert Path(EXAMPLES.parent / args.spec_file).is_file()
    return args


def script_command(path: Path) -> str:
    """The one line of a shell script that runs ``lab`` (continuation lines joined, trailing ``&``/``&&`` cut)."""
    text = path.read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("lab ") or " lab " in ln and "ray job" in ln]
    line = line[line.index("lab "):]
    return line.split("&&")[0].rstrip(" &")


def test_slurm_script_requeues_on_usr1_and_runs_a_named_run():
    path = EXAMPLES / "slurm_requeue.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert "#SBATCH --signal=B:USR1@" in text and "#SBATCH --requeue" in text and "scontrol requeue" in text
    assert lab_args(script_command(path)).name == "1"  # $SLURM_JOB_ID


def test_kuberay_rayjob_has_a_spot_worker_group_and_a_named_run():
    manifest = yaml.safe_load((EXAMPLES / "kuberay_rayjob.yaml").read_text())
    assert manifest["kind"] == "RayJob" and manifest["spec"]["backoffLimit"] > 0
    (group,) = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert "spot" in group["groupName"] and group["template"]["spec"]["nodeSelector"]
    assert lab_args(manifest["spec"]["entrypoint"]).name == "ppo-cartpole-1"


def test_ray_job_submit_retries_a_named_run():
    path = EXAMPLES / "ray_job_submit.sh"
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert "ray job submit" in path.read_text() and "for attempt" in path.read_text()
    assert lab_args(script_command(path)).name == "ppo-cartpole-1"
