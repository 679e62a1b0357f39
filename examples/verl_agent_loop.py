"""verl: recorded sessions as agent-loop outputs (verl field names; verl's own class when installed)."""

import asyncio

from orchard_rec.storage import Store
from orchard_rec.trainers.verl import RecordedAgentLoop, agent_loop_outputs

for out in agent_loop_outputs(Store("sqlite:///./orchard.db"), group_by="task"):
    print(len(out["prompt_ids"]) if isinstance(out, dict) else len(out.prompt_ids))
loop = RecordedAgentLoop("sqlite:///./orchard.db")
print(asyncio.run(loop.run({}, session_id="demo")))
