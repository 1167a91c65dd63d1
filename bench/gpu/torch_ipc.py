"""CUDA IPC through PyTorch: tensors shared with a child process (torch.multiprocessing, spawn),
changed there in place and seen here. bench/gpu-check.sh runs it plain and under libwavelet.so in
alloc mode, where the tensors' memory is served by liballoc (a VMM mapping, for which the driver
has no IPC handle) and the handles are libwavelet.so's.

Prints `ipc child_sum S parent_sum S expected S` and `ipc ok` (exit 0) or `ipc FAIL` (exit 1).
"""
import sys


def child(q, done):
    import torch
    big, small = q.get()
    big.add_(1)
    small.mul_(2)
    torch.cuda.synchronize()
    done.put((float(big.double().sum()), float(small.double().sum())))
    del big, small


def main() -> int:
    import torch
    import torch.multiprocessing as mp
    if not torch.cuda.is_available():
        print("torch_ipc: no CUDA device", file=sys.stderr)
        return 77
    mp.set_start_method("spawn")
    n = 1 << 24  # 64 MiB of float32: spans several of liballoc's 20 MiB chunks; exact sums
    big = torch.arange(n, dtype=torch.float32, device="cuda")
    small = torch.ones(1000, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    q, done = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q, done))
    p.start()
    q.put((big, small))
    sums = done.get(timeout=120)
    p.join(60)
    torch.cuda.synchronize()
    want = (n * (n - 1) / 2 + n, 2000.0)
    got = (float(big.double().sum()), float(small.double().sum()))
    print(f"ipc child_sum {sums[0]:.0f} {sums[1]:.0f} parent_sum {got[0]:.0f} {got[1]:.0f} "
          f"expected {want[0]:.0f} {want[1]:.0f}")
    ok = p.exitcode == 0 and sums == want and got == want
    print("ipc", "ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
