"""slime on live harness sessions: every rollout sample is one real harness run.

slime calls ``--custom-generate-function-path orchard_rec.trainers.slime.generate`` as
``await generate(args, sample, sampling_params)``. orchard-rec starts a recording proxy in
front of slime's own router, runs the harness (``args.orchard_harness``) on
``sample.prompt``, and fills the sample with the exact token ids, loss mask and rollout
logprobs of that session. This script shows the call outside slime, against any
OpenAI-compatible server (e.g. ``orchard-rec demo``'s upstream or an SGLang router).
"""

import asyncio
import sys
from argparse import Namespace

from orchard_rec.exporters.contracts import slime_sample_class
from orchard_rec.trainers.slime import generate

host, port = sys.argv[1], int(sys.argv[2])  # slime's --sglang-router-ip / --sglang-router-port
args = Namespace(
    sglang_router_ip=host,
    sglang_router_port=port,
    orchard_harness="codex",
    orchard_db="sqlite:///./orchard.db",
)
Sample = slime_sample_class()
sample = asyncio.run(generate(args, Sample(prompt="Please run `ls` and summarise."), {"temperature": 1.0}))
print(sample.status, sample.response_length, sum(sample.loss_mask), sample.metadata["orchard_session"])
