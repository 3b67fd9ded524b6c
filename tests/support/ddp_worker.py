"""One rank of torch DistributedDataParallel over every aggregator family (spawned by the tests)."""

import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from helpers import FAMILIES, build_tiny_model, random_tokens


def run(rank: int, world_size: int, port: int, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    report = {}
    try:
        for family in FAMILIES:
            model, dictionary = build_tiny_model(f"transformer_{family}_small", seed=0)
            model.train()
            ddp = DistributedDataParallel(model, find_unused_parameters=False)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            for step in range(3):
                src = random_tokens(dictionary, [6, 4], seed=100 * rank + step)
                prev = random_tokens(dictionary, [5, 5], seed=100 * rank + step + 50, bos=True)
                logits, _ = ddp(src, src.ne(dictionary.pad()).sum(1), prev)
                optimizer.zero_grad()
                logits.float().logsumexp(-1).mean().backward()
                optimizer.step()
            checksum = torch.stack([p.detach().double().sum() for p in model.parameters()])
            gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
            dist.all_gather(gathered, checksum)
            report[family] = {"identical": all(torch.equal(gathered[0], g) for g in gathered),
                              "changed": bool(any(p.grad is not None and p.grad.abs().sum() > 0
                                                  for p in model.parameters()))}
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(report, f)
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        dist.destroy_process_group()
