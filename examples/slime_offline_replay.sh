#!/usr/bin/env bash
# Train slime on recorded harness traffic, replayed offline from orchard-rec's database.
# Two ways: (1) export torch files slime loads with --load-debug-rollout-data, or
# (2) let slime call orchard-rec's rollout function for each rollout id.
set -euo pipefail
DB=${ORCHARD_DB:-sqlite:///./orchard.db}

# (1) files: rollout_0.pt, rollout_1.pt, ... of 256 samples, GRPO groups by task, balanced
orchard-rec export --db "$DB" --format slime --out 'rollouts/rollout_{rollout_id}.pt' \
  --rollout-size 256 --group-by task --pass-rate 0.1:0.9
#   python train.py ... --load-debug-rollout-data 'rollouts/rollout_{rollout_id}.pt'

# (2) plug-in: slime imports the function by dotted path; options ride on slime's args
#   python train.py ... --rollout-function-path orchard_rec.trainers.slime.generate_rollout
#   (set args.orchard_db / args.orchard_group_by via --custom-config-path, or ORCHARD_DB in the env)
