#!/bin/bash
# `ray job submit` to a running Ray cluster, submitted again until the run is done. `ray job submit` waits for the
# job and exits non-zero when it did not succeed (it does not pass the lab's exit code through), so any failure is
# retried: the same `--name` command resumes the run where its checkpoints are, and a finished run exits 0 at once.
# The data dir must be reachable from the cluster (shared disk, s3:// or gs://).
export RAY_ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
for attempt in $(seq 1 20); do
  ray job submit --working-dir . -- \
    lab specs/benchmark/cartpole.json ppo_cartpole train --name ppo-cartpole-1 --data-dir s3://my-bucket/lab \
    && exit 0
  echo "attempt $attempt did not finish the run; submitting the same command again in 30 s" >&2
  sleep 30
done
exit 75
