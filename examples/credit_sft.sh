#!/usr/bin/env bash
# Credit-assignment SFT on recorded sessions: post step values, train only where the value rises.
set -euo pipefail
orchard-rec outcome my-run --reward 1 --step-values 0.2,0.1,0.7     # one value per model turn
orchard-rec train sft --model ./my-small-model --out ./ckpt --session my-run --credit value --steps 50
