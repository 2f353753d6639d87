"""Save a torch.distributed.checkpoint directory from a 2-rank gloo job, as DDP users do: the model
and Adam's state through get_state_dict, a step counter, and one tensor sharded by rows across the
ranks (a DTensor), so each rank writes its own shard. Usage: torchrun --nproc-per-node 2 dcp_save.py DIR"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
optimizer = torch.optim.Adam(model.parameters())
model(torch.randn(3, 8)).sum().backward()
optimizer.step()
model_state, optimizer_state = get_state_dict(model, optimizer)
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
table = distribute_tensor(torch.arange(96, dtype=torch.float32).reshape(12, 8), mesh, [Shard(0)])
dcp.save({"model": model_state, "optim": optimizer_state, "table": table, "step": 7}, checkpoint_id=sys.argv[1])
dist.destroy_process_group()
# past this point only the interpreter's teardown is left, where gloo's worker threads now and then
# abort the process ("terminate called without an active exception", SIGABRT: pytorch PR #179291)
# after the checkpoint is whole; the job is done, so it ends here
sys.stdout.flush()
os._exit(0)
