#!/usr/bin/env bash
# The device checks of a lent, offline GPU machine in one command (issue 11, item 6), in priority order:
#   1. Atari PPO (ppo_atari on ALE/Pong-v5, 2 sessions of 8 sub-envs on one GPU): train, SIGKILL, train@latest
#      on GPU, in-process restore on CUDA, enjoy@ on CPU, train@ on CPU  (bench/gpu_check.py --workload atari)
#   2. the same with agent.net.precision bfloat16
#   3. PPO CartPole, the same flow (bench/gpu_check.py --workload cartpole)
#   4. the GPU-node command of docs/envs.md "Atari, as SLM-Lab v5 runs it": ppo_atari on Pong, 4 sessions of 16
#      async sub-envs sharing the GPU (num_cpus 4, num_gpus 0.25 each), 81,920 frames per session; fps per session from train_df
#   5. a small run written on CUDA (ppo_cartpole and a tiny-conv ppo_atari, 1 session, 1,024 frames, a checkpoint
#      every 256) packed as cuda_run_fixture.tgz: the fixture tests/fixtures/cuda_run_h200.tgz (tests/orchestrator/test_cuda_checkpoint.py)
#   6. bench/gpu_exact.py: CUDA sessions repeated and resumed, compared value by value (about 60 s)
#   7. bench/throughput.py --device cuda: SAC (Hopper-v5 3,000 frames, Pendulum-v1 3,000 frames) vs SB3, both with
#      their nets on the GPU, 2 alternating rounds each (needs the bundle's --mujoco part)
#   8. bench/throughput.py: the same SAC Hopper comparison on this host's CPU (nets on one CPU thread)
#   9. batched seeds on the GPU: step 4's command with the 4 sessions as one seed group (meta.session_batch=4, one
#      actor with the 4 sessions' CPUs and one GPU), node frames/s and GPU busy share against step 4's; then the
#      step-1 flow (train, SIGKILL, resume on GPU, CPU and back) with its 2 sessions as one group
# Needs the tarball of bench/gpu_site.py at .whl/site.tar.xz (or SITE_TAR) (the packages a bare CUDA image lacks).
# Writes every log and JSON to /tmp/gpu_run and, after each step, all of them as OUT/gpu_run.tgz (OUT default
# ./gpu_out; one file, since a device call returns few); each step has its own time limit so a hang in one
# still leaves the others' figures. MODE=cpu runs the same steps with no GPU (a rehearsal of the script).
# Usage: OUT=/some/dir bash bench/gpu_run.sh [step ...]  (steps: 1-9, default 1 4 9 2 3 5 6)
set -u
OUT="${OUT:-$PWD/gpu_out}" MODE="${MODE:-gpu}" W=/tmp/gpu_run
GPUS=$([ "$MODE" = gpu ] && echo 0.25 || echo 0) DEV=$([ "$MODE" = gpu ] && echo cuda || echo cpu) F4="${F4:-81920}" C4="${C4:-4}"  # step 4: frames, CPUs per session
mkdir -p "$OUT" "$W" /tmp/site
pack() { tar -czf "$OUT/gpu_run.tgz" -C "$W" . ; }
SITE_TAR="${SITE_TAR:-.whl/site.tar.xz}"
tar -xJf "$SITE_TAR" -C /tmp/site || { echo "FAIL unpack $SITE_TAR"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
{ nvidia-smi; nproc; free -g; df -h /dev/shm /tmp; } > "$W/machine.txt" 2>&1
python3 -c "import sys, torch, ray, gymnasium, ale_py; print(sys.version.split()[0], 'torch', torch.__version__, \
'ray', ray.__version__, 'gymnasium', gymnasium.__version__, 'ale_py', ale_py.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" \
  2>&1 | tee "$W/versions.txt"
steps=("${@:-1 4 9 2 3 5 6}")
for step in ${steps[*]}; do
  case $step in
    1) args=(--workload atari --out "$W/gpu_check_atari.json"); limit=330 ;;
    2) args=(--workload atari --precision bfloat16 --out "$W/gpu_check_atari_bf16.json"); limit=240 ;;
    3) args=(--workload cartpole --out "$W/gpu_check_cartpole.json"); limit=200 ;;
    4|9) [ $step = 4 ] && res='{"num_cpus": '$C4', "num_gpus": '$GPUS'}' batch=1 \
         || res='{"num_cpus": '$((C4 * 4))', "num_gpus": '$(python3 -c "print(min(1, 4 * $GPUS))")'}' batch=4
       echo "== step $step: ppo_atari train, 4 sessions x 16 async envs on one GPU, session_batch $batch (limit 200 s)"
       rm -rf /tmp/gpu$step "$W/step${step}_gpu.csv"  # a rerun on the same machine reads only its own run
       timeout -k 10 200 python3 run_lab.py specs/benchmark/atari.json ppo_atari train --quiet --data-dir /tmp/gpu$step \
         -s "meta.resources=$res" -s meta.session_batch=$batch -s env.max_frame=$F4 -s meta.log_frequency=$((F4 / 10)) \
         -s agent.net.gpu=true > "$W/step$step.log" 2>&1 &
       pid=$!
       while kill -0 $pid 2>/dev/null; do
         nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits 2>/dev/null | head -1 \
           >> "$W/step${step}_gpu.csv"; sleep 1
       done
       wait $pid; echo "== step $step exit $?"
       python3 - "$W" $step <<'PY'
import glob, json, sys
import pandas as pd
rows, step = [], sys.argv[2]
for f in sorted(glob.glob(f"/tmp/gpu{step}/*/t0/s*/train_df.parquet")):
    df = pd.read_parquet(f)
    rows.append({"session": f.split("/")[-2], "frames": int(df["frame"].max()), "fps_median": float(df["fps"].median()),
                 "fps_last": float(df["fps"].iloc[-1]), "total_reward_ma": float(df["total_reward_ma"].iloc[-1])})
gpu = [tuple(float(x) for x in line.split(",")) for line in open(f"{sys.argv[1]}/step{step}_gpu.csv") if "," in line]
out = {"sessions": rows, "node_fps_median": sum(r["fps_median"] for r in rows),
       "gpu_mem_peak_mb": max((m for m, _ in gpu), default=None),
       "gpu_util_median": sorted(u for _, u in gpu)[len(gpu) // 2] if gpu else None}
json.dump(out, open(sys.argv[1] + ("/gpu_atari4.json" if step == "4" else "/gpu_atari4_batched.json"), "w"), indent=1)
print(json.dumps(out))
PY
       if [ $step = 9 ]; then
         echo "== step 9b: gpu_check --workload atari --session-batch 2 (limit 330 s)"
         timeout -k 10 330 python3 bench/gpu_check.py --mode "$MODE" --timeout 150 --workload atari --session-batch 2 \
           --out "$W/gpu_check_atari_batched.json" 2>&1 | tee "$W/step9b.log" | tail -20
       fi
       pack; continue ;;
    5) echo "== step 5: runs written on CUDA, packed as a test fixture"
       rm -rf /tmp/fixture && mkdir -p /tmp/fixture
       timeout -k 10 120 python3 run_lab.py specs/benchmark/cartpole.json ppo_cartpole train --quiet \
         --data-dir /tmp/fixture -s meta.max_session=1 -s env.max_frame=1024 -s meta.log_frequency=256 \
         -s meta.checkpoint_frequency=256 -s meta.keep_checkpoints=1 -s agent.net.gpu=true -s 'meta.resources={"num_cpus": 1, "num_gpus": '$GPUS'}' \
         > "$W/step5.log" 2>&1
       timeout -k 10 120 python3 run_lab.py specs/benchmark/atari.json ppo_atari train --quiet --data-dir /tmp/fixture \
         -s meta.max_session=1 -s env.num_envs=2 -s env.max_frame=1024 -s meta.log_frequency=256 \
         -s meta.checkpoint_frequency=256 -s meta.keep_checkpoints=1 -s 'agent.net.conv_hid_layers=[[8,8,4],[16,4,2]]' \
         -s 'agent.net.fc_hid_layers=[32]' -s agent.algorithm.time_horizon=32 -s agent.algorithm.minibatch_size=32 \
         -s agent.algorithm.training_epoch=1 -s agent.net.gpu=true \
         -s 'meta.resources={"num_cpus": 1, "num_gpus": '$GPUS'}' >> "$W/step5.log" 2>&1
       echo "== step 5 exit $?"; tar -czf "$W/cuda_run_fixture.tgz" --exclude=graph -C /tmp/fixture . && du -h "$W/cuda_run_fixture.tgz"
       pack; continue ;;
    6) echo "== step 6: gpu_exact (limit 150 s)"
       timeout -k 10 150 python3 bench/gpu_exact.py $([ "$MODE" = gpu ] || echo --cpu) --out "$W/gpu_exact.json" \
         2>&1 | tee "$W/step6.log" | grep -v "A.L.E\|Stella"
       pack; continue ;;
    7) echo "== step 7: SAC throughput vs SB3, nets on $DEV (limit 120 + 150 s)"
       timeout -k 10 120 python3 bench/throughput.py --algo sac_hopper --device $DEV --rounds 2 \
         --out "$W/throughput_sac_hopper_$DEV.json" 2>&1 | tee "$W/step7.log" | tail -4
       timeout -k 10 150 python3 bench/throughput.py --algo sac --frames 3000 --device $DEV --rounds 2 \
         --out "$W/throughput_sac_$DEV.json" 2>&1 | tee -a "$W/step7.log" | tail -4
       pack; continue ;;
    8) echo "== step 8: SAC Hopper throughput vs SB3 on this host's CPU (limit 120 s)"
       timeout -k 10 120 python3 bench/throughput.py --algo sac_hopper --device cpu --rounds 2 \
         --out "$W/throughput_sac_hopper_host_cpu.json" 2>&1 | tee "$W/step8.log" | tail -4
       pack; continue ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== step $step: gpu_check ${args[*]} (limit ${limit} s)"
  timeout -k 10 "$limit" python3 bench/gpu_check.py --mode "$MODE" --timeout 150 "${args[@]}" 2>&1 \
    | tee "$W/step$step.log" | tail -40
  echo "== step $step exit ${PIPESTATUS[0]}"
  pack
done
pack
