"""The preemptible-capacity recipes in examples/: each parses (YAML loads, shell scripts pass ``bash -n``, Python
compiles) and the lab command in it parses with the lab's own argument parser as a ``--name`` run. How each behaves
under its scheduler's signals: tests/orchestrator/test_recipes.py."""

import ast
import shlex
import subprocess
from pathlib import Path

import yaml

from orchestrator.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def lab_args(command: str):
    """The lab's parsed arguments of a shell command line ``lab SPEC_FILE SPEC_NAME MODE ...``."""
    words = [w for w in shlex.split(command.replace("\\\n", " ")) if w != "$@"]
    assert words[0] == "lab", command
    args = build_parser().parse_args([w.replace('"$SLURM_JOB_ID"', "1").replace("$SLURM_JOB_ID", "1")
                                      for w in words[1:]])
    assert (args.spec_name, args.mode) == ("ppo_cartpole", "train") and args.name
    assert Path(EXAMPLES.parent / args.spec_file).is_file()
    return args


def script_command(path: Path) -> str:
    """The one line of a shell script that runs ``lab`` (continuation lines joined, trailing ``&``/``&&`` cut; a
    ``LAB=(lab ...)`` array taken as the command)."""
    return script_command_of(path.read_text())


def script_command_of(text: str) -> str:
    """The ``lab`` command of shell text: continuation lines joined, the statement that starts with ``lab``, without
    what follows it (``&``, ``&&``, ``;``)."""
    text = text.replace("\\\n", " ").replace("; ", ";\n")
    starts = ("lab ", "do lab ", "LAB=(lab ")
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(starts)]
    line = line[line.index("lab "):]
    return line.split("&&")[0].rstrip(" &").split(";")[0].removesuffix(")")


def test_slurm_script_requeues_on_usr1_and_runs_a_named_run():
    path = EXAMPLES / "slurm_requeue.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert "#SBATCH --signal=B:USR1@" in text and "#SBATCH --requeue" in text and "scontrol requeue" in text
    assert lab_args(script_command(path)).name == "1"  # $SLURM_JOB_ID


def test_kuberay_rayjob_keeps_the_head_off_spot_and_runs_a_named_run():
    manifest = yaml.safe_load((EXAMPLES / "kuberay_rayjob.yaml").read_text())
    spec = manifest["spec"]
    assert manifest["kind"] == "RayJob" and "backoffLimit" not in spec  # KubeRay would retry bad input too
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert "spot" in group["groupName"] and group["template"]["spec"]["nodeSelector"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (term,) = head["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"}]
    assert "RAY_JOB_STOP_WAIT_TIME_S" in spec["runtimeEnvYAML"]
    assert lab_args(script_command_of(spec["entrypoint"])).name == "ppo-cartpole-1"


def test_k8s_job_runs_the_lab_as_the_container_process_and_fails_on_bad_input():
    manifest = yaml.safe_load((EXAMPLES / "k8s_job.yaml").read_text())
    spec = manifest["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["restartPolicy"] == "Never" and container["command"][0] == "lab"  # exec form: no shell in front
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"containerName": "lab", "operator": "In",
                                                             "values": [1, 2]}}
    assert {"action": "Ignore", "onExitCodes": {"containerName": "lab", "operator": "In", "values": [75]}} in rules
    args = lab_args(shlex.join(container["command"]))
    assert args.name == "ppo-cartpole-1" and "meta.shutdown_grace_s=10" in args.overrides
    assert pod["terminationGracePeriodSeconds"] > 10


def test_ray_job_submit_recipe_compiles_and_runs_a_named_run():
    path = EXAMPLES / "ray_job_submit.py"
    text = ast.get_docstring(ast.parse(path.read_text()))  # its usage example
    start = text.index("-- \\\n") + len("-- \\\n")
    assert lab_args(text[start:text.index("\n", start)].strip()).name == "ppo-cartpole-1"
