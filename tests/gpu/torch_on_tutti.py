#!/usr/bin/env python3
"""PyTorch's torch.distributed "nccl" backend (ProcessGroupNCCL) running on tutti, unchanged.

The mission's promise is that programs built against NCCL run on tutti as they are: PyTorch
links libnccl.so.2, so preloading tutti's (LD_PRELOAD=build/libnccl.so.2) puts tutti under
every torch.distributed call. This script starts N ranks as processes (one GPU is enough:
tutti lets ranks share it, NCCL does not) and checks what a training job uses, each result
against the value it must have:

  which libnccl.so.2 the process mapped (--expect-tutti: tutti's alone, NVIDIA's absent);
  all_reduce (sum of 7 datatypes; max, min, product; avg), broadcast, reduce, all_gather
  (list and into one tensor), reduce_scatter_tensor, all_to_all_single (even and uneven
  splits), send / recv round a ring and batch_isend_irecv, barrier, an async all_reduce
  waited for, a sub-group (new_group), an all_reduce captured in a CUDA graph and replayed,
  and DistributedDataParallel training a small model (the ranks' parameters bit-identical, and
  equal to one process training on the whole batch).

  python3 tests/gpu/torch_on_tutti.py --nproc 2 [--device cuda|cpu] [--expect-tutti]

--device cpu runs the same checks on the gloo backend (no NCCL involved): a check of this
script where there is no GPU, not of tutti. Prints "torch-on-tutti: PASSED (...)" or the
failures; the exit status is non-zero on any failure or a rank that did not finish.
"""
import argparse
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta


def launch(args):
    """Starts the ranks as child processes of this script and waits for them."""
    with socket.socket() as s:  # a free port for the rendezvous (c10d TCPStore)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-process", "--device", args.device]
        if args.expect_tutti:
            cmd.append("--expect-tutti")
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + args.timeout
    codes = [None] * len(procs)
    while any(c is None for c in codes) and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if codes[i] is None:
                codes[i] = p.poll()
        # One rank failed: the others may wait for it until their own timeouts; end them.
        if any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.1)
    for i, p in enumerate(procs):
        if codes[i] is None:
            p.kill()
            p.wait()
    bad = [f"rank {i}: {'killed (did not finish)' if c is None else f'exit {c}'}"
           for i, c in enumerate(codes) if c != 0]
    if bad:
        print(f"torch-on-tutti: FAILED ({args.nproc} ranks, {args.device}): " + "; ".join(bad),
              flush=True)
        return 1
    print(f"torch-on-tutti: PASSED ({args.nproc} ranks as processes, {args.device})", flush=True)
    return 0


def mapped_nccl():
    """The libnccl files this process mapped."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libnccl" in os.path.basename(path):
                found.add(os.path.realpath(path))
    return sorted(found)


class Checks:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.passed = 0

    def expect(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            if self.rank == 0:
                print(f"ok: {name}", flush=True)
        else:
            self.failures.append(name)
            print(f"FAIL rank {self.rank}: {name} {detail}", flush=True)

    def close(self, name, got, want, atol=0.0, rtol=0.0):
        import torch
        got = got.detach().to("cpu")
        want = want.to("cpu", dtype=got.dtype)
        if got.dtype.is_floating_point:
            ok = torch.allclose(got.double(), want.double(), atol=atol, rtol=rtol)
        else:
            ok = torch.equal(got, want)
        detail = "" if ok else f"got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}"
        self.expect(name, ok, detail)


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    kwargs = dict(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:  # device_id: the communicator made at once (newer PyTorch), and sub-groups split from it
        dist.init_process_group(**kwargs, device_id=dev if cuda else None)
    except TypeError:
        dist.init_process_group(**kwargs)
    c = Checks(rank)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    libs = mapped_nccl()
    if rank == 0:
        print(f"libnccl mapped: {libs or 'none'}", flush=True)
        if cuda:
            print(f"torch {torch.__version__}, torch.cuda.nccl.version() = "
                  f"{torch.cuda.nccl.version()}", flush=True)
    if args.expect_tutti:
        preload = os.path.realpath(os.environ.get("LD_PRELOAD", "").split(":")[0] or "/nonexistent")
        c.expect("the libnccl.so.2 mapped is tutti's alone (LD_PRELOAD), NVIDIA's is not",
                 libs == [preload], f"mapped {libs}, preloaded {preload}")

    def ranks_sum(f):  # sum over ranks of f(r)
        return sum(f(r) for r in range(world))

    # all_reduce: every datatype a model's gradients or counters use; values small enough to be
    # exact in each.
    n = 1000
    base = torch.arange(n, dtype=torch.float64) % 7
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
               torch.int64, torch.uint8):
        if not cuda and dt in (torch.float16, torch.bfloat16):
            continue  # gloo sums these on some builds only
        t = ((base + rank + 1) % 16).to(dt).to(dev)
        dist.all_reduce(t)
        want = ranks_sum(lambda r: (base + r + 1) % 16)
        c.close(f"all_reduce sum {dt}", t, want)
    for name, op, fold in (("max", dist.ReduceOp.MAX, max), ("min", dist.ReduceOp.MIN, min)):
        t = torch.full((33,), float((rank * 5) % 3 + rank), device=dev)
        dist.all_reduce(t, op=op)
        c.close(f"all_reduce {name}", t,
                torch.full((33,), float(fold((r * 5) % 3 + r for r in range(world)))))
    t = torch.full((17,), float(rank + 2), dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    prod = 1.0
    for r in range(world):
        prod *= r + 2
    c.close("all_reduce product float64", t, torch.full((17,), prod, dtype=torch.float64))
    if cuda:  # (ncclAvg; gloo has no AVG)
        t = torch.full((1 << 20,), float(rank + 1), device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        c.close("all_reduce avg 4 MiB", t, torch.full((1 << 20,), (world + 1) / 2.0), rtol=1e-6)
    # A big one (many steps, several channels), and an 8-byte one.
    for count in (2, 1 << 22):
        t = torch.full((count,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        c.close(f"all_reduce sum {count} floats", t, torch.full((count,), ranks_sum(lambda r: r + 1)))

    src = world - 1
    t = torch.arange(257, dtype=torch.float32, device=dev) * (rank + 1)
    dist.broadcast(t, src=src)
    c.close(f"broadcast from rank {src}", t, torch.arange(257, dtype=torch.float32) * (src + 1))

    t = torch.full((65,), float(rank + 1), device=dev)
    dist.reduce(t, dst=0)
    if rank == 0:
        c.close("reduce to rank 0", t, torch.full((65,), ranks_sum(lambda r: r + 1)))

    mine = torch.arange(5, dtype=torch.int64, device=dev) + 100 * rank
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    c.close("all_gather (list)", torch.stack(parts),
            torch.stack([torch.arange(5, dtype=torch.int64) + 100 * r for r in range(world)]))
    if hasattr(dist, "all_gather_into_tensor") and cuda:
        out = torch.empty(world * 5, dtype=torch.int64, device=dev)
        dist.all_gather_into_tensor(out, mine)
        c.close("all_gather_into_tensor", out,
                torch.cat([torch.arange(5, dtype=torch.int64) + 100 * r for r in range(world)]))
    if hasattr(dist, "reduce_scatter_tensor") and cuda:
        inp = torch.cat([torch.full((3,), float(10 * b + rank)) for b in range(world)]).to(dev)
        out = torch.empty(3, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        c.close("reduce_scatter_tensor", out,
                torch.full((3,), ranks_sum(lambda r: 10 * rank + r)))

    # all_to_all_single: block j of rank r's input goes to rank j (NCCL: sends and receives in a
    # group). Even splits, then uneven ones (rank r sends j + 1 elements to rank j).
    inp = torch.arange(world * 4, dtype=torch.float32, device=dev) + 1000 * rank
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float32) + 1000 * r
                      for r in range(world)])
    c.close("all_to_all_single", out, want)
    in_splits = [j + 1 for j in range(world)]
    out_splits = [rank + 1] * world
    inp = torch.cat([torch.full((j + 1,), float(100 * rank + j)) for j in range(world)]).to(dev)
    out = torch.empty(sum(out_splits), device=dev)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = torch.cat([torch.full((rank + 1,), float(100 * r + rank)) for r in range(world)])
    c.close("all_to_all_single, uneven splits", out, want)

    # Point to point round the ring, then the same batched.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send = torch.full((1000,), float(rank), device=dev)
    recv = torch.empty_like(send)
    reqs = [dist.isend(send, nxt), dist.irecv(recv, prv)]
    for q in reqs:
        q.wait()
    sync()
    c.close("isend / irecv round the ring", recv, torch.full((1000,), float(prv)))
    recv2 = torch.empty_like(send)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, send * 2, nxt),
                                     dist.P2POp(dist.irecv, recv2, prv)]):
        q.wait()
    sync()
    c.close("batch_isend_irecv", recv2, torch.full((1000,), 2.0 * prv))

    dist.barrier()
    c.expect("barrier", True)

    t = torch.full((4096,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    t.mul_(2)  # on the current stream, after the collective
    sync()
    c.close("async all_reduce, then work on its result", t,
            torch.full((4096,), 2.0 * ranks_sum(lambda r: r + 1)))

    # A sub-group: every rank but the last (all of them at 2 ranks: then it is the whole world
    # again, another communicator).
    members = list(range(max(1, world - 1))) if world > 2 else list(range(world))
    g = dist.new_group(members)
    if rank in members:
        t = torch.full((100,), float(rank + 1), device=dev)
        dist.all_reduce(t, group=g)
        c.close(f"all_reduce in new_group({members})", t,
                torch.full((100,), float(sum(r + 1 for r in members))))
    dist.barrier()

    if cuda:  # captured in a CUDA graph, replayed: each replay sums the buffer again
        t = torch.full((256,), 1.0, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch asks
            dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(side)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(t)
        sync()
        t.fill_(1.0)
        for _ in range(3):
            graph.replay()
        sync()
        c.close("all_reduce captured in a CUDA graph, replayed 3 times", t,
                torch.full((256,), float(world ** 3)))
        del graph

    # DistributedDataParallel: every rank starts from the same parameters, takes its shard of
    # each global batch; gradients are averaged in buckets. The replicas must stay identical,
    # and equal (to rounding) one model trained on the whole batch.
    torch.manual_seed(0)
    def make():
        torch.manual_seed(1234)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                             nn.Linear(64, 10)).to(dev)
    model = make()
    ref = make()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev] if cuda else None,
                                              bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(42)
    per = 16
    for _ in range(5):
        x = torch.randn(world * per, 32, generator=gen).to(dev)
        y = torch.randint(0, 10, (world * per,), generator=gen).to(dev)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x[rank * per:(rank + 1) * per]),
                                    y[rank * per:(rank + 1) * per]).backward()
        opt.step()
        ropt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ropt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    c.expect("DDP: the ranks' parameters are bit-identical after 5 steps",
             all(torch.equal(everyone[0], e) for e in everyone))
    rflat = torch.cat([p.detach().flatten() for p in ref.parameters()])
    c.close("DDP: parameters equal one model trained on the whole batch", flat, rflat,
            atol=1e-5, rtol=1e-4)

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: {c.passed} checks passed, {len(c.failures)} failed", flush=True)
    return 1 if c.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--expect-tutti", action="store_true",
                   help="fail unless the libnccl.so.2 mapped is the one LD_PRELOAD names")
    p.add_argument("--timeout", type=float, default=240, help="seconds for the whole run")
    p.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_process:
        return rank_main(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
